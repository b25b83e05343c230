// Speculative verification of one greedy (point-mass) draft token, shared by every mode that
// verifies drafts against the target's AR distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/sampling/sampling.h"

namespace tandem {

// VerifyDraft (worker/sampling/sampling.h) is the rule: accept a point-mass draft with
// probability p(draft) (kAccept at its index), else resample from p without it (kResample).

// A masked diffusion slot's confidence: the top-1 probability of softmax(logits) over every token
// but `mask_token` (<|mask|> is never a prediction); that token goes to `*top` when not null.
float SlotConfidence(std::span<const float> logits, int32_t mask_token, int32_t* top = nullptr);

// The plan of that verify pass: the pending tokens followed by `drafts` at the next indices,
// causal, with outputs from the last pending token on (row j: the distribution at draft j).
// With sampling settings the plan asks the model to verify the run itself (PlanDeviceVerify).
StepPlan PlanDraftRun(const DecodeState& state, std::span<const int32_t> drafts);

// Asks the model to verify a planned draft run on its device instead of returning logits:
// plan->tokens are the pending tokens followed by m drafts and plan->outputs the m + 1 rows from
// the last pending token on. Row j < m verifies draft j at sequence index tokens.size() + j
// (VerifyDraft's kAccept / kResample draws there), row m samples the bonus token at
// tokens.size() + m (kSample): exactly the host calls of VerifyDraftRun. Sets nothing without
// sampling settings or when the plan is not of that shape.
void PlanDeviceVerify(const DecodeState& state, StepPlan* plan);

// Output row j's verdict on `draft` at sequence index `index`: the model's token and accepted
// flag when the driver passed the plan's samples (PlanDeviceVerify), else VerifyDraft on the
// row's logits. Internal when `out` has neither.
absl::StatusOr<int32_t> VerifiedToken(const ExtendOutput& out, int j, int vocab, int32_t draft,
                                      const SamplingParams& sampling, uint64_t index,
                                      bool* accepted, std::vector<float>* scratch);

// The AR verify pass of a self-speculative cycle: the plan's extend is the pending tokens
// followed by m drafts, and output row j is the target's distribution at the j-th draft's
// index (row m: the token after the last draft). Verifies the drafts in order with
// VerifyDraft, keeps the pending tokens and the accepted drafts, appends the accepted drafts
// plus the correction at the first rejection or, all accepted, the bonus token from row m.
// `accepted_drafts` gets the number of drafts accepted. `drafted` / `accepted` are left for
// the mode, which counts its cycle. Reads the model's verdicts when the plan had them verified
// on the device (PlanDeviceVerify), the logits otherwise; Internal when `out` has neither.
absl::StatusOr<StepResult> VerifyDraftRun(const DecodeState& state, const StepPlan& plan,
                                          const ExtendOutput& out, int vocab_size,
                                          int* accepted_drafts, std::vector<float>* scratch);

// The draft-then-verify cycle of linear self-speculation (NLD §3.3), shared by `self_spec` and
// `nsp` with verification: a draft forward proposes d0, d1, .. and its AR row v0 (the
// prediction of the sequence's next position) checks d0 there; when d0 holds and drafts remain,
// a verify forward [v0 (pending) | d1..dm (causal)] accepts the longest prefix of d1..dm the AR
// pathway reproduces plus one more token. A cycle reports 1 + m drafts once, with d0 among the
// accepted when it held. The mode plans and reads its own draft forward; this class owns what
// lies between the two forwards.
class SelfSpecCycle {
 public:
  // Whether the next step is the cycle's verify step.
  bool verify_next() const { return verify_next_; }

  // The draft step's verdict: `ar` is the AR row at the sequence's next position (index
  // state.tokens.size()), `drafts` d0, d1, .. (not empty), `m` how many of d1.. the verify step
  // may check (the budget and context allow; 0 ≤ m < drafts.size()). Appends v0 to `result`;
  // arranges the verify step when d0 held and m > 0, else ends the cycle and reports it.
  void ConsumeDraft(const DecodeState& state, std::span<const float> ar,
                    std::vector<int32_t> drafts, int m, StepResult* result);
  // The verify step's plan (PlanDraftRun over d1..dm) and its consume, which ends the cycle.
  StepPlan PlanVerify(const DecodeState& state) const;
  absl::StatusOr<StepResult> ConsumeVerify(const DecodeState& state, const StepPlan& plan,
                                           const ExtendOutput& out, int vocab_size);

 private:
  bool verify_next_ = false;
  std::vector<int32_t> drafts_;  // d1..dm between the two steps
  int cycle_drafted_ = 0;        // 1 + m, reported once per cycle
  std::vector<float> probs_;     // scratch for VerifyDraft
};

}  // namespace tandem
