// Token sampling and the counter-based RNG that makes seeded runs reproducible whatever the
// batch and step structure: every random draw is keyed by (seed, token position, purpose).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // >= 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
};

// Why a random number is drawn; different purposes at the same position are independent.
enum class RngPurpose : uint32_t {
  kSample = 0,    // sampling the token at this position
  kAccept = 1,    // accepting a draft token at this position (p/q verification)
  kResample = 2,  // resampling from the residual after a rejection
  kDraft = 3,     // drawing a draft token
  kMask = 4,      // choosing positions to mask/unmask
};

// Uniform in [0, 1) from Philox4x32-10 keyed by the seed, counter = (position, purpose, stream).
double UniformRandom(uint64_t seed, uint64_t position, RngPurpose purpose, uint32_t stream = 0);

// OK when every setting is in range: temperature finite and >= 0, top_k >= 0, top_p and min_p
// in [0, 1] (NaN is out of range everywhere). InvalidArgument naming the field otherwise.
absl::Status CheckSamplingParams(const SamplingParams& params);

// Lowest index among ties; NaN counts as -inf; -1 for an empty span.
int32_t Argmax(std::span<const float> logits);

// The distribution sampling draws from: softmax(logits / T) restricted by top-k, top-p, min-p,
// renormalised. Greedy params give a point mass at Argmax. `probs` is resized to logits.size().
void SamplingDistribution(std::span<const float> logits, const SamplingParams& params,
                          std::vector<float>* probs);

// Inverse-CDF draw from `probs` (need not be normalised) with `u` in [0, 1). Never returns an
// entry that is not finite and positive; -1 when there is none.
int32_t SampleFromDistribution(std::span<const float> probs, double u);

// Samples the token at sequence position `position` (greedy params: Argmax).
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, uint64_t position,
                    RngPurpose purpose = RngPurpose::kSample);

// Verifies `draft` as the token at sequence index `index` under the target logits `logits`:
// accepted with probability p(draft) (RngPurpose::kAccept at `index`), otherwise the returned
// token is drawn from p with the draft removed (kResample at `index`). With a point-mass draft
// distribution this is exactly speculative sampling's rule, so the output follows p. Greedy
// sampling reduces to "accept iff draft == argmax, else argmax". `scratch` is reused across
// calls to avoid a vocabulary-sized allocation per draft.
int32_t VerifyDraft(std::span<const float> logits, int32_t draft, const SamplingParams& sampling,
                    uint64_t index, bool* accepted, std::vector<float>* scratch);

}  // namespace tandem
