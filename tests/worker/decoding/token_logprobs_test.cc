// StepLogprobs reads each gained token's log-probability from the row of its own context: on a
// verify pass the rows of the accepted drafts and of the correction, never a row that saw a
// rejected draft; a token no row computed in its context is an error, not a guess.
#include "worker/decoding/token_logprobs.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kVocab = 4;

float LogSoftmax(const std::vector<float>& row, int token) {
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x));
  return static_cast<float>(row[token] - std::log(sum));
}

TEST(StepLogprobsTest, AcceptedDraftsAndTheCorrectionReadTheirOwnRows) {
  // Sequence [0 1 2], pending 2; drafts 3 3; the first holds, the second is replaced by 1.
  const std::vector<int32_t> tokens = {0, 1, 2};
  const DecodeState state{.tokens = tokens, .prompt_len = 1, .kv_len = 2, .budget = 4};
  StepPlan plan;
  plan.tokens = {2, 3, 3};
  plan.positions = {2, 3, 4};
  plan.outputs = {0, 1, 2};
  ExtendOutput out;
  out.logits = {0, 1, 2, 3, /**/ 3, 2, 1, 0, /**/ 0, 0, 5, 0};
  const std::vector<int32_t> append = {3, 1};
  absl::StatusOr<std::vector<TokenLogprob>> logprobs =
      StepLogprobs(state, plan, out, kVocab, append, 2);
  ASSERT_TRUE(logprobs.ok()) << logprobs.status();
  ASSERT_EQ(logprobs->size(), 2u);
  EXPECT_EQ((*logprobs)[0].token, 3);
  EXPECT_NEAR((*logprobs)[0].logprob, LogSoftmax({0, 1, 2, 3}, 3), 1e-6);
  EXPECT_EQ((*logprobs)[0].top[0].first, 3);
  EXPECT_EQ((*logprobs)[0].top[1].first, 2);
  EXPECT_EQ((*logprobs)[1].token, 1);
  EXPECT_NEAR((*logprobs)[1].logprob, LogSoftmax({3, 2, 1, 0}, 1), 1e-6);
  EXPECT_EQ((*logprobs)[1].top[0].first, 0);
  EXPECT_NEAR((*logprobs)[1].top[0].second, LogSoftmax({3, 2, 1, 0}, 0), 1e-6);
}

TEST(StepLogprobsTest, ATokenWithoutARowOfItsContextIsAnError) {
  // A bidirectional block of two masks (9 is not a token here): the rows see the masks, so no
  // row holds the context of the tokens the block becomes.
  const std::vector<int32_t> tokens = {0, 1};
  const DecodeState state{.tokens = tokens, .prompt_len = 1, .kv_len = 1, .budget = 4};
  StepPlan plan;
  plan.tokens = {1, 9, 9};
  plan.positions = {1, 2, 3};
  plan.visible = Visibility::Full();
  plan.outputs = {1, 2};
  ExtendOutput out;
  out.logits.assign(2 * kVocab, 0.0f);
  const std::vector<int32_t> append = {2, 3};
  EXPECT_EQ(StepLogprobs(state, plan, out, kVocab, append, 0).status().code(),
            absl::StatusCode::kInternal);
  // Nor without logits.
  ExtendOutput none;
  plan.visible = Visibility::Causal();
  EXPECT_EQ(StepLogprobs(state, plan, none, kVocab, append, 0).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tandem
