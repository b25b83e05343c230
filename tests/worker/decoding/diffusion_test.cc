// diffusion on a random-weight model whose config is given a <|mask|> id and a block size: the
// mechanics of block denoising (every block fully unmasked, progress every forward, at most
// block_size forwards a block), the fused KV refresh against a separate refresh forward, the
// threshold extremes and end-of-sequence truncation. The model is untrained, so its tokens
// mean nothing; the bundled-model test compares real decodes with the Python reference.
#include "worker/decoding/diffusion.h"

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

// Records every step's plan, logits and result around the mode under test.
class RecordingMode : public DecodingMode {
 public:
  struct Step {
    int pending = 0;
    int masked = 0;  // masked slots planned (rows of logits)
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
                       .masked = static_cast<int>(plan.outputs.size()),
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

Decode DecodeWith(Transformer& model, DiffusionOptions options, std::span<const int32_t> prompt,
                  int max_tokens, std::optional<int32_t> stop = std::nullopt) {
  const ModelConfig& c = model.config();
  RecordingMode mode(
      std::make_unique<DiffusionMode>(std::move(options), c.vocab_size, c.max_position_embeddings));
  RunOptions run;
  run.max_tokens = max_tokens;
  if (stop) run.on_token = [t = *stop](int32_t token) { return token == t; };
  absl::StatusOr<RunStats> stats = testing::RunOnce(model, mode, prompt, run);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return {stats.ok() ? *stats : RunStats{}, std::move(mode.steps)};
}

DiffusionOptions Options(const Transformer& model, float threshold, int block = kBlock) {
  return {.block_size = block, .mask_token = model.config().vocab_size - 1, .threshold = threshold};
}

class DiffusionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::TinyModel(TinyArch::kQwen3, 21);
    prompts_ = testing::TestPrompts(model_->config().vocab_size, 10, 5);
  }
  std::unique_ptr<Transformer> model_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(DiffusionTest, EveryBlockIsFullyUnmaskedWithProgressEveryForward) {
  int64_t multi_commit_steps = 0;
  for (float threshold : {0.9f, 0.5f, 0.2f, 1.0f}) {
    for (const std::vector<int32_t>& prompt : prompts_) {
      const Decode d = DecodeWith(*model_, Options(*model_, threshold), prompt, 6 * kBlock);
      ASSERT_EQ(d.stats.tokens.size(), 6u * kBlock);
      int forwards_in_block = 0;
      int prev_masked = kBlock + 1;
      int blocks = 0;
      for (const RecordingMode::Step& s : d.steps) {
        ++forwards_in_block;
        // Each forward plans strictly fewer masked slots than the previous one of its block.
        EXPECT_LT(s.masked, prev_masked);
        EXPECT_GE(s.masked, 1);
        if (s.masked < prev_masked - 1 && prev_masked <= kBlock) ++multi_commit_steps;
        prev_masked = s.masked;
        if (!s.append.empty()) {
          // A finished block: every slot holds a real token, after <= kBlock forwards.
          ++blocks;
          EXPECT_EQ(s.append.size(), static_cast<size_t>(kBlock));
          for (int32_t t : s.append) EXPECT_NE(t, model_->config().vocab_size - 1);
          EXPECT_LE(forwards_in_block, kBlock);
          forwards_in_block = 0;
          prev_masked = kBlock + 1;
        }
      }
      EXPECT_EQ(blocks, 6);
      EXPECT_EQ(forwards_in_block, 0);
      // Prefill and every refresh ride on a denoising forward: no other forwards.
      EXPECT_EQ(d.stats.forwards, static_cast<int>(d.steps.size()));
    }
  }
  EXPECT_GT(multi_commit_steps, 0) << "no forward ever unmasked more than one slot";
}

TEST_F(DiffusionTest, FusedRefreshGivesTheLogitsOfASeparateRefreshForward) {
  for (float threshold : {0.9f, 0.3f}) {
    for (const std::vector<int32_t>& prompt : prompts_) {
      DiffusionOptions unfused = Options(*model_, threshold);
      unfused.fused_refresh = false;
      const Decode fused = DecodeWith(*model_, Options(*model_, threshold), prompt, 5 * kBlock);
      const Decode separate = DecodeWith(*model_, unfused, prompt, 5 * kBlock);
      EXPECT_EQ(fused.stats.tokens, separate.stats.tokens);
      // The reference spends one forward per block on its refresh (the prompt's prefill too).
      EXPECT_EQ(separate.stats.forwards, fused.stats.forwards + 5);
      std::vector<const RecordingMode::Step*> denoise;
      for (const RecordingMode::Step& s : separate.steps) {
        if (s.masked > 0) denoise.push_back(&s);
      }
      ASSERT_EQ(denoise.size(), fused.steps.size());
      for (size_t i = 0; i < denoise.size(); ++i) {
        EXPECT_EQ(denoise[i]->pending, 0) << "the reference refreshed in its own forward";
        ASSERT_EQ(denoise[i]->logits.size(), fused.steps[i].logits.size());
        float worst = 0;
        for (size_t j = 0; j < denoise[i]->logits.size(); ++j) {
          worst = std::max(worst, std::abs(denoise[i]->logits[j] - fused.steps[i].logits[j]));
        }
        EXPECT_LT(worst, 1e-4f) << "step " << i;
      }
    }
  }
}

TEST_F(DiffusionTest, ThresholdZeroCommitsAWholeBlockPerForward) {
  for (const std::vector<int32_t>& prompt : prompts_) {
    const Decode d = DecodeWith(*model_, Options(*model_, 0.0f), prompt, 5 * kBlock + 1);
    EXPECT_EQ(d.stats.tokens.size(), 5u * kBlock + 1);
    EXPECT_EQ(d.stats.forwards, 6);  // the last block is cut to the budget
    for (const RecordingMode::Step& s : d.steps) EXPECT_EQ(s.masked, kBlock);
  }
}

TEST_F(DiffusionTest, EndOfSequenceTruncatesItsBlock) {
  int truncated = 0;
  for (const std::vector<int32_t>& prompt : prompts_) {
    const Decode plain = DecodeWith(*model_, Options(*model_, 0.5f), prompt, 6 * kBlock);
    // An end-of-sequence id that first appears inside a block, not at its last slot.
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
    const int32_t eos = plain.stats.tokens[*at];
    DiffusionOptions options = Options(*model_, 0.5f);
    options.eos_tokens = {eos};
    // Without a stop callback the sequence goes on past the end-of-sequence token: its block
    // was cut right after it and the next block starts there.
    const Decode cut = DecodeWith(*model_, options, prompt, 6 * kBlock);
    size_t seen = 0;
    for (const RecordingMode::Step& s : cut.steps) {
      if (seen <= *at && *at < seen + s.append.size()) {
        EXPECT_EQ(s.append.back(), eos);
        EXPECT_EQ(seen + s.append.size(), *at + 1);
        EXPECT_LT(s.append.size(), static_cast<size_t>(kBlock));
      }
      seen += s.append.size();
    }
    // With the runner stopping at it, the output is the plain decode up to it.
    const Decode stopped = DecodeWith(*model_, options, prompt, 6 * kBlock, eos);
    EXPECT_EQ(stopped.stats.finish, FinishReason::kStop);
    EXPECT_EQ(stopped.stats.tokens, std::vector<int32_t>(plain.stats.tokens.begin(),
                                                         plain.stats.tokens.begin() + *at + 1));
    ++truncated;
  }
  EXPECT_GT(truncated, 0);
}

TEST_F(DiffusionTest, SamplingIsSeededAndUnmasksEveryBlock) {
  SamplingParams sampling{.temperature = 1.0f, .seed = 42};
  RunOptions run{.max_tokens = 4 * kBlock, .sampling = sampling};
  std::vector<std::vector<int32_t>> outputs;
  for (int i = 0; i < 2; ++i) {
    DiffusionMode mode(Options(*model_, 0.6f), model_->config().vocab_size, 128);
    absl::StatusOr<RunStats> r = testing::RunOnce(*model_, mode, prompts_[1], run);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->tokens.size(), 4u * kBlock);
    for (int32_t t : r->tokens) EXPECT_NE(t, model_->config().vocab_size - 1);
    outputs.push_back(r->tokens);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST(DiffusionModeTest, IsLossyAndNeedsAMaskToken) {
  ModelConfig config = testing::TinyConfig(TinyArch::kQwen2);
  ModeOptions options;
  absl::StatusOr<std::unique_ptr<DecodingMode>> none =
      CreateMode("diffusion", options, config, SamplingParams{});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateMode("self_spec", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.diffusion.mask_token_id = 63;
  EXPECT_EQ(CreateMode("diffusion", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "no block size";
  config.diffusion.block_size = 8;
  options.diffusion_threshold = 1.5f;
  EXPECT_EQ(CreateMode("diffusion", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.diffusion_threshold = 0.9f;
  absl::StatusOr<std::unique_ptr<DecodingMode>> diffusion =
      CreateMode("diffusion", options, config, SamplingParams{});
  ASSERT_TRUE(diffusion.ok()) << diffusion.status();
  EXPECT_EQ((*diffusion)->name(), "diffusion");
  EXPECT_FALSE((*diffusion)->lossless());
  absl::StatusOr<std::unique_ptr<DecodingMode>> self_spec =
      CreateMode("self_spec", options, config, SamplingParams{});
  ASSERT_TRUE(self_spec.ok()) << self_spec.status();
  EXPECT_TRUE((*self_spec)->lossless());
}

}  // namespace
}  // namespace tandem
