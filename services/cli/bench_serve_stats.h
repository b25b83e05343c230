// The statistics of `tandem bench serve` (bench_serve.h): what one measurement window recorded,
// the mode order of each round, a (mode, concurrency) cell summarised over its rounds, and auto
// against the best fixed mode at one concurrency.
//
// A single window is a noisy measurement (on a loaded CPU the same window varies by tens of
// percent run to run), so every (mode, concurrency) runs in several rounds, the modes in a
// rotated order each round, and the cell's throughput is the median over its rounds.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::cli {

// One measurement window: one (mode, concurrency, round).
struct ServeWindow {
  std::string mode;
  int concurrency = 0;
  int round = 0;     // 0-based; the pair rounds follow the rounds
  int position = 0;  // its place among the modes of its round, 0-based
  int issued = 0;
  int completed = 0;
  int errors = 0;
  std::string first_error;
  // The window in which every client was busy: from the start until the first client found no
  // more work (a request count), or the duration. Throughput counts the tokens that arrived
  // inside it.
  double window_seconds = 0;
  double wall_seconds = 0;  // until the last request finished
  int64_t window_tokens = 0;
  int64_t output_tokens = 0;  // all completed requests
  std::vector<double> ttft, itl, e2e;
  std::map<std::string, int> served_modes;  // what the server reported per request
  // The machine's 1-minute load average when the window ended (-1: unknown): a window measured
  // while other work held the cores reads as such.
  double load_average = -1;

  double TokensPerSecond() const;
  // Tokens/s over the mean tokens of a completed request: the rate at which the window's
  // token throughput completes requests (a count of completions inside the window would say
  // nothing when a request lasts about as long as the window).
  double RequestsPerSecond() const;
};

// The order in which round `round` runs `modes`: a rotation starting at modes[round % size], so
// that over the rounds no mode always runs first (right after the previous level) or last.
std::vector<std::string> RoundOrder(const std::vector<std::string>& modes, int round);

// The order of pair round `pair` (0-based) between `best` and auto: ABBA, i.e. best first in
// pairs 0, 3, 4, 7, ... and auto first in pairs 1, 2, 5, 6, ..., so that over every four pairs
// each runs first twice and each follows the other as often as it follows itself or the
// previous level (a drift in time or an effect of the previous window cancels out).
std::vector<std::string> PairOrder(const std::string& best, int pair);

// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> values);

// A (mode, concurrency) cell over its rounds.
struct ServeCell {
  std::string mode;
  int concurrency = 0;
  std::vector<ServeWindow> rounds;  // by round

  // Per round, in round order.
  std::vector<double> TokensPerSecondByRound() const;
  double MedianTokensPerSecond() const;
  double MinTokensPerSecond() const;
  double MaxTokensPerSecond() const;
  double MedianRequestsPerSecond() const;
  // Sums over the rounds.
  int Completed() const;
  int Errors() const;
  int64_t OutputTokens() const;
  std::map<std::string, int> ServedModes() const;
  std::string FirstError() const;  // of the first round that had one
  // Every round's samples together (latency percentiles are taken over all requests).
  std::vector<double> Ttft() const;
  std::vector<double> Itl() const;
  std::vector<double> E2e() const;
};

// auto against the best fixed mode at one concurrency.
struct AutoVsBest {
  int concurrency = 0;
  // best = the fixed mode with the highest median tokens/s over its windows.
  double auto_tps = 0;
  std::string best_mode;
  double best_tps = 0;
  double ratio = 0;  // auto_tps / best_tps: medians taken over windows at different times
  // Paired per round: auto's tokens/s in round k over the best mode's in the same round k
  // (ServeWindow::round; rounds where that mode measured 0 or either has no window are left
  // out); and their median.
  std::vector<double> paired_ratios;
  double paired_median = 0;
  // The criterion: paired_median >= threshold (ratio when no round paired them). Each paired
  // ratio compares two windows run back to back, so a machine that speeds up or slows down
  // between rounds moves both; the ratio of medians mixes windows from different moments and
  // differs by up to 10 % between identical configurations on a small shared host.
  bool pass = false;
};

// From the cells of one concurrency (any order); empty without an `auto` cell or a fixed mode
// that measured more than 0 tokens/s.
std::optional<AutoVsBest> CompareAutoWithBest(const std::vector<const ServeCell*>& cells,
                                              double threshold);

// A structured-output variant ("MODE@FORMAT") against its mode's free-text cell at the same
// concurrency: what the grammar costs.
struct FormatCost {
  int concurrency = 0;
  std::string variant;
  std::string base;
  double variant_tps = 0;
  double base_tps = 0;
  double ratio = 0;                   // medians over windows
  std::vector<double> paired_ratios;  // per round, the variant / its base in the same round
  double paired_median = 0;
};

// One entry per "MODE@FORMAT" cell among `cells` whose MODE also has a cell (at its level).
std::vector<FormatCost> CompareFormatsWithBase(const std::vector<const ServeCell*>& cells);

}  // namespace tandem::cli
