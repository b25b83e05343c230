// The verifier's per-step choice of γ (draft tokens to verify) for each `spec` sequence of a
// batch, from the live batch and the engine's measured step-time curve. γ = 0 is an AR step.
//
// Model: sequence i with per-draft acceptance probability α_i gains E_i(γ) = 1 + α_i + ... +
// α_i^γ tokens in expectation when it verifies γ drafts (drafts are accepted in order until the
// first rejection; the resampled or bonus token always comes). The batch gains Σ E_i per step
// and the step takes T(B) seconds for B batch tokens. Maximising the batch's goodput
// G = Σ E_i / T(B) over every γ_i at once has a simple fixed point: at the optimum each
// sequence keeps its k-th draft exactly when its expected gain α_i^k exceeds λ = G × T'(B), the
// tokens the whole batch would lose to the time one more token adds to the step. So at low load
// (T' ≈ 0: the step's fixed cost dominates) every sequence drafts its maximum, and as the batch
// grows λ rises until only sequences with high acceptance draft and the rest take AR steps.
// The choice never changes what a step can output, only how many drafts it verifies.
//
// Thread-safety: pure functions.
#pragma once

#include <span>
#include <vector>

#include "common/cost_model.h"

namespace tandem {

struct GammaCandidate {
  int max_gamma = 0;        // the request's γ (the most drafts it may verify this step)
  double acceptance = 0.5;  // running estimate of the per-draft acceptance probability
};

// The batch around the candidates: tokens and expected completion tokens of every other
// extend of the step (other modes' sequences, prefill chunks), and the candidates' own tokens
// before drafts (their pending tokens, usually 1 each).
struct GammaBatch {
  double other_tokens = 0;
  double other_gain = 0;
  double candidate_tokens = 0;
};

// Expected completion tokens of one step verifying `gamma` drafts at per-draft acceptance `a`.
double ExpectedTokens(double acceptance, int gamma);

// γ per candidate, each in [0, max_gamma]. Without a step-time curve of two points or more
// (nothing measured yet) every candidate gets its max_gamma.
std::vector<int> ChooseGammas(std::span<const GammaCandidate> candidates, const GammaBatch& batch,
                              const CostModel& cost);

// Running per-draft acceptance estimate of one sequence: decayed counts of accepted drafts and
// of verified positions (accepted ones plus the first rejected one), starting from a prior worth
// two positions at `prior`.
class AcceptanceEstimate {
 public:
  explicit AcceptanceEstimate(double prior = 0.6) : hits_(2 * prior), trials_(2) {}
  // A step that verified `drafted` > 0 drafts and accepted the leading `accepted`.
  void Observe(int drafted, int accepted);
  double value() const { return trials_ > 0 ? hits_ / trials_ : 0; }

 private:
  static constexpr double kDecay = 0.8;  // per observed step
  double hits_;
  double trials_;
};

}  // namespace tandem
