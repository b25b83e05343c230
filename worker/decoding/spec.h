// `spec`: speculative decoding of an AR target with a separate drafter (SimSD's AR-target
// case; Leviathan et al. verification). Lossless: the output has the target's sampling
// distribution, and under greedy decoding equals AR token for token.
//
// One step, with T = sequence length and γ = min(gamma, budget - 1, room left in the context):
//
//   drafts    x̂_0 .. x̂_{γ-1} = drafter.Draft(tokens, γ)          (greedy: q is a point mass)
//   extend    [pending tokens | x̂_0 .. x̂_{γ-1}]  causal, positions kv_len ..
//   outputs   the last pending token and every draft: row i is p_i, the target's sampling
//             distribution of sequence index T + i given the drafts before it (i = 0..γ)
//   verify    for i = 0..γ-1: accept x̂_i with probability p_i(x̂_i), drawn with
//             UniformRandom(seed, T + i, kAccept) (greedy: accept iff x̂_i = argmax). On
//             rejection draw index T + i from p_i with x̂_i removed, renormalised (kResample),
//             and stop. If all are accepted, draw index T + γ from p_γ (kSample, as AR does).
//   commit    KV of the pending tokens and the accepted drafts; the sequence gains the accepted
//             drafts and the resampled or bonus token.
//
// Why this is exact: for a point-mass q at x̂ the residual max(0, p - q) is p without x̂, so
// P(token = x̂) = p(x̂) and P(token = y != x̂) = (1 - p(x̂)) p(y) / (1 - p(x̂)) = p(y).
//
// γ = 0 (or no drafts) is an AR step with AR's random keys, so it reproduces `ar` exactly even
// when sampling. A drafter error also gives an AR step (a failed drafter never fails the
// sequence); SpecStats counts those.
//
// A drafter conditioned on the target's hidden states (Drafter::HiddenLayers non-empty, e.g.
// DFlashDrafter) gets them from the verify forward itself: the plan taps those layers, and
// Consume hands over the rows of the kept tokens (pending and accepted drafts), whose extend
// rows attended to final tokens only. The new token has no row until the next step.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/drafter.h"

namespace tandem {

// Most draft tokens one step may verify; callers size the KV cache with this much headroom.
inline constexpr int kMaxSpecGamma = 64;

struct SpecStats {
  int64_t steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t drafter_failures = 0;  // steps that fell back to AR because the drafter failed
  absl::Status last_drafter_error;
};

class SpecMode : public DecodingMode {
 public:
  // `gamma` in [0, kMaxSpecGamma]; `max_positions`: the target's max_position_embeddings
  // (0 = no limit).
  SpecMode(int gamma, std::unique_ptr<Drafter> drafter, int vocab_size, int max_positions);

  std::string_view name() const override { return "spec"; }
  bool lossless() const override { return true; }
  StepPlan Plan(const DecodeState& state) override;
  // Internal when the logits do not match the plan.
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

  const SpecStats& stats() const { return stats_; }
  const Drafter& drafter() const { return *drafter_; }
  const DrafterStats* drafter_stats() const override { return &drafter_->stats(); }

 private:
  // Gives the drafter the target's hidden rows of the first `kept` plan tokens.
  void HandOverHidden(const DecodeState& state, const StepPlan& plan, const ExtendOutput& out,
                      int kept);

  int gamma_;
  std::unique_ptr<Drafter> drafter_;
  int vocab_size_;
  int max_positions_;
  SpecStats stats_;
};

}  // namespace tandem
