#include "worker/decoding/verify.h"

namespace tandem {

int32_t VerifyDraft(std::span<const float> logits, int32_t draft, const SamplingParams& sampling,
                    uint64_t index, bool* accepted, std::vector<float>* scratch) {
  if (sampling.greedy()) {
    const int32_t best = Argmax(logits);
    *accepted = best == draft;
    return best;
  }
  std::vector<float>& probs = *scratch;
  SamplingDistribution(logits, sampling, &probs);
  double total = 0;
  for (const float p : probs) total += p;
  const double p_draft = total > 0 ? probs[draft] / total : 0.0;
  *accepted = UniformRandom(sampling.seed, index, RngPurpose::kAccept) < p_draft;
  if (*accepted) return draft;
  probs[draft] = 0.0f;
  const int32_t token =
      SampleFromDistribution(probs, UniformRandom(sampling.seed, index, RngPurpose::kResample));
  // Only a degenerate p (all its mass on the draft, which would have been accepted) leaves
  // nothing to resample; the draft is then the token.
  return token >= 0 ? token : draft;
}

}  // namespace tandem
