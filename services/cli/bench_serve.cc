#include "services/cli/bench_serve.h"

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cost_model.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/bench_serve_stats.h"
#include "services/cli/bench_stream.h"
#include "services/cli/child_process.h"
#include "services/cli/local_cluster.h"
#include "services/cli/locate.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::cli {

namespace {

constexpr char kWho[] = "tandem bench serve";
constexpr char kPlotScript[] = "tools/bench/plot_serve.py";
constexpr char kPython[] = "/usr/bin/python3";
// How long to wait for the router to know a verifier.
constexpr absl::Duration kReadyTimeout = absl::Seconds(60);

double SecondsBetween(BenchClock::time_point from, BenchClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

BenchClock::time_point After(BenchClock::time_point from, double seconds) {
  return from +
         std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(seconds));
}

int RequestsFor(const BenchServeArgs& args, int concurrency) {
  if (args.requests_per_level > 0) return std::max(args.requests_per_level, concurrency);
  return std::max(16, 4 * concurrency);
}

absl::Status CheckArgs(const BenchServeArgs& args) {
  if (args.concurrency.empty()) return absl::InvalidArgumentError("--concurrency is empty");
  for (int c : args.concurrency) {
    if (c < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--concurrency levels must be >= 1, got ", c));
    }
  }
  if (args.pair_rounds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pair-rounds must be >= 0, got ", args.pair_rounds));
  }
  if (args.rounds < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--rounds must be >= 1, got ", args.rounds));
  }
  if (!std::isfinite(args.warmup_seconds) || args.warmup_seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup must be >= 0 seconds (0 = none), got ", args.warmup_seconds));
  }
  if (!std::isfinite(args.duration_seconds) || args.duration_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--duration must be >= 0 seconds (0 = a request count), got ", args.duration_seconds));
  }
  if (args.requests_per_level < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--requests-per-level must be >= 0, got ", args.requests_per_level));
  }
  if (args.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be >= 1, got ", args.max_tokens));
  }
  return absl::OkStatus();
}

struct WarmupCount {
  int requests = 0;
  int errors = 0;
  std::string first_error;
};

// Unrecorded closed-loop traffic: `concurrency` clients in `mode` for `seconds`, each sending
// at least one full-length request (the first requests of a mode pay for page faults, thread
// pools, drafter sessions, and the verifier's cost model learns the mode at this load).
WarmupCount WarmUp(v1::Generation::Stub& stub, const std::vector<Prompt>& prompts,
                   const std::string& mode, int concurrency, double seconds, int max_tokens) {
  WarmupCount count;
  absl::Mutex mu;
  std::atomic<int> next{0};
  const BenchClock::time_point deadline = After(BenchClock::now(), seconds);
  auto client = [&] {
    do {
      const int i = next.fetch_add(1);
      TimedStream stream = Generate(stub, prompts[static_cast<size_t>(i) % prompts.size()].text,
                                    mode, max_tokens, BenchClock::now());
      absl::MutexLock lock(&mu);
      ++count.requests;
      if (!stream.ok() && count.errors++ == 0) count.first_error = DescribeStatus(stream.status);
    } while (BenchClock::now() < deadline);
  };
  std::vector<std::thread> clients;
  clients.reserve(static_cast<size_t>(concurrency));
  for (int c = 0; c < concurrency; ++c) clients.emplace_back(client);
  for (std::thread& t : clients) t.join();
  return count;
}

// The 1-minute load average from /proc/loadavg; -1 where there is none.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

// Closed loop: `concurrency` clients, each sending its next request when the previous one
// finished, until the window's requests (or its duration) are used up.
ServeWindow RunWindow(v1::Generation::Stub& stub, const std::vector<Prompt>& prompts,
                      const std::string& mode, int concurrency, const BenchServeArgs& args) {
  ServeWindow window{.mode = mode, .concurrency = concurrency};
  const int requests = RequestsFor(args, concurrency);
  const bool timed = args.duration_seconds > 0;
  std::atomic<int> next{0};
  absl::Mutex mu;
  struct Done {
    double start = 0;  // seconds after the window started
    TimedStream stream;
  };
  std::vector<Done> done;
  double first_idle = -1;  // when the first client found no more work
  const BenchClock::time_point window_start = BenchClock::now();
  const BenchClock::time_point deadline = After(window_start, args.duration_seconds);
  auto client = [&] {
    for (;;) {
      const BenchClock::time_point start = BenchClock::now();
      const int i = next.fetch_add(1);
      if (timed ? start >= deadline : i >= requests) {
        absl::MutexLock lock(&mu);
        const double idle = SecondsBetween(window_start, start);
        if (first_idle < 0 || idle < first_idle) first_idle = idle;
        return;
      }
      const Prompt& prompt = prompts[static_cast<size_t>(i) % prompts.size()];
      TimedStream stream = Generate(stub, prompt.text, mode, args.max_tokens, start);
      absl::MutexLock lock(&mu);
      done.push_back({SecondsBetween(window_start, start), std::move(stream)});
    }
  };
  std::vector<std::thread> clients;
  clients.reserve(static_cast<size_t>(concurrency));
  for (int c = 0; c < concurrency; ++c) clients.emplace_back(client);
  for (std::thread& t : clients) t.join();
  window.wall_seconds = SecondsBetween(window_start, BenchClock::now());
  window.window_seconds = timed ? args.duration_seconds : first_idle;
  window.load_average = LoadAverage();

  for (const Done& d : done) {
    ++window.issued;
    const TimedStream& s = d.stream;
    if (!s.ok()) {
      if (window.errors++ == 0) window.first_error = DescribeStatus(s.status);
      continue;
    }
    ++window.completed;
    ++window.served_modes[s.mode.empty() ? "?" : s.mode];
    window.output_tokens += static_cast<int64_t>(s.tokens.size());
    for (const TimedStream::Chunk& chunk : s.chunks) {
      if (d.start + chunk.time <= window.window_seconds) window.window_tokens += chunk.tokens;
    }
    if (!s.chunks.empty()) window.ttft.push_back(s.FirstToken());
    const std::vector<double> itl = s.InterTokenLatencies();
    window.itl.insert(window.itl.end(), itl.begin(), itl.end());
    window.e2e.push_back(s.end);
  }
  return window;
}

nlohmann::json WindowJson(const ServeWindow& w) {
  return {
      {"round", w.round},
      {"position", w.position},
      {"requests", w.completed},
      {"errors", w.errors},
      {"first_error", w.first_error},
      {"served_modes", w.served_modes},
      {"output_tokens", w.output_tokens},
      {"window_seconds", w.window_seconds},
      {"window_tokens", w.window_tokens},
      {"wall_seconds", w.wall_seconds},
      {"tokens_per_second", w.TokensPerSecond()},
      {"requests_per_second", w.RequestsPerSecond()},
      {"load_average", w.load_average},
  };
}

// Counts and times are sums over the rounds; tokens/s and requests/s are medians over them;
// latency percentiles are over every round's requests.
nlohmann::json CellJson(const ServeCell& c) {
  double window_seconds = 0, wall_seconds = 0;
  int64_t window_tokens = 0;
  nlohmann::json rounds = nlohmann::json::array();
  for (const ServeWindow& w : c.rounds) {
    window_seconds += w.window_seconds;
    wall_seconds += w.wall_seconds;
    window_tokens += w.window_tokens;
    rounds.push_back(WindowJson(w));
  }
  const std::vector<double> ttft = c.Ttft(), itl = c.Itl(), e2e = c.E2e();
  return {
      {"mode", c.mode},
      {"concurrency", c.concurrency},
      {"requests", c.Completed()},
      {"errors", c.Errors()},
      {"first_error", c.FirstError()},
      {"served_modes", c.ServedModes()},
      {"output_tokens", c.OutputTokens()},
      {"window_seconds", window_seconds},
      {"window_tokens", window_tokens},
      {"wall_seconds", wall_seconds},
      {"tokens_per_second", c.MedianTokensPerSecond()},
      {"tokens_per_second_min", c.MinTokensPerSecond()},
      {"tokens_per_second_max", c.MaxTokensPerSecond()},
      {"requests_per_second", c.MedianRequestsPerSecond()},
      {"ttft_p50_seconds", Quantile(ttft, 0.5)},
      {"ttft_p99_seconds", Quantile(ttft, 0.99)},
      {"itl_p50_seconds", Quantile(itl, 0.5)},
      {"itl_p99_seconds", Quantile(itl, 0.99)},
      {"e2e_p50_seconds", Quantile(e2e, 0.5)},
      {"e2e_p99_seconds", Quantile(e2e, 0.99)},
      {"rounds", std::move(rounds)},
  };
}

std::string ServedModes(const ServeCell& c) {
  const std::map<std::string, int> served = c.ServedModes();
  std::vector<std::string> parts;
  for (const auto& [mode, count] : served) {
    parts.push_back(served.size() == 1 ? mode : absl::StrCat(mode, " ", count));
  }
  return absl::StrJoin(parts, ", ");
}

void PrintRow(const ServeCell& c) {
  auto ms = [](const std::vector<double>& v, double q) { return Quantile(v, q) * 1e3; };
  const std::vector<double> ttft = c.Ttft(), itl = c.Itl(), e2e = c.E2e();
  std::printf(
      "| %d | %s | %s | %d | %d | %.1f | %.1f – %.1f | %.2f | %.1f / %.1f | %.2f / %.2f | "
      "%.0f / %.0f |\n",
      c.concurrency, c.mode.c_str(), ServedModes(c).c_str(), c.Completed(), c.Errors(),
      c.MedianTokensPerSecond(), c.MinTokensPerSecond(), c.MaxTokensPerSecond(),
      c.MedianRequestsPerSecond(), ms(ttft, 0.5), ms(ttft, 0.99), ms(itl, 0.5), ms(itl, 0.99),
      ms(e2e, 0.5), ms(e2e, 0.99));
  std::fflush(stdout);
}

// Runs `/usr/bin/python3 tools/bench/plot_serve.py JSON PNG`. A message saying why not (and how
// to make the plot by hand) when it cannot.
absl::Status Plot(const std::string& json_path, const std::string& png_path) {
  absl::StatusOr<std::string> script = FindRepoFile(kPlotScript);
  if (!script.ok()) return script.status();
  auto child = ChildProcess::Start({.name = "plot script",
                                    .argv = {kPython, *script, json_path, png_path},
                                    .forward_output = false});
  const std::string by_hand =
      absl::StrCat("; to plot by hand: ", kPython, " ", kPlotScript, " ", json_path, " ", png_path);
  if (!child.ok()) return absl::UnavailableError(absl::StrCat(child.status().message(), by_hand));
  std::optional<int> status = (*child)->WaitForExit(absl::Seconds(120));
  if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "the plot script ",
        status ? ChildProcess::DescribeExit(*status) : std::string("did not finish in 120 s"), ": ",
        (*child)->StderrTail(), by_hand));
  }
  return absl::OkStatus();
}

}  // namespace

int RunBenchServe(const BenchServeArgs& args) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", kWho, std::string(status.message()).c_str());
    return 1;
  };
  if (absl::Status checked = CheckArgs(args); !checked.ok()) return fail(checked);
  absl::StatusOr<std::vector<Prompt>> prompts =
      LoadBenchPrompts(args.model_dir, args.prompts_file, 0);
  if (!prompts.ok()) return fail(prompts.status());

  std::unique_ptr<LocalCluster> cluster;
  std::string address = args.server;
  if (address.empty()) {
    if (!args.json) std::fprintf(stderr, "%s: starting a local cluster\n", kWho);
    auto started = LocalCluster::Start({.who = kWho,
                                        .model_dir = args.model_dir,
                                        .drafter_model_dir = args.drafter_dir,
                                        .metrics = false,
                                        .threads = args.threads,
                                        .device = args.device,
                                        .cpu_weights = args.cpu_weights,
                                        .forward_output = false});
    if (!started.ok()) return fail(started.status());
    cluster = std::move(*started);
    address = cluster->router_address();
  }
  auto channel = MakeChannel(address, args.tls);
  if (!channel.ok()) return fail(channel.status());
  auto stub = v1::Generation::NewStub(*channel);

  // The modes the cluster serves, to pick the defaults and to refuse unknown ones up front; the
  // wait is also the readiness check (see WaitForModels).
  absl::StatusOr<v1::ListModelsResponse> models = WaitForModels(*stub, address, kReadyTimeout);
  if (!models.ok()) return fail(models.status());
  const auto& served = models->models(0).modes();
  auto is_served = [&served](const std::string& variant) {
    absl::StatusOr<ModeVariant> v = ParseModeVariant(variant);
    if (!v.ok()) return false;
    return v->mode == "auto" || std::find(served.begin(), served.end(), v->mode) != served.end();
  };
  std::vector<std::string> modes = args.modes;
  if (modes.empty()) {
    // Every mode auto may choose for these (greedy) requests, when the model serves it: the
    // best of them is what auto is held to.
    for (const std::string& mode : AutoModes()) {
      if (is_served(mode)) modes.push_back(mode);
    }
    modes.push_back("auto");
  }
  for (size_t i = 0; i < modes.size(); ++i) {
    const std::string& mode = modes[i];
    if (std::find(modes.begin(), modes.begin() + static_cast<std::ptrdiff_t>(i), mode) !=
        modes.begin() + static_cast<std::ptrdiff_t>(i)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' is listed twice")));
    }
    if (absl::StatusOr<ModeVariant> v = ParseModeVariant(mode); !v.ok()) return fail(v.status());
    if (!is_served(mode)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' is not served by ",
                                                          address, " (it serves: auto, ",
                                                          absl::StrJoin(served, ", "), ")")));
    }
  }

  // Warm-up, per mode: closed-loop traffic at C = 1 and at the first level's C, half the time
  // each (all of it at C = 1 when that is the first level), nothing recorded.
  if (args.warmup_seconds > 0) {
    std::vector<int> warm_levels = {1};
    if (args.concurrency.front() != 1) warm_levels.push_back(args.concurrency.front());
    const double seconds = args.warmup_seconds / static_cast<double>(warm_levels.size());
    if (!args.json) {
      std::fprintf(stderr, "%s: warming up each mode for %g s (C = %s)\n", kWho,
                   args.warmup_seconds, absl::StrJoin(warm_levels, ", then C = ").c_str());
    }
    for (const std::string& mode : modes) {
      for (int concurrency : warm_levels) {
        const WarmupCount warm =
            WarmUp(*stub, *prompts, mode, concurrency, seconds, args.max_tokens);
        if (warm.errors == warm.requests) {
          return fail(absl::UnavailableError(absl::StrCat("every warm-up request in mode ", mode,
                                                          " at C = ", concurrency,
                                                          " failed: ", warm.first_error)));
        }
        if (warm.errors > 0) {
          std::fprintf(stderr, "%s: warm-up in mode %s at C = %d: %d of %d requests failed: %s\n",
                       kWho, mode.c_str(), concurrency, warm.errors, warm.requests,
                       warm.first_error.c_str());
        }
      }
    }
  }

  const std::string model_label = cluster ? cluster->model_dir() : models->models(0).id();
  if (!args.json) {
    std::printf(
        "serving under load: %s, %zu prompts, %d tokens each, greedy; %s per window, %d "
        "round%s per level (mode order rotated each round) then %d pair round%s of auto and "
        "each leading fixed mode (ABBA), %g s warm-up per mode\n",
        cluster ? absl::StrCat("local cluster (", model_label, ")").c_str() : address.c_str(),
        prompts->size(), args.max_tokens,
        args.duration_seconds > 0
            ? absl::StrCat(args.duration_seconds, " s").c_str()
            : (args.requests_per_level > 0
                   ? absl::StrCat(args.requests_per_level, " requests").c_str()
                   : "max(16, 4 x C) requests"),
        args.rounds, args.rounds == 1 ? "" : "s", args.pair_rounds,
        args.pair_rounds == 1 ? "" : "s", args.warmup_seconds);
    std::printf(
        "tokens/s: median over the rounds of the tokens that arrived while all C clients were "
        "busy, over that window (min – max across the rounds); requests/s = tokens/s / mean "
        "tokens per request (median); requests, errors and served as summed over the rounds; "
        "latencies over every round's requests, in ms\n\n");
    std::printf(
        "| C | mode | served as | requests | errors | tokens/s (median) | min – max | requests/s "
        "| TTFT p50 / p99 | ITL p50 / p99 | E2E p50 / p99 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  // cells[level * modes.size() + mode]: C-major, the modes in the order given.
  std::vector<ServeCell> cells;
  for (int concurrency : args.concurrency) {
    for (const std::string& mode : modes)
      cells.push_back({.mode = mode, .concurrency = concurrency});
  }
  std::vector<AutoVsBest> ratios;
  std::vector<FormatCost> format_costs;  // the MODE@FORMAT variants against their MODE
  bool broken = false;
  for (size_t l = 0; l < args.concurrency.size(); ++l) {
    const int concurrency = args.concurrency[l];
    ServeCell* level_cells = &cells[l * modes.size()];
    auto cell_of = [&](const std::string& mode) -> ServeCell& {
      return level_cells[std::find(modes.begin(), modes.end(), mode) - modes.begin()];
    };
    // Runs one round's windows in `order` into their cells; `label` names the round in messages.
    auto run_round = [&](const std::vector<std::string>& order, int round,
                         const std::string& label) {
      std::vector<std::string> progress;
      for (size_t position = 0; position < order.size(); ++position) {
        ServeWindow window = RunWindow(*stub, *prompts, order[position], concurrency, args);
        window.round = round;
        window.position = static_cast<int>(position);
        if (window.completed == 0) {
          broken = true;
          std::fprintf(stderr, "%s: every request failed in mode %s at concurrency %d, %s: %s\n",
                       kWho, window.mode.c_str(), concurrency, label.c_str(),
                       window.first_error.c_str());
        }
        progress.push_back(absl::StrFormat("%s %.1f", window.mode, window.TokensPerSecond()));
        cell_of(window.mode).rounds.push_back(std::move(window));
      }
      if (!args.json) {
        std::fprintf(stderr, "%s: C = %d, %s: %s tokens/s (load average %.1f, %u cpus)\n", kWho,
                     concurrency, label.c_str(), absl::StrJoin(progress, ", ").c_str(),
                     LoadAverage(), std::thread::hardware_concurrency());
      }
    };
    for (int round = 0; round < args.rounds; ++round) {
      run_round(RoundOrder(modes, round), round,
                absl::StrFormat("round %d/%d", round + 1, args.rounds));
    }
    std::vector<const ServeCell*> at_level;
    for (size_t m = 0; m < modes.size(); ++m) at_level.push_back(&level_cells[m]);
    // The criterion compares auto with one mode: spend more windows on those two, side by side.
    // A mode that leads only after another's pair rounds gets its own, so the criterion never
    // sets auto's pair-round windows against a mode measured only in the rounds.
    std::vector<std::string> paired_with;
    int round = args.rounds;
    for (;;) {
      const std::optional<AutoVsBest> leader = CompareAutoWithBest(at_level, args.threshold);
      if (!leader || args.pair_rounds == 0 ||
          std::find(paired_with.begin(), paired_with.end(), leader->best_mode) !=
              paired_with.end()) {
        break;
      }
      paired_with.push_back(leader->best_mode);
      for (int pair = 0; pair < args.pair_rounds; ++pair, ++round) {
        run_round(PairOrder(leader->best_mode, pair), round,
                  absl::StrFormat("pair round %d/%d with %s", pair + 1, args.pair_rounds,
                                  leader->best_mode));
      }
    }
    if (!args.json) {
      for (const ServeCell& cell : std::span(level_cells, modes.size())) PrintRow(cell);
    }
    if (std::optional<AutoVsBest> ratio = CompareAutoWithBest(at_level, args.threshold)) {
      ratios.push_back(*ratio);
    }
    for (FormatCost& cost : CompareFormatsWithBase(at_level)) format_costs.push_back(cost);
  }

  nlohmann::json j = {
      {"server", cluster ? "local cluster" : address},
      {"model", model_label},
      {"drafter_model", cluster ? cluster->drafter_model_dir() : ""},
      {"prompts", prompts->size()},
      {"max_tokens", args.max_tokens},
      {"requests_per_level", args.requests_per_level},
      {"duration_seconds", args.duration_seconds},
      {"rounds", args.rounds},
      {"pair_rounds", args.pair_rounds},
      {"warmup_seconds", args.warmup_seconds},
      {"concurrency", args.concurrency},
      {"modes", modes},
      {"threshold", args.threshold},
      {"criterion",
       "ratio = auto's median tokens/s over its windows / the best fixed mode's (the fixed "
       "mode with the highest median; auto and each fixed mode that led after the rounds or "
       "after another's pair rounds also ran pair rounds together). paired_ratios: per round, "
       "auto / that mode in the same round. pass = paired_ratio_median >= threshold (ratio "
       "when no round paired them)"},
      {"cpus", std::thread::hardware_concurrency()},
      {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
  };
  j["levels"] = nlohmann::json::array();
  for (const ServeCell& c : cells) j["levels"].push_back(CellJson(c));
  j["structured_output_cost"] = nlohmann::json::array();
  for (const FormatCost& c : format_costs) {
    j["structured_output_cost"].push_back({{"concurrency", c.concurrency},
                                           {"variant", c.variant},
                                           {"variant_tokens_per_second", c.variant_tps},
                                           {"base", c.base},
                                           {"base_tokens_per_second", c.base_tps},
                                           {"ratio", c.ratio},
                                           {"paired_ratios", c.paired_ratios},
                                           {"paired_ratio_median", c.paired_median}});
  }
  j["auto_vs_best"] = nlohmann::json::array();
  for (const AutoVsBest& r : ratios) {
    j["auto_vs_best"].push_back({{"concurrency", r.concurrency},
                                 {"auto_tokens_per_second", r.auto_tps},
                                 {"best_mode", r.best_mode},
                                 {"best_tokens_per_second", r.best_tps},
                                 {"ratio", r.ratio},
                                 {"pass", r.pass},
                                 {"paired_ratios", r.paired_ratios},
                                 {"paired_ratio_median", r.paired_median}});
  }

  if (!args.json && !ratios.empty()) {
    std::printf(
        "\n| C | auto tokens/s (median) | best fixed mode | its tokens/s (median) | auto / best "
        "(medians) | paired auto / best per round (median) | paired median >= %.2f |\n",
        args.threshold);
    std::printf("|---|---|---|---|---|---|---|\n");
    for (const AutoVsBest& r : ratios) {
      std::vector<std::string> paired;
      for (double p : r.paired_ratios) paired.push_back(absl::StrFormat("%.2f", p));
      std::printf("| %d | %.1f | %s | %.1f | %.3f | %s (%.3f) | %s |\n", r.concurrency, r.auto_tps,
                  r.best_mode.c_str(), r.best_tps, r.ratio, absl::StrJoin(paired, ", ").c_str(),
                  r.paired_median, r.pass ? "PASS" : "FAIL");
    }
    std::printf(
        "\nbest = the fixed mode with the highest median tokens/s over its windows (%d round%s, "
        "then %d pair round%s of auto with each fixed mode that led). PASS / FAIL: the median "
        "of the paired ratios (auto over the best in the same round, two windows back to back, "
        "so that a change in the machine's speed between rounds cancels out); auto / best "
        "(medians) sets windows from different moments against each other and is shown for "
        "comparison.\n",
        args.rounds, args.rounds == 1 ? "" : "s", args.pair_rounds,
        args.pair_rounds == 1 ? "" : "s");
  }
  if (!args.json && !format_costs.empty()) {
    std::printf(
        "\n| C | variant | tokens/s (median) | free text | its tokens/s (median) | variant / "
        "free text (medians) | paired per round (median) |\n|---|---|---|---|---|---|---|\n");
    for (const FormatCost& c : format_costs) {
      std::vector<std::string> paired;
      for (double p : c.paired_ratios) paired.push_back(absl::StrFormat("%.2f", p));
      std::printf("| %d | %s | %.1f | %s | %.1f | %.3f | %s (%.3f) |\n", c.concurrency,
                  c.variant.c_str(), c.variant_tps, c.base.c_str(), c.base_tps, c.ratio,
                  absl::StrJoin(paired, ", ").c_str(), c.paired_median);
    }
    std::printf(
        "\nvariant MODE@FORMAT = MODE with structured output (json_object, or json_schema: %s); "
        "its windows run interleaved with MODE's, so the paired ratios compare windows taken "
        "side by side.\n",
        kBenchJsonSchema);
  }
  if (cluster) cluster->Stop();

  if (!args.out_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(args.out_dir, error);
    const std::string json_path = (std::filesystem::path(args.out_dir) / "serve.json").string();
    const std::string png_path = (std::filesystem::path(args.out_dir) / "serve.png").string();
    std::ofstream out(json_path);
    out << j.dump(1) << "\n";
    out.close();
    if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
    absl::Status plotted = Plot(json_path, png_path);
    // With --json stdout carries the JSON only; the file notes go to stderr.
    FILE* notes = args.json ? stderr : stdout;
    std::fprintf(notes, "\n%s: wrote %s\n", kWho, json_path.c_str());
    if (plotted.ok()) {
      std::fprintf(notes, "%s: wrote %s\n", kWho, png_path.c_str());
    } else {
      std::fprintf(stderr, "%s: no plot: %s\n", kWho, std::string(plotted.message()).c_str());
    }
  }
  if (args.json) std::printf("%s\n", j.dump(1).c_str());
  return broken ? 1 : 0;
}

}  // namespace tandem::cli
