// nsp on random-weight models whose config is given a <|mask|> id and a block size: the
// longest-prefix rule (product of confidences, at least one token), the two confidence
// functions, the block layout against a from-scratch reference forward, the budget, stop and
// end-of-sequence boundaries, and option checking. The verified variant's exactness against AR
// is in exactness_test; the trained model's numbers in bundled_model_test.
#include "worker/decoding/nsp.h"

#include <cmath>
#include <memory>
#include <optional>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/modes.h"

namespace tandem {
namespace {

using testing::TinyArch;

constexpr int kBlock = 4;

TEST(LongestConfidentPrefix, KeepsTheLongestPrefixWhoseProductReachesTau) {
  const std::vector<float> c = {0.99f, 0.95f, 0.5f, 0.99f};
  EXPECT_EQ(LongestConfidentPrefix(c, 0.9f), 2);    // 0.99 * 0.95 = 0.9405; * 0.5 < 0.9
  EXPECT_EQ(LongestConfidentPrefix(c, 0.95f), 1);   // 0.9405 < 0.95
  EXPECT_EQ(LongestConfidentPrefix(c, 0.468f), 3);  // 0.4703 >= 0.468, then * 0.99 = 0.4656
  EXPECT_EQ(LongestConfidentPrefix(c, 0.0f), 4);
  // The product, not each token on its own: three tokens of 0.95 each clear 0.9 one by one.
  const std::vector<float> even = {0.95f, 0.95f, 0.95f};
  EXPECT_EQ(LongestConfidentPrefix(even, 0.9f), 2);  // 0.9025, then 0.857
  // A later confident token never extends a prefix that already fell below tau.
  const std::vector<float> dip = {0.5f, 1.0f, 1.0f};
  EXPECT_EQ(LongestConfidentPrefix(dip, 0.6f), 1);
}

TEST(LongestConfidentPrefix, AtLeastOneToken) {
  const std::vector<float> low = {0.01f, 0.9f};
  EXPECT_EQ(LongestConfidentPrefix(low, 0.5f), 1);
  EXPECT_EQ(LongestConfidentPrefix(low, 1.0f), 1);
  const std::vector<float> one = {1.0f};
  EXPECT_EQ(LongestConfidentPrefix(one, 1.0f), 1);
}

TEST(NspTokenConfidence, LogitIsTheSoftmaxProbabilityOfTheToken) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), -INFINITY};
  EXPECT_NEAR(NspTokenConfidence(logits, 1, NspConfidence::kLogit), 0.75f, 1e-6f);
  EXPECT_NEAR(NspTokenConfidence(logits, 0, NspConfidence::kLogit), 0.25f, 1e-6f);
}

TEST(NspTokenConfidence, EntropyIsOneMinusNormalisedEntropy) {
  const std::vector<float> uniform(8, 1.5f);
  EXPECT_NEAR(NspTokenConfidence(uniform, 3, NspConfidence::kEntropy), 0.0f, 1e-6f);
  std::vector<float> peaked(8, 0.0f);
  peaked[2] = 60.0f;
  EXPECT_NEAR(NspTokenConfidence(peaked, 2, NspConfidence::kEntropy), 1.0f, 1e-5f);
  // Two equally likely tokens of 4 (the others at -inf): H = log 2, |V| = 4 -> 1 - 1/2.
  const std::vector<float> two = {1.0f, 1.0f, -INFINITY, -INFINITY};
  EXPECT_NEAR(NspTokenConfidence(two, 0, NspConfidence::kEntropy), 0.5f, 1e-6f);
}

// Records every step's plan, logits and result around the mode under test.
class RecordingMode : public DecodingMode {
 public:
  struct Step {
    int pending = 0;
    std::vector<int32_t> tokens;  // the step's sequence before it
    StepPlan plan;
    std::vector<float> logits;
    std::vector<int32_t> append;
  };

  explicit RecordingMode(std::unique_ptr<DecodingMode> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  StepPlan Plan(const DecodeState& state) override { return inner_->Plan(state); }
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    absl::StatusOr<StepResult> r = inner_->Consume(state, plan, out);
    if (r.ok()) {
      steps.push_back({.pending = state.pending(),
                       .tokens = {state.tokens.begin(), state.tokens.end()},
                       .plan = plan,
                       .logits = out.logits,
                       .append = r->append});
    }
    return r;
  }

  std::vector<Step> steps;

 private:
  std::unique_ptr<DecodingMode> inner_;
};

struct Decode {
  RunStats stats;
  std::vector<RecordingMode::Step> steps;
};

NspOptions Options(const Transformer& model, float tau, bool verify = false) {
  return {.block_size = kBlock,
          .mask_token = model.config().vocab_size - 1,
          .tau = tau,
          .verify = verify};
}

Decode DecodeWith(Transformer& model, NspOptions options, std::span<const int32_t> prompt,
                  int max_tokens, std::optional<int32_t> stop = std::nullopt) {
  const ModelConfig& c = model.config();
  RecordingMode mode(
      std::make_unique<NspMode>(std::move(options), c.vocab_size, c.max_position_embeddings));
  RunOptions run;
  run.max_tokens = max_tokens;
  if (stop) run.on_token = [t = *stop](int32_t token) { return token == t; };
  absl::StatusOr<RunStats> stats = testing::RunOnce(model, mode, prompt, run);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return {stats.ok() ? *stats : RunStats{}, std::move(mode.steps)};
}

// The block's logits from scratch: the prefix x[0..T-1) causally into a fresh cache, then the
// noise block [x[T-1], <|mask|> x (D-1)] at positions T-1.. with full visibility among itself.
std::vector<float> ReferenceBlockLogits(Transformer& model, std::span<const int32_t> tokens,
                                        int block, int32_t mask) {
  const int t = static_cast<int>(tokens.size());
  KvCache kv(model.KvOptions(t + block + 16, 16));
  EXPECT_TRUE(kv.AddSequence(1).ok());
  if (t > 1) {
    std::vector<int32_t> positions(t - 1), keep(t - 1);
    for (int i = 0; i < t - 1; ++i) positions[i] = keep[i] = i;
    const std::vector<int32_t> outputs = {t - 2};
    EXPECT_TRUE(kv.Reserve(1, t - 1).has_value());
    Extend prefix{
        .seq = 1, .tokens = tokens.subspan(0, t - 1), .positions = positions, .outputs = outputs};
    EXPECT_TRUE(model.Forward({&prefix, 1}, kv).ok());
    EXPECT_TRUE(kv.Commit(1, keep).ok());
  }
  std::vector<int32_t> block_tokens(block, mask), positions(block), outputs(block);
  block_tokens[0] = tokens[t - 1];
  for (int i = 0; i < block; ++i) {
    positions[i] = t - 1 + i;
    outputs[i] = i;
  }
  EXPECT_TRUE(kv.Reserve(1, block).has_value());
  Extend ext{.seq = 1,
             .tokens = block_tokens,
             .positions = positions,
             .visible = Visibility::Full(),
             .outputs = outputs};
  absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&ext, 1}, kv);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0].logits : std::vector<float>();
}

class NspTest : public ::testing::TestWithParam<TinyArch> {
 protected:
  void SetUp() override {
    model_ = testing::TinyModel(GetParam(), 23);
    prompts_ = testing::TestPrompts(model_->config().vocab_size, 10, 6);
  }
  std::unique_ptr<Transformer> model_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(NspTest, BlockLogitsMatchAFromScratchForwardOfTheTrainedLayout) {
  const int vocab = model_->config().vocab_size;
  for (const std::vector<int32_t>& prompt : prompts_) {
    const Decode d = DecodeWith(*model_, Options(*model_, 0.5f), prompt, 12);
    ASSERT_FALSE(d.steps.empty());
    for (const RecordingMode::Step& s : d.steps) {
      const int t = static_cast<int>(s.tokens.size());
      // The plan: pending tokens at their positions, then the block at T-1 .. T+D-2.
      ASSERT_EQ(static_cast<int>(s.plan.tokens.size()), s.pending + kBlock);
      EXPECT_EQ(s.plan.tokens[s.pending], s.tokens.back());
      for (int i = 0; i < kBlock; ++i) {
        EXPECT_EQ(s.plan.positions[s.pending + i], t - 1 + i);
        if (i > 0) {
          EXPECT_EQ(s.plan.tokens[s.pending + i], vocab - 1);
        }
      }
      const std::vector<float> want = ReferenceBlockLogits(*model_, s.tokens, kBlock, vocab - 1);
      ASSERT_EQ(want.size(), s.logits.size());
      float worst = 0;
      for (size_t j = 0; j < want.size(); ++j) {
        worst = std::max(worst, std::abs(want[j] - s.logits[j]));
      }
      EXPECT_LT(worst, 1e-4f) << "sequence length " << t;
    }
  }
}

TEST_P(NspTest, EveryStepGainsOneToBlockTokensByTheProductRule) {
  const int vocab = model_->config().vocab_size;
  int64_t multi = 0;
  for (float tau : {0.9f, 0.5f, 0.1f}) {
    for (NspConfidence kind : {NspConfidence::kLogit, NspConfidence::kEntropy}) {
      for (const std::vector<int32_t>& prompt : prompts_) {
        NspOptions options = Options(*model_, tau);
        options.confidence = kind;
        const Decode d = DecodeWith(*model_, options, prompt, 40);
        EXPECT_EQ(d.stats.tokens.size(), 40u);
        EXPECT_EQ(d.stats.forwards, static_cast<int>(d.steps.size()));
        for (const RecordingMode::Step& s : d.steps) {
          ASSERT_GE(s.append.size(), 1u);
          ASSERT_LE(s.append.size(), static_cast<size_t>(kBlock));
          // Recompute the rule from the step's logits: greedy tokens, their confidences.
          std::vector<float> conf;
          for (int k = 0; k < kBlock; ++k) {
            std::vector<float> row(s.logits.begin() + k * vocab,
                                   s.logits.begin() + (k + 1) * vocab);
            row[vocab - 1] = -INFINITY;
            const int32_t token = Argmax(row);
            if (k < static_cast<int>(s.append.size())) {
              EXPECT_EQ(s.append[k], token);
            }
            conf.push_back(NspTokenConfidence(row, token, kind));
          }
          const int want = LongestConfidentPrefix(conf, tau);
          // The budget cuts the last step.
          if (&s != &d.steps.back()) {
            EXPECT_EQ(static_cast<int>(s.append.size()), want);
          }
          if (s.append.size() > 1) ++multi;
        }
      }
    }
  }
  EXPECT_GT(multi, 0) << "no step ever kept more than one token";
}

TEST_P(NspTest, TauExtremes) {
  for (const std::vector<int32_t>& prompt : prompts_) {
    // tau = 0: the whole block every step; the budget cuts the last.
    const Decode all = DecodeWith(*model_, Options(*model_, 0.0f), prompt, 5 * kBlock + 1);
    EXPECT_EQ(all.stats.tokens.size(), 5u * kBlock + 1);
    EXPECT_EQ(all.stats.forwards, 6);
    // tau = 1: a random model is never that sure: one token per forward.
    const Decode one = DecodeWith(*model_, Options(*model_, 1.0f), prompt, 9);
    EXPECT_EQ(one.stats.tokens.size(), 9u);
    EXPECT_EQ(one.stats.forwards, 9);
  }
}

TEST_P(NspTest, MaxTokensAndStopBoundaries) {
  for (const std::vector<int32_t>& prompt : prompts_) {
    const Decode plain = DecodeWith(*model_, Options(*model_, 0.0f), prompt, 24);
    for (int limit : {1, 2, kBlock - 1, kBlock, kBlock + 1, 2 * kBlock + 1}) {
      const Decode cut = DecodeWith(*model_, Options(*model_, 0.0f), prompt, limit);
      EXPECT_EQ(cut.stats.finish, FinishReason::kLength);
      EXPECT_EQ(cut.stats.tokens, std::vector<int32_t>(plain.stats.tokens.begin(),
                                                       plain.stats.tokens.begin() + limit));
    }
    // A stop token in the middle of a block: the runner ends the sequence right there.
    const size_t at = kBlock + 1;
    const Decode stopped =
        DecodeWith(*model_, Options(*model_, 0.0f), prompt, 24, plain.stats.tokens[at]);
    EXPECT_EQ(stopped.stats.finish, FinishReason::kStop);
    const auto first =
        std::find(plain.stats.tokens.begin(), plain.stats.tokens.end(), plain.stats.tokens[at]);
    EXPECT_EQ(stopped.stats.tokens, std::vector<int32_t>(plain.stats.tokens.begin(), first + 1));
  }
}

TEST_P(NspTest, EndOfSequenceEndsTheStepsTokens) {
  int truncated = 0;
  for (const std::vector<int32_t>& prompt : prompts_) {
    const Decode plain = DecodeWith(*model_, Options(*model_, 0.0f), prompt, 6 * kBlock);
    // A token that first appears inside a block, not at its last slot.
    std::optional<size_t> at;
    for (size_t i = 0; i < plain.stats.tokens.size() && !at; ++i) {
      const int32_t t = plain.stats.tokens[i];
      if (i % kBlock != kBlock - 1 &&
          std::find(plain.stats.tokens.begin(), plain.stats.tokens.begin() + i, t) ==
              plain.stats.tokens.begin() + i) {
        at = i;
      }
    }
    if (!at) continue;
    NspOptions options = Options(*model_, 0.0f);
    options.eos_tokens = {plain.stats.tokens[*at]};
    const Decode cut = DecodeWith(*model_, options, prompt, 6 * kBlock);
    size_t seen = 0;
    for (const RecordingMode::Step& s : cut.steps) {
      if (seen <= *at && *at < seen + s.append.size()) {
        EXPECT_EQ(s.append.back(), plain.stats.tokens[*at]);
        EXPECT_EQ(seen + s.append.size(), *at + 1);
      }
      seen += s.append.size();
    }
    // Up to the end-of-sequence token the output is the plain decode's.
    EXPECT_EQ(
        std::vector<int32_t>(cut.stats.tokens.begin(), cut.stats.tokens.begin() + *at + 1),
        std::vector<int32_t>(plain.stats.tokens.begin(), plain.stats.tokens.begin() + *at + 1));
    ++truncated;
  }
  EXPECT_GT(truncated, 0);
}

TEST_P(NspTest, VerifiedVariantIsLosslessTheOtherIsNot) {
  const ModelConfig& c = model_->config();
  EXPECT_TRUE(NspMode(Options(*model_, 0.9f, true), c.vocab_size, 128).lossless());
  EXPECT_FALSE(NspMode(Options(*model_, 0.9f, false), c.vocab_size, 128).lossless());
}

TEST_P(NspTest, SamplingIsSeeded) {
  const SamplingParams sampling{.temperature = 1.0f, .seed = 42};
  for (bool verify : {false, true}) {
    const ModelConfig& c = model_->config();
    std::vector<int32_t> first;
    for (int run = 0; run < 2; ++run) {
      NspMode mode(Options(*model_, 0.5f, verify), c.vocab_size, c.max_position_embeddings);
      RunOptions options;
      options.max_tokens = 20;
      options.sampling = sampling;
      absl::StatusOr<RunStats> stats = testing::RunOnce(*model_, mode, prompts_[1], options);
      ASSERT_TRUE(stats.ok()) << stats.status();
      EXPECT_EQ(stats->tokens.size(), 20u);
      if (!verify) {  // <|mask|> is never a prediction of the block pathway
        for (int32_t t : stats->tokens) EXPECT_NE(t, c.vocab_size - 1);
      }
      if (run == 0) first = stats->tokens;
      if (run == 1) {
        EXPECT_EQ(stats->tokens, first);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, NspTest, ::testing::Values(TinyArch::kQwen2, TinyArch::kQwen3),
                         [](const ::testing::TestParamInfo<TinyArch>& info) {
                           return info.param == TinyArch::kQwen2 ? "qwen2" : "qwen3";
                         });

TEST(NspCreateMode, ChecksTheModelAndOptions) {
  ModelConfig config = testing::TinyConfig(TinyArch::kQwen3);
  ModeOptions options;
  EXPECT_EQ(CreateMode("nsp", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no <|mask|>
  config.diffusion.mask_token_id = config.vocab_size - 1;
  EXPECT_EQ(CreateMode("nsp", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);  // no block size
  config.diffusion.block_size = kBlock;
  absl::StatusOr<std::unique_ptr<DecodingMode>> lossy =
      CreateMode("nsp", options, config, SamplingParams{});
  ASSERT_TRUE(lossy.ok()) << lossy.status();
  EXPECT_FALSE((*lossy)->lossless());
  options.nsp_verify = true;
  absl::StatusOr<std::unique_ptr<DecodingMode>> verified =
      CreateMode("nsp", options, config, SamplingParams{});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE((*verified)->lossless());
  options.nsp_confidence = "margin";
  EXPECT_EQ(CreateMode("nsp", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.nsp_confidence = "entropy";
  options.nsp_tau = 1.5f;
  EXPECT_EQ(CreateMode("nsp", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
