#include "router/mode_policy.h"

#include <algorithm>

namespace tandem::router {

namespace {

bool Contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

ModePolicy::ModePolicy(ModePolicyOptions options) : options_(options) {}

ModePolicy::Estimates ModePolicy::Estimate(const std::vector<std::string>& served,
                                           const CostModel& cost, double sequences,
                                           const ModeRequestTraits& request) const {
  // Candidates in tie-break order: the auto modes first, then (if allowed) the rest as the
  // verifier lists them.
  std::vector<std::string> order;
  for (const std::string& mode : AutoModes()) {
    if (Contains(served, mode)) order.push_back(mode);
  }
  if (options_.allow_lossy && !request.lossless_only) {
    for (const std::string& mode : served) {
      if (!Contains(order, mode)) order.push_back(mode);
    }
  }
  Estimates out;
  const double load = std::max(1.0, sequences);
  double length = cost.request_tokens;
  if (request.max_tokens > 0 && (length <= 0 || request.max_tokens < length)) {
    length = request.max_tokens;
  }
  for (const std::string& mode : order) {
    if (mode == "jacobi" && !request.greedy) continue;
    if (std::optional<double> goodput = cost.Goodput(mode, load, length)) {
      out.goodputs.emplace_back(mode, *goodput);
      out.supported.push_back(cost.MeasuredNear(mode, load, options_.min_samples));
    }
  }
  // Modes measured near this load win over extrapolated ones: an estimate carried from
  // another load (calibration's small batches, say) may be far off, and acting on it costs
  // real traffic. Extrapolations decide only when no mode is measured near the load.
  out.any_supported =
      std::find(out.supported.begin(), out.supported.end(), true) != out.supported.end();
  for (size_t i = 0; i < out.goodputs.size(); ++i) {
    if (out.any_supported && !out.supported[i]) continue;
    // Strictly greater: ties keep the earlier mode.
    if (!out.best || out.goodputs[i].second > out.goodputs[*out.best].second) out.best = i;
  }
  return out;
}

std::optional<double> ModePolicy::BestGoodput(const std::vector<std::string>& served,
                                              const CostModel& cost, double sequences,
                                              const ModeRequestTraits& request) const {
  const Estimates estimates = Estimate(served, cost, sequences, request);
  if (!estimates.best) return std::nullopt;
  return estimates.goodputs[*estimates.best].second;
}

ModeDecision ModePolicy::Decide(std::string_view key, const std::vector<std::string>& served,
                                const CostModel& cost, double sequences,
                                const ModeRequestTraits& request, std::string_view default_mode,
                                absl::Time now) {
  Estimates estimated = Estimate(served, cost, sequences, request);
  ModeDecision decision;
  decision.estimates = estimated.goodputs;
  if (!estimated.best) {
    decision.mode = default_mode.empty() ? "auto" : std::string(default_mode);
    decision.reason = "no_data";
    return decision;
  }
  const auto best = decision.estimates.begin() + static_cast<ptrdiff_t>(*estimated.best);
  auto estimate_of = [&](std::string_view mode) {
    return std::find_if(decision.estimates.begin(), decision.estimates.end(),
                        [&](const auto& e) { return e.first == mode; });
  };

  absl::MutexLock lock(&mu_);
  KeyState& state = state_[std::string(key)];
  auto current = estimate_of(state.current);
  if (current != decision.estimates.end() && estimated.any_supported &&
      !estimated.supported[static_cast<size_t>(current - decision.estimates.begin())]) {
    current = decision.estimates.end();  // replaced by a measured mode at once
  }
  if (current == decision.estimates.end() || current == best) {
    // No current mode yet, or it is no longer a candidate, or it is the best: take the best.
    state.current = best->first;
    state.challenger.clear();
    state.streak = 0;
    decision.mode = best->first;
    decision.goodput = best->second;
    decision.reason = "policy";
    return decision;
  }
  if (best->second >= current->second * (1 + options_.margin)) {
    if (state.challenger == best->first) {
      ++state.streak;
    } else {
      state.challenger = best->first;
      state.streak = 1;
      state.since = now;
    }
    if (state.streak >= options_.confirm && now - state.since >= options_.confirm_time) {
      state.current = best->first;
      state.challenger.clear();
      state.streak = 0;
      decision.mode = best->first;
      decision.goodput = best->second;
      decision.reason = "policy";
      return decision;
    }
  } else {
    state.challenger.clear();
    state.streak = 0;
  }
  decision.mode = current->first;
  decision.goodput = current->second;
  decision.reason = "hysteresis";
  return decision;
}

}  // namespace tandem::router
