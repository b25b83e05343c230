#include "worker/decoding/logit_adjust_step.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {

void ReturnLogits(StepPlan* plan) {
  plan->samples.clear();
  plan->return_logits = true;
}

bool GrammarConstraint::Accepts(std::span<const int32_t> then) {
  const std::span<const int32_t> generated =
      std::span<const int32_t>(*tokens_).subspan(static_cast<size_t>(prompt_len_));
  return cursor_->MoveTo(generated, then);
}

bool GrammarConstraint::MaskAfter(std::span<const int32_t> then, std::span<float> row) {
  if (!Accepts(then)) return false;
  cursor_->Mask(row);
  return true;
}

absl::Status AdjustStepLogits(const LogitAdjust& adjust, const DecodeState& state,
                              const StepPlan& plan, int vocab_size, TokenHistory* history,
                              GrammarCursor* grammar, ExtendOutput* out) {
  const size_t rows = plan.outputs.size();
  if (out->logits.size() != rows * static_cast<size_t>(vocab_size)) {
    return absl::InternalError(absl::StrCat("the step has ", out->logits.size(), " logits for ",
                                            rows, " output rows of ", vocab_size,
                                            " (a plan with logit adjustments must return logits)"));
  }
  history->Sync(state.tokens, state.prompt_len);
  const int length = static_cast<int>(state.tokens.size());
  // Plan tokens past the sequence: drafts, guesses or masks some rows may attend to.
  std::vector<int> beyond;
  for (size_t j = 0; j < plan.tokens.size(); ++j) {
    if (plan.positions[j] >= length) beyond.push_back(static_cast<int>(j));
  }
  std::vector<int32_t> added;
  for (size_t r = 0; r < rows; ++r) {
    const int i = plan.outputs[r];
    const int position = plan.positions[static_cast<size_t>(i)];
    added.clear();
    for (int j : beyond) {
      if (plan.positions[static_cast<size_t>(j)] <= position && plan.visible.Sees(i, j)) {
        added.push_back(plan.tokens[static_cast<size_t>(j)]);
      }
    }
    // Generated tokens the sequence holds past the row's position are not its context.
    const int cut = std::clamp(position + 1, state.prompt_len, length);
    const std::span<const int32_t> removed = state.tokens.subspan(static_cast<size_t>(cut));
    std::span<float> row(out->logits.data() + r * static_cast<size_t>(vocab_size),
                         static_cast<size_t>(vocab_size));
    // A prompt row (echo) predicts a prompt token, not the completion: no grammar applies.
    if (grammar != nullptr && position + 1 >= state.prompt_len) {
      const std::span<const int32_t> generated = state.tokens.subspan(
          static_cast<size_t>(state.prompt_len), static_cast<size_t>(cut - state.prompt_len));
      if (grammar->MoveTo(generated, added)) grammar->Mask(row);
    }
    AdjustLogits(adjust, *history, added, removed, std::max(0, position + 1 - state.prompt_len),
                 row);
  }
  return absl::OkStatus();
}

}  // namespace tandem
