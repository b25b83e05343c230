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

TEST(ArModeTest, PlansADeviceSampleAndTakesTheModelsToken) {
  ArMode mode(kVocab);
  const std::vector<int32_t> tokens = {4, 8, 1};
  SamplingParams hot{.temperature = 0.7f, .top_k = 4, .seed = 9};
  const DecodeState state{.tokens = tokens, .kv_len = 2, .budget = 3, .sampling = &hot};
  const StepPlan plan = mode.Plan(state);
  // Exactly the host sampler's arguments for the token at index 3.
  ASSERT_EQ(plan.samples.size(), 1u);
  EXPECT_EQ(plan.samples[0].position, 3u);
  EXPECT_EQ(plan.samples[0].purpose, RngPurpose::kSample);
  EXPECT_EQ(plan.samples[0].params.temperature, hot.temperature);
  EXPECT_EQ(plan.samples[0].params.top_k, hot.top_k);
  EXPECT_EQ(plan.samples[0].params.seed, hot.seed);
  EXPECT_FALSE(plan.return_logits);

  ExtendOutput sampled;
  sampled.tokens = {7};
  absl::StatusOr<StepResult> r = mode.Consume(state, plan, sampled);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->append, (std::vector<int32_t>{7}));
  // A driver that ignored the samples returned logits: the host sampler decides.
  ExtendOutput logits;
  logits.logits = RandomLogits(3);
  r = mode.Consume(state, plan, logits);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->append, (std::vector<int32_t>{SampleToken(logits.logits, hot, 3)}));
  EXPECT_EQ(mode.Consume(state, plan, ExtendOutput{}).status().code(), absl::StatusCode::kInternal);
}

// The model's sampled tokens (what ar now asks for) give the run a host loop gets by sampling
// the returned logits itself, greedy and seeded.
TEST(ArModeTest, ModelSampledRunEqualsHostSampledRun) {
  std::unique_ptr<Transformer> model = testing::TinyModel(testing::TinyArch::kQwen2, 4);
  const std::vector<int32_t> prompt = {9, 3, 27, 3, 50};
  for (const SamplingParams& params :
       {SamplingParams{}, SamplingParams{.temperature = 1.3f, .seed = 17},
        SamplingParams{.temperature = 0.9f, .top_k = 8, .top_p = 0.9f, .seed = 5}}) {
    SCOPED_TRACE(params.temperature);
    ArMode mode(model->config().vocab_size);
    RunOptions options;
    options.max_tokens = 24;
    options.sampling = params;
    absl::StatusOr<RunStats> got = testing::RunOnce(*model, mode, prompt, options);
    ASSERT_TRUE(got.ok()) << got.status();

    KvCache kv(model->KvOptions(256, 16));
    ASSERT_TRUE(kv.AddSequence(1).ok());
    std::vector<int32_t> seq = prompt;
    std::vector<int32_t> want;
    int kv_len = 0;
    while (want.size() < 24) {
      std::vector<int32_t> tokens(seq.begin() + kv_len, seq.end()), positions;
      for (int i = kv_len; i < static_cast<int>(seq.size()); ++i) positions.push_back(i);
      const std::vector<int32_t> outputs = {static_cast<int32_t>(tokens.size()) - 1};
      ASSERT_TRUE(kv.Reserve(1, static_cast<int>(tokens.size())).has_value());
      Extend e{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
      auto out = model->Forward({&e, 1}, kv);
      ASSERT_TRUE(out.ok()) << out.status();
      std::vector<int32_t> keep(tokens.size());
      for (size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<int32_t>(i);
      ASSERT_TRUE(kv.Commit(1, keep).ok());
      kv_len = static_cast<int>(seq.size());
      const int32_t next = SampleToken((*out)[0].logits, params, seq.size());
      seq.push_back(next);
      want.push_back(next);
    }
    EXPECT_EQ(got->tokens, want);
  }
}

}  // namespace
}  // namespace tandem
