#include "router/mode_policy.h"

#include <algorithm>

namespace tandem::router {

namespace {

bool Contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

}  // namespace

const std::vector<std::string>& LosslessModes() {
  static const std::vector<std::string> modes = {"ar", "spec", "self_spec", "self_spec_quadratic",
                                                 "jacobi"};
  return modes;
}

ModePolicy::ModePolicy(ModePolicyOptions options) : options_(options) {}

ModeDecision ModePolicy::Decide(std::string_view key, const std::vector<std::string>& served,
                                const CostModel& cost, double sequences,
                                const ModeRequestTraits& request, std::string_view default_mode) {
  // Candidates in tie-break order: the lossless modes first, then (if allowed) the rest as the
  // verifier lists them.
  std::vector<std::string> order;
  for (const std::string& mode : LosslessModes()) {
    if (Contains(served, mode)) order.push_back(mode);
  }
  if (options_.allow_lossy) {
    for (const std::string& mode : served) {
      if (!Contains(order, mode)) order.push_back(mode);
    }
  }
  ModeDecision decision;
  for (const std::string& mode : order) {
    if (mode == "jacobi" && !request.greedy) continue;
    if (std::optional<double> goodput = cost.Goodput(mode, std::max(1.0, sequences))) {
      decision.estimates.emplace_back(mode, *goodput);
    }
  }
  if (decision.estimates.empty()) {
    decision.mode = default_mode.empty() ? "auto" : std::string(default_mode);
    decision.reason = "no_data";
    return decision;
  }
  // Modes measured near this load win over extrapolated ones: an estimate carried from
  // another load (calibration's small batches, say) may be far off, and acting on it costs
  // real traffic. Extrapolations decide only when no mode is measured near the load.
  const double load = std::max(1.0, sequences);
  auto supported = [&](const std::string& mode) {
    return cost.MeasuredNear(mode, load, options_.min_samples);
  };
  const bool any_supported = std::any_of(decision.estimates.begin(), decision.estimates.end(),
                                         [&](const auto& e) { return supported(e.first); });
  auto best = decision.estimates.end();
  for (auto it = decision.estimates.begin(); it != decision.estimates.end(); ++it) {
    if (any_supported && !supported(it->first)) continue;
    // Strictly greater: ties keep the earlier mode.
    if (best == decision.estimates.end() || it->second > best->second) best = it;
  }
  auto estimate_of = [&](std::string_view mode) {
    return std::find_if(decision.estimates.begin(), decision.estimates.end(),
                        [&](const auto& e) { return e.first == mode; });
  };

  absl::MutexLock lock(&mu_);
  KeyState& state = state_[std::string(key)];
  auto current = estimate_of(state.current);
  if (current != decision.estimates.end() && any_supported && !supported(current->first)) {
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
    state.streak = state.challenger == best->first ? state.streak + 1 : 1;
    state.challenger = best->first;
    if (state.streak >= options_.confirm) {
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
