// A request's logit adjustments (worker/sampling/logit_adjust.h) applied to a mode's step, so
// that every mode samples and verifies against the adjusted distribution. Each output row is
// adjusted for the context it was computed in: the sequence's tokens up to the row's position
// and the plan's tokens past the sequence that the row attends to (a verify pass's drafts on
// its path). A verify row whose drafts all hold therefore sees exactly the context the AR
// decode would have had at that position, and a lossless mode stays exact.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/logit_adjust.h"

namespace tandem {

// Makes `plan` return its output rows' logits instead of tokens sampled on the model's device:
// an adjusted sequence samples on the host, from the adjusted rows.
void ReturnLogits(StepPlan* plan);

// Adjusts `out`'s logits, row by row, for a step of `state` planned as `plan`; `history` is
// brought up to the state's tokens. `grammar` (null without structured output) first masks
// each row to what the grammar allows after the row's generated context; a row whose context
// the grammar refuses (a path past a draft that a grammar-masked row rejects) is not masked, as
// no accepted path reaches it. Internal when `out` lacks logits for the plan's outputs.
// A sequence's grammar as a mode's TokenConstraint: `tokens` is the sequence's token vector (its
// prompt's `prompt_len` tokens first), read at each call; both must outlive the constraint.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(GrammarCursor* cursor, const std::vector<int32_t>* tokens, int prompt_len)
      : cursor_(cursor), tokens_(tokens), prompt_len_(prompt_len) {}

  bool MaskAfter(std::span<const int32_t> then, std::span<float> row) override;
  // Whether the grammar accepts `then` after the sequence's generated tokens.
  bool Accepts(std::span<const int32_t> then);

 private:
  GrammarCursor* cursor_;
  const std::vector<int32_t>* tokens_;
  int prompt_len_;
};

absl::Status AdjustStepLogits(const LogitAdjust& adjust, const DecodeState& state,
                              const StepPlan& plan, int vocab_size, TokenHistory* history,
                              GrammarCursor* grammar, ExtendOutput* out);

}  // namespace tandem
