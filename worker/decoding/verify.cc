#include "worker/decoding/verify.h"

#include <cmath>
#include <limits>

namespace tandem {

float SlotConfidence(std::span<const float> logits, int32_t mask_token, int32_t* top) {
  int32_t best = -1;
  float max = -std::numeric_limits<float>::infinity();
  for (int v = 0; v < static_cast<int>(logits.size()); ++v) {
    if (v != mask_token && (best < 0 || logits[v] > max)) {
      max = logits[v];
      best = v;
    }
  }
  double sum = 0;
  for (int v = 0; v < static_cast<int>(logits.size()); ++v) {
    if (v != mask_token) sum += std::exp(static_cast<double>(logits[v]) - max);
  }
  if (top != nullptr) *top = best;
  return sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
}

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

StepPlan PlanDraftRun(const DecodeState& state, std::span<const int32_t> drafts) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  const int length = static_cast<int>(state.tokens.size());
  for (size_t i = 0; i < drafts.size(); ++i) {
    plan.tokens.push_back(drafts[i]);
    plan.positions.push_back(length + static_cast<int>(i));
  }
  for (int i = pending - 1; i < static_cast<int>(plan.tokens.size()); ++i) {
    plan.outputs.push_back(i);
  }
  return plan;
}

StepResult VerifyDraftRun(const DecodeState& state, const StepPlan& plan, const ExtendOutput& out,
                          int vocab_size, int* accepted_drafts, std::vector<float>* scratch) {
  const int pending = state.pending();
  const int m = static_cast<int>(plan.tokens.size()) - pending;
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  int j = 0;
  for (; j < m; ++j) {
    bool accepted = false;
    const int32_t token = VerifyDraft(LogitsRow(out, j, vocab_size), plan.tokens[pending + j],
                                      *state.sampling, length + j, &accepted, scratch);
    result.append.push_back(token);
    if (!accepted) break;
    result.keep.push_back(pending + j);
  }
  if (j == m) {
    result.append.push_back(
        SampleToken(LogitsRow(out, m, vocab_size), *state.sampling, length + m));
  }
  *accepted_drafts = j;
  return result;
}

}  // namespace tandem
