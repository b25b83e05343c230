// The router's choice of decoding mode for a request that asks for "auto": the mode whose
// estimated goodput on the chosen verifier, at that verifier's load with this request added, is
// highest, with hysteresis so that the choice does not flap. No gRPC: the service layer passes
// the verifier's reported cost model and load.
//
// Goodput estimate (CostModel::Goodput): a batch of n sequences all in mode m completes
// n × TPF_m(n) tokens per step of StepSeconds(n × extend_m(n)) seconds, and each request pays
// its mode's start cost (submission to first token) once over its L completion tokens (L: the
// request's max_tokens, or the verifier's mean completion length if shorter). With n the same
// for every candidate mode, the mode that maximises the batch's tokens per second also
// maximises each request's own tokens per second, so one number serves both goals; the
// estimate assumes the verifier's other sequences run the same mode, which hysteresis makes
// the common case.
//
// Candidates: modes the verifier serves, that it has measured, and that the request allows:
// by default only the auto modes (AutoModes(): ar, spec, self_spec, self_spec_quadratic, isd,
// jacobi; lossless under their default options) - an
// "auto" request must get the target model's distribution - and jacobi only for greedy
// requests (it decodes greedily).
//
// Support: a mode measured near the load (CostModel::MeasuredNear, options.min_samples) beats
// one whose estimate is extrapolated from other loads; extrapolations decide only when no mode
// is measured near the load, and a current mode without support gives way at once to one with.
//
// Hysteresis, per key (the router uses the verifier's address): the key's current mode stays
// until another mode's estimate beats it by `margin` (relative) on `confirm` consecutive
// decisions spanning at least `confirm_time`; a current mode that is no longer a candidate is
// replaced at once. The time matters as much as the count: estimates change only when a
// verifier's load report arrives (about once a second), so many decisions within one report
// repeat the same evidence, and the first requests of a burst see a load of 1, 2, ... for a
// moment, where another mode may lead; a lead that lasts only that long must not switch a
// verifier whose batch is about to be full.
//
// Decision reasons (the `reason` label of tandem_mode_decisions_total):
//   policy      the best estimate (the current mode, or a switch to a new best)
//   hysteresis  another mode estimated better, but not by the margin for long enough
//   no_data     no candidate mode has measurements: the verifier's default mode
// ("pinned" and "default" are the service's: a request that names its mode, and auto requests
// while the policy is off.)
//
// Thread-safety: Decide may be called from any thread; one mutex guards the per-key state.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cost_model.h"

namespace tandem::router {

struct ModePolicyOptions {
  // A challenger must estimate at least (1 + margin) × the current mode. The margin is also
  // what the policy may lose for good: a mode up to (1 + margin) × better never replaces the
  // current one, so auto keeps at least 1 / (1 + margin) of the best mode's goodput (0.952 at
  // 5 %) where the estimates are right. Flapping is held off by confirm and confirm_time.
  double margin = 0.05;
  int confirm = 3;  // ... on this many consecutive decisions of the key
  absl::Duration confirm_time = absl::Seconds(2);  // ... from the first of them to the switch
  bool allow_lossy = false;  // lossy modes (diffusion) may be chosen too (not lossless_only ones)
  // Sequence-steps a mode needs at a load within a factor of two of the request's for its
  // estimate there to count as measured (see Decide).
  int64_t min_samples = 16;
};

// What the request allows.
struct ModeRequestTraits {
  bool greedy = true;  // temperature 0
  // The request needs the target's AR log-probabilities (logprobs): lossless modes only.
  bool lossless_only = false;
  // The request's max_tokens (0 = not given): its completion is at most this long, so a mode's
  // start cost is spread over no more tokens than this (CostModel::Goodput's request length is
  // the smaller of this and the verifier's mean).
  int max_tokens = 0;
};

struct ModeDecision {
  std::string mode;    // a mode name; "auto" when no_data and the verifier named no default
  std::string reason;  // policy | hysteresis | no_data
  double goodput = 0;  // estimated tokens/s of `mode` (0 for no_data)
  // Every candidate's estimate, in candidate order.
  std::vector<std::pair<std::string, double>> estimates;
};

class ModePolicy {
 public:
  explicit ModePolicy(ModePolicyOptions options = {});

  // `served`: the verifier's modes; `cost`: its cost model; `sequences`: its load with this
  // request (running + queued + 1, or more); `default_mode`: its mode for "auto" ("" = unknown).
  // `now`: the decision's time (the hysteresis' clock).
  ModeDecision Decide(std::string_view key, const std::vector<std::string>& served,
                      const CostModel& cost, double sequences, const ModeRequestTraits& request,
                      std::string_view default_mode, absl::Time now = absl::Now());

  // The best candidate's estimate at `sequences` by the same rules as Decide (candidates,
  // support), without hysteresis or state: what the verifier could do at that load. nullopt
  // when no candidate has measurements. The router's verifier choice compares verifiers by it.
  std::optional<double> BestGoodput(const std::vector<std::string>& served, const CostModel& cost,
                                    double sequences, const ModeRequestTraits& request) const;

  const ModePolicyOptions& options() const { return options_; }

 private:
  struct Estimates {
    std::vector<std::pair<std::string, double>> goodputs;  // candidate order
    std::vector<bool> supported;                           // measured near the load, per entry
    bool any_supported = false;
    std::optional<size_t> best;  // index into goodputs under the support rule
  };
  Estimates Estimate(const std::vector<std::string>& served, const CostModel& cost,
                     double sequences, const ModeRequestTraits& request) const;

  struct KeyState {
    std::string current;
    std::string challenger;  // the mode beating `current` by the margin lately
    int streak = 0;          // its consecutive wins
    absl::Time since;        // the first of them
  };

  const ModePolicyOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, KeyState> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
