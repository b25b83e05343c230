#include "worker/decoding/verify.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

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
  PlanDeviceVerify(state, &plan);
  return plan;
}

void PlanDeviceVerify(const DecodeState& state, StepPlan* plan) {
  const int pending = state.pending();
  const int m = static_cast<int>(plan->tokens.size()) - pending;
  if (state.sampling == nullptr || m < 0 || plan->outputs.size() != static_cast<size_t>(m) + 1) {
    return;
  }
  const uint64_t length = state.tokens.size();
  plan->samples.clear();
  for (int j = 0; j <= m; ++j) {
    plan->samples.push_back(SampleRequest{.params = *state.sampling,
                                          .position = length + j,
                                          .draft = j < m ? plan->tokens[pending + j] : -1});
  }
  plan->return_logits = false;
}

absl::StatusOr<int32_t> VerifiedToken(const ExtendOutput& out, int j, int vocab, int32_t draft,
                                      const SamplingParams& sampling, uint64_t index,
                                      bool* accepted, std::vector<float>* scratch) {
  if (j < static_cast<int>(out.tokens.size()) && j < static_cast<int>(out.accepted.size())) {
    *accepted = out.accepted[j] != 0;
    return out.tokens[j];
  }
  if (vocab <= 0 || out.logits.size() < static_cast<size_t>(j + 1) * vocab) {
    return absl::InternalError(absl::StrCat("output row ", j, " has neither a verified token nor ",
                                            "logits (", out.logits.size(), " logits for a ",
                                            "vocabulary of ", vocab, ")"));
  }
  return VerifyDraft(LogitsRow(out, j, vocab), draft, sampling, index, accepted, scratch);
}

absl::StatusOr<StepResult> VerifyDraftRun(const DecodeState& state, const StepPlan& plan,
                                          const ExtendOutput& out, int vocab_size,
                                          int* accepted_drafts, std::vector<float>* scratch) {
  const int pending = state.pending();
  const int m = static_cast<int>(plan.tokens.size()) - pending;
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  int j = 0;
  for (; j < m; ++j) {
    bool accepted = false;
    absl::StatusOr<int32_t> token = VerifiedToken(out, j, vocab_size, plan.tokens[pending + j],
                                                  *state.sampling, length + j, &accepted, scratch);
    if (!token.ok()) return token.status();
    result.append.push_back(*token);
    if (!accepted) break;
    result.keep.push_back(pending + j);
  }
  if (j == m) {
    absl::StatusOr<int32_t> bonus = OutputToken(out, m, vocab_size, *state.sampling, length + m);
    if (!bonus.ok()) return bonus.status();
    result.append.push_back(*bonus);
  }
  *accepted_drafts = j;
  return result;
}

void SelfSpecCycle::ConsumeDraft(const DecodeState& state, std::span<const float> ar,
                                 std::vector<int32_t> drafts, int m, StepResult* result) {
  cycle_drafted_ = 1 + m;
  bool accepted = false;
  const uint64_t length = state.tokens.size();
  result->append.push_back(VerifyDraft(ar, drafts[0], *state.sampling, length, &accepted, &probs_));
  if (!accepted || m == 0) {
    result->drafted = cycle_drafted_;
    result->accepted = accepted ? 1 : 0;
    return;
  }
  drafts_.assign(drafts.begin() + 1, drafts.begin() + 1 + m);
  verify_next_ = true;
}

StepPlan SelfSpecCycle::PlanVerify(const DecodeState& state) const {
  return PlanDraftRun(state, drafts_);
}

absl::StatusOr<StepResult> SelfSpecCycle::ConsumeVerify(const DecodeState& state,
                                                        const StepPlan& plan,
                                                        const ExtendOutput& out, int vocab_size) {
  verify_next_ = false;
  int j = 0;
  absl::StatusOr<StepResult> result = VerifyDraftRun(state, plan, out, vocab_size, &j, &probs_);
  if (!result.ok()) return result.status();
  result->drafted = cycle_drafted_;
  result->accepted = 1 + j;  // d0 was accepted by the draft step
  return result;
}

}  // namespace tandem
