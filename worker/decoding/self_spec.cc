#include "worker/decoding/self_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/decoding/verify.h"

namespace tandem {

absl::Status ValidateSelfSpecOptions(const SelfSpecOptions& options, int vocab_size) {
  if (options.draft_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("self_spec draft length must be >= 1, got ", options.draft_len));
  }
  if (options.mask_token < 0 || options.mask_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("self_spec mask token ", options.mask_token,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  return absl::OkStatus();
}

StepPlan SelfSpecMode::Plan(const DecodeState& state) {
  return cycle_.verify_next() ? cycle_.PlanVerify(state) : PlanDraft(state);
}

absl::StatusOr<StepResult> SelfSpecMode::Consume(const DecodeState& state, const StepPlan& plan,
                                                 const ExtendOutput& out) {
  if (state.pending() < 1) {
    return absl::InternalError("self_spec needs a pending token to predict from");
  }
  return cycle_.verify_next() ? cycle_.ConsumeVerify(state, plan, out, vocab_size_)
                              : ConsumeDraft(state, plan, out);
}

StepPlan SelfSpecMode::PlanDraft(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  const int length = static_cast<int>(state.tokens.size());
  // With one token of budget left (or no room in the context) drafting cannot pay: AR step.
  const int masks = state.budget < 2 ? 0 : std::min(options_.draft_len, max_positions_ - length);
  for (int i = 0; i < masks; ++i) {
    plan.tokens.push_back(options_.mask_token);
    plan.positions.push_back(length + i);
  }
  const int n = pending + masks;
  plan.visible = Visibility::Explicit(n);
  for (int i = 0; i < pending; ++i) {
    for (int j = 0; j <= i; ++j) plan.visible.Allow(i, j);
  }
  for (int i = pending; i < n; ++i) {
    for (int j = 0; j < n; ++j) plan.visible.Allow(i, j);
  }
  if (options_.lora_masks && masks > 0) {
    plan.lora_gate.assign(static_cast<size_t>(n), 0);
    std::fill(plan.lora_gate.begin() + pending, plan.lora_gate.end(), 1);
  }
  // Row 0: the AR prediction of position `length`; rows 1..: the drafts.
  for (int i = pending - 1; i < n; ++i) plan.outputs.push_back(i);
  return plan;
}

absl::StatusOr<StepResult> SelfSpecMode::ConsumeDraft(const DecodeState& state,
                                                      const StepPlan& plan,
                                                      const ExtendOutput& out) {
  const int pending = state.pending();
  const int masks = static_cast<int>(plan.tokens.size()) - pending;
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  const std::span<const float> ar = LogitsRow(out, 0, vocab_size_);
  if (masks == 0) {
    result.append.push_back(SampleToken(ar, *state.sampling, length));
    return result;
  }
  std::vector<int32_t> drafts;
  for (int i = 0; i < masks; ++i) drafts.push_back(Argmax(LogitsRow(out, 1 + i, vocab_size_)));
  // d1..dm: the drafts the verify forward can check without overrunning the budget (it appends
  // the accepted ones plus one more token after v0).
  const int m = std::min(masks - 1, state.budget - 2);
  cycle_.ConsumeDraft(state, ar, std::move(drafts), m, &result);
  return result;
}

}  // namespace tandem
