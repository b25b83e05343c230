// Log-probabilities of the tokens a step gained, read from the step's own output rows: for each
// token, the row computed in exactly the token's context, i.e. the row of the token before it
// that attends to nothing but the sequence's final tokens up to there. In a lossless mode that
// is the target's AR distribution at the token's position, the very row that sampled or
// verified it, so every lossless mode reports what AR decoding would (never the drafter's
// distribution). The rows are those the mode consumed: after the request's logit adjustments,
// at temperature 1 and before top-k, top-p and min-p.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/sampling/logit_adjust.h"  // kMaxTopLogprobs

namespace tandem {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  bool has_logprob = true;  // false for a prompt's first token, which nothing predicts
  // The `top` most likely tokens of the same row, most likely first (ties: lower id first).
  std::vector<std::pair<int32_t, float>> top;
};

// `token`'s log-probability in `row` (log-softmax) with the row's `top` most likely tokens.
TokenLogprob RowLogprob(std::span<const float> row, int32_t token, int top);

// One entry per token of `append` (the tokens the step gained after state.tokens), with the
// `top` (0..kMaxTopLogprobs) most likely alternatives. Internal when a token has no row of its
// own context among the step's outputs (a lossy mode's token, or a plan without logits).
absl::StatusOr<std::vector<TokenLogprob>> StepLogprobs(const DecodeState& state,
                                                       const StepPlan& plan,
                                                       const ExtendOutput& out, int vocab_size,
                                                       std::span<const int32_t> append, int top);

}  // namespace tandem
