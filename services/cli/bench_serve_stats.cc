#include "services/cli/bench_serve_stats.h"

#include <algorithm>

namespace tandem::cli {

double ServeWindow::TokensPerSecond() const {
  return window_seconds > 0 ? static_cast<double>(window_tokens) / window_seconds : 0;
}

double ServeWindow::RequestsPerSecond() const {
  return output_tokens > 0 ? TokensPerSecond() * completed / static_cast<double>(output_tokens) : 0;
}

std::vector<std::string> RoundOrder(const std::vector<std::string>& modes, int round) {
  std::vector<std::string> order;
  order.reserve(modes.size());
  const size_t n = modes.size();
  for (size_t i = 0; i < n; ++i) order.push_back(modes[(static_cast<size_t>(round) + i) % n]);
  return order;
}

std::vector<std::string> PairOrder(const std::string& best, int pair) {
  const bool best_first = pair % 4 == 0 || pair % 4 == 3;
  return best_first ? std::vector<std::string>{best, "auto"}
                    : std::vector<std::string>{"auto", best};
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

std::vector<double> ServeCell::TokensPerSecondByRound() const {
  std::vector<double> out;
  out.reserve(rounds.size());
  for (const ServeWindow& w : rounds) out.push_back(w.TokensPerSecond());
  return out;
}

double ServeCell::MedianTokensPerSecond() const { return Median(TokensPerSecondByRound()); }

double ServeCell::MinTokensPerSecond() const {
  const std::vector<double> tps = TokensPerSecondByRound();
  return tps.empty() ? 0 : *std::min_element(tps.begin(), tps.end());
}

double ServeCell::MaxTokensPerSecond() const {
  const std::vector<double> tps = TokensPerSecondByRound();
  return tps.empty() ? 0 : *std::max_element(tps.begin(), tps.end());
}

double ServeCell::MedianRequestsPerSecond() const {
  std::vector<double> rps;
  for (const ServeWindow& w : rounds) rps.push_back(w.RequestsPerSecond());
  return Median(std::move(rps));
}

int ServeCell::Completed() const {
  int n = 0;
  for (const ServeWindow& w : rounds) n += w.completed;
  return n;
}

int ServeCell::Errors() const {
  int n = 0;
  for (const ServeWindow& w : rounds) n += w.errors;
  return n;
}

int64_t ServeCell::OutputTokens() const {
  int64_t n = 0;
  for (const ServeWindow& w : rounds) n += w.output_tokens;
  return n;
}

std::map<std::string, int> ServeCell::ServedModes() const {
  std::map<std::string, int> out;
  for (const ServeWindow& w : rounds) {
    for (const auto& [mode, count] : w.served_modes) out[mode] += count;
  }
  return out;
}

std::string ServeCell::FirstError() const {
  for (const ServeWindow& w : rounds) {
    if (!w.first_error.empty()) return w.first_error;
  }
  return "";
}

namespace {

std::vector<double> Pooled(const std::vector<ServeWindow>& rounds,
                           std::vector<double> ServeWindow::*samples) {
  std::vector<double> out;
  for (const ServeWindow& w : rounds) {
    out.insert(out.end(), (w.*samples).begin(), (w.*samples).end());
  }
  return out;
}

}  // namespace

std::vector<double> ServeCell::Ttft() const { return Pooled(rounds, &ServeWindow::ttft); }
std::vector<double> ServeCell::Itl() const { return Pooled(rounds, &ServeWindow::itl); }
std::vector<double> ServeCell::E2e() const { return Pooled(rounds, &ServeWindow::e2e); }

std::optional<AutoVsBest> CompareAutoWithBest(const std::vector<const ServeCell*>& cells,
                                              double threshold) {
  const ServeCell* automatic = nullptr;
  const ServeCell* best = nullptr;
  double best_tps = 0;
  for (const ServeCell* cell : cells) {
    if (cell->mode == "auto") {
      automatic = cell;
      continue;
    }
    if (cell->mode.find('@') != std::string::npos) continue;  // structured output: not a rival
    const double tps = cell->MedianTokensPerSecond();
    if (tps > best_tps) {
      best_tps = tps;
      best = cell;
    }
  }
  if (automatic == nullptr || best == nullptr) return std::nullopt;
  AutoVsBest r{.concurrency = automatic->concurrency,
               .auto_tps = automatic->MedianTokensPerSecond(),
               .best_mode = best->mode,
               .best_tps = best_tps};
  r.ratio = r.auto_tps / r.best_tps;
  for (const ServeWindow& a : automatic->rounds) {
    for (const ServeWindow& b : best->rounds) {
      if (b.round != a.round) continue;
      if (b.TokensPerSecond() > 0)
        r.paired_ratios.push_back(a.TokensPerSecond() / b.TokensPerSecond());
      break;
    }
  }
  r.paired_median = Median(r.paired_ratios);
  r.pass = (r.paired_ratios.empty() ? r.ratio : r.paired_median) >= threshold;
  return r;
}

std::vector<FormatCost> CompareFormatsWithBase(const std::vector<const ServeCell*>& cells) {
  std::vector<FormatCost> costs;
  for (const ServeCell* cell : cells) {
    const size_t at = cell->mode.find('@');
    if (at == std::string::npos) continue;
    const std::string base_mode = cell->mode.substr(0, at);
    for (const ServeCell* base : cells) {
      if (base->mode != base_mode || base->concurrency != cell->concurrency) continue;
      FormatCost cost{.concurrency = cell->concurrency,
                      .variant = cell->mode,
                      .base = base->mode,
                      .variant_tps = cell->MedianTokensPerSecond(),
                      .base_tps = base->MedianTokensPerSecond()};
      cost.ratio = cost.base_tps > 0 ? cost.variant_tps / cost.base_tps : 0;
      for (const ServeWindow& v : cell->rounds) {
        for (const ServeWindow& b : base->rounds) {
          if (b.round == v.round && b.TokensPerSecond() > 0) {
            cost.paired_ratios.push_back(v.TokensPerSecond() / b.TokensPerSecond());
          }
        }
      }
      cost.paired_median = Median(cost.paired_ratios);
      costs.push_back(std::move(cost));
      break;
    }
  }
  return costs;
}

}  // namespace tandem::cli
