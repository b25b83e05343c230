// Speculative verification of one greedy (point-mass) draft token, shared by every mode that
// verifies drafts against the target's AR distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/decoding/decoding_mode.h"
#include "worker/sampling/sampling.h"

namespace tandem {

// Verifies `draft` as the token at sequence index `index` under the target logits `logits`:
// accepted with probability p(draft) (RngPurpose::kAccept at `index`), otherwise the returned
// token is drawn from p with the draft removed (kResample at `index`). With a point-mass draft
// distribution this is exactly speculative sampling's rule, so the output follows p. Greedy
// sampling reduces to "accept iff draft == argmax, else argmax". `scratch` is reused across
// calls to avoid a vocabulary-sized allocation per draft.
int32_t VerifyDraft(std::span<const float> logits, int32_t draft, const SamplingParams& sampling,
                    uint64_t index, bool* accepted, std::vector<float>* scratch);

// A masked diffusion slot's confidence: the top-1 probability of softmax(logits) over every token
// but `mask_token` (<|mask|> is never a prediction); that token goes to `*top` when not null.
float SlotConfidence(std::span<const float> logits, int32_t mask_token, int32_t* top = nullptr);

// The plan of that verify pass: the pending tokens followed by `drafts` at the next indices,
// causal, with outputs from the last pending token on (row j: the distribution at draft j).
StepPlan PlanDraftRun(const DecodeState& state, std::span<const int32_t> drafts);

// The AR verify pass of a self-speculative cycle: the plan's extend is the pending tokens
// followed by m drafts, and output row j is the target's distribution at the j-th draft's
// index (row m: the token after the last draft). Verifies the drafts in order with
// VerifyDraft, keeps the pending tokens and the accepted drafts, appends the accepted drafts
// plus the correction at the first rejection or, all accepted, the bonus token from row m.
// `accepted_drafts` gets the number of drafts accepted. `drafted` / `accepted` are left for
// the mode, which counts its cycle.
StepResult VerifyDraftRun(const DecodeState& state, const StepPlan& plan, const ExtendOutput& out,
                          int vocab_size, int* accepted_drafts, std::vector<float>* scratch);

}  // namespace tandem
