// Speculative verification of one greedy (point-mass) draft token, shared by every mode that
// verifies drafts against the target's AR distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

}  // namespace tandem
