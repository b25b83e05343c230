// ArMode: plans exactly the pending tokens, keeps them all, gains one token per forward, and
// keys seeded sampling by the token's index in the sequence.
#include "worker/decoding/ar.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"

namespace tandem {
namespace {

constexpr int kVocab = 11;

std::vector<float> RandomLogits(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = dist(rng);
  return logits;
}

TEST(ArModeTest, PlansThePendingTokensAndKeepsThemAll) {
  ArMode mode(kVocab);
  const std::vector<int32_t> tokens = {4, 8, 1, 9, 2};
  SamplingParams greedy;
  const DecodeState state{
      .tokens = tokens, .prompt_len = 3, .kv_len = 2, .budget = 5, .sampling = &greedy};
  const StepPlan plan = mode.Plan(state);
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{1, 9, 2}));
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{2}));
  EXPECT_EQ(plan.visible.kind, Visibility::Kind::kCausal);

  ExtendOutput out;
  out.logits = RandomLogits(1);
  absl::StatusOr<StepResult> r = mode.Consume(state, plan, out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->keep, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r->append, (std::vector<int32_t>{Argmax(out.logits)}));
  EXPECT_EQ(r->drafted, 0);
  EXPECT_EQ(r->accepted, 0);
}

TEST(ArModeTest, SeededSamplingUsesTheSequenceIndexAsRngPosition) {
  ArMode mode(kVocab);
  SamplingParams hot;
  hot.temperature = 1.5f;
  hot.seed = 1234;
  int differs_from_neighbour = 0;
  for (int len = 1; len < 40; ++len) {
    std::vector<int32_t> tokens(len, 3);
    ExtendOutput out;
    out.logits = RandomLogits(7);  // the same logits at every length
    // Where the KV boundary lies (how the steps were cut) must not matter.
    for (int kv_len : {0, len - 1}) {
      const DecodeState state{.tokens = tokens, .kv_len = kv_len, .budget = 1, .sampling = &hot};
      const StepPlan plan = mode.Plan(state);
      absl::StatusOr<StepResult> r = mode.Consume(state, plan, out);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->append.size(), 1u);
      EXPECT_EQ(r->append[0], SampleToken(out.logits, hot, static_cast<uint64_t>(len)))
          << "length " << len;
    }
    differs_from_neighbour +=
        SampleToken(out.logits, hot, len) != SampleToken(out.logits, hot, len + 1);
  }
  // The position really changes the draw (else the check above would prove nothing).
  EXPECT_GT(differs_from_neighbour, 5);
}

TEST(ArModeTest, OneTokenPerForwardOnARealModel) {
  std::unique_ptr<Transformer> model = testing::TinyModel(testing::TinyArch::kQwen3, 3);
  ArMode mode(model->config().vocab_size);
  const std::vector<int32_t> prompt = {5, 17, 42, 8};
  RunOptions options;
  options.max_tokens = 20;
  absl::StatusOr<RunStats> run = testing::RunOnce(*model, mode, prompt, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->tokens.size(), 20u);
  EXPECT_EQ(run->forwards, 20);  // the prefill forward yields the first token
  EXPECT_EQ(run->drafted, 0);
  EXPECT_EQ(run->finish, FinishReason::kLength);
  EXPECT_DOUBLE_EQ(run->TokensPerForward(), 1.0);

  // Seeded sampling: the same seed reproduces, another seed differs.
  options.sampling.temperature = 1.0f;
  options.sampling.seed = 5;
  absl::StatusOr<RunStats> a = testing::RunOnce(*model, mode, prompt, options);
  absl::StatusOr<RunStats> b = testing::RunOnce(*model, mode, prompt, options);
  options.sampling.seed = 6;
  absl::StatusOr<RunStats> c = testing::RunOnce(*model, mode, prompt, options);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
}

}  // namespace
}  // namespace tandem
