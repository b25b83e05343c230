// AdjustStepLogits gives each output row the context it was computed in: on a verify pass
// (causal drafts past the sequence), a block of masks (block-causal), an explicit tree of two
// branches and a row inside the sequence's own pending tokens, every row equals the definitions
// applied to that row's context alone.
#include "worker/decoding/logit_adjust_step.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/sampling/logit_adjust_reference.h"

namespace tandem {
namespace {

constexpr int kVocab = 16;

LogitAdjust Everything() {
  LogitAdjust a;
  a.presence_penalty = 0.5f;
  a.frequency_penalty = 0.25f;
  a.repetition_penalty = 1.5f;
  a.logit_bias = {{3, 1.0f}};
  a.min_tokens = 4;
  a.min_tokens_ban = {0};
  return a;
}

struct Case {
  std::vector<int32_t> tokens;  // the sequence: prompt then generated
  int prompt_len = 0;
  StepPlan plan;
  // Per output row: the generated tokens of its context, in order.
  std::vector<std::vector<int32_t>> contexts;
};

void Check(const Case& c) {
  std::mt19937 rng(3);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  ExtendOutput out;
  out.logits.resize(c.plan.outputs.size() * kVocab);
  for (float& x : out.logits) x = logit(rng);
  const std::vector<float> raw = out.logits;
  const DecodeState state{.tokens = c.tokens,
                          .prompt_len = c.prompt_len,
                          .kv_len = static_cast<int>(c.tokens.size()) - 1,
                          .budget = 8};
  TokenHistory history;
  ASSERT_TRUE(AdjustStepLogits(Everything(), state, c.plan, kVocab, &history, nullptr, &out).ok());
  const std::vector<int32_t> prompt(c.tokens.begin(), c.tokens.begin() + c.prompt_len);
  for (size_t r = 0; r < c.plan.outputs.size(); ++r) {
    const std::vector<float> expected = testing::ReferenceAdjust(
        Everything(), std::vector<float>(raw.begin() + r * kVocab, raw.begin() + (r + 1) * kVocab),
        prompt, c.contexts[r]);
    for (int t = 0; t < kVocab; ++t) {
      EXPECT_FLOAT_EQ(out.logits[r * kVocab + t], expected[t]) << "row " << r << " token " << t;
    }
  }
}

TEST(AdjustStepLogitsTest, VerifyRowsSeeTheDraftsBeforeThem) {
  // Prompt [1 2 3], generated [4 5 4]; drafts 5 6 5 after the pending token 4.
  Case c{.tokens = {1, 2, 3, 4, 5, 4}, .prompt_len = 3};
  c.plan.tokens = {4, 5, 6, 5};
  c.plan.positions = {5, 6, 7, 8};
  c.plan.outputs = {0, 1, 2, 3};
  c.contexts = {{4, 5, 4}, {4, 5, 4, 5}, {4, 5, 4, 5, 6}, {4, 5, 4, 5, 6, 5}};
  Check(c);
}

TEST(AdjustStepLogitsTest, MaskRowsOfABlockSeeOnlyWhatPrecedesThem) {
  // A block of three masks (15) after the pending token, block-causal: every row sees the
  // whole block, but only the tokens at or before its own position are its context.
  Case c{.tokens = {1, 2, 7}, .prompt_len = 2};
  c.plan.tokens = {7, 15, 15, 15};
  c.plan.positions = {2, 3, 4, 5};
  c.plan.visible = Visibility::Explicit(4);
  c.plan.visible.Allow(0, 0);
  for (int i = 1; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) c.plan.visible.Allow(i, j);
  }
  c.plan.outputs = {0, 1, 3};
  c.contexts = {{7}, {7, 15}, {7, 15, 15, 15}};
  Check(c);
}

TEST(AdjustStepLogitsTest, BranchesOfATreeDoNotSeeEachOther) {
  // Two branches at the same positions: [8 9] and [9 9].
  Case c{.tokens = {1, 6}, .prompt_len = 1};
  c.plan.tokens = {6, 8, 9, 9, 9};
  c.plan.positions = {1, 2, 3, 2, 3};
  c.plan.visible = Visibility::Explicit(5);
  for (int i = 0; i < 5; ++i) c.plan.visible.Allow(i, 0);
  c.plan.visible.Allow(1, 1);
  c.plan.visible.Allow(2, 1);
  c.plan.visible.Allow(2, 2);
  c.plan.visible.Allow(3, 3);
  c.plan.visible.Allow(4, 3);
  c.plan.visible.Allow(4, 4);
  c.plan.outputs = {0, 2, 3, 4};
  c.contexts = {{6}, {6, 8, 9}, {6, 9}, {6, 9, 9}};
  Check(c);
}

TEST(AdjustStepLogitsTest, ARowInsideThePendingTokensDropsTheTokensAfterIt) {
  // Pending [5 6 5] (a rebuilt sequence, say), outputs at each of them.
  Case c{.tokens = {1, 2, 5, 6, 5}, .prompt_len = 2};
  c.plan.tokens = {5, 6, 5};
  c.plan.positions = {2, 3, 4};
  c.plan.outputs = {0, 1, 2};
  c.contexts = {{5}, {5, 6}, {5, 6, 5}};
  Check(c);
}

TEST(AdjustStepLogitsTest, AStepWithoutLogitsIsAnInternalError) {
  StepPlan plan;
  plan.tokens = {1};
  plan.positions = {1};
  plan.outputs = {0};
  const std::vector<int32_t> tokens = {1, 1};
  const DecodeState state{.tokens = tokens, .prompt_len = 1, .kv_len = 1, .budget = 1};
  ExtendOutput out;
  out.tokens = {2};
  TokenHistory history;
  EXPECT_EQ(AdjustStepLogits(Everything(), state, plan, kVocab, &history, nullptr, &out).code(),
            absl::StatusCode::kInternal);
}

TEST(AdjustStepLogitsTest, ReturnLogitsDropsDeviceSamples) {
  StepPlan plan;
  plan.samples.resize(2);
  plan.return_logits = false;
  ReturnLogits(&plan);
  EXPECT_TRUE(plan.samples.empty());
  EXPECT_TRUE(plan.return_logits);
}

}  // namespace
}  // namespace tandem
