// self_spec and diffusion on the bundled tri-mode target (models/tandem-target), against AR and
// against the reference decodes of tools/train/evaluate.py (fixtures/modes.json: fp32, full
// recompute, no KV cache; the same algorithms, so tokens, cycles and forwards must agree).
// Prints the tokens per forward each mode reaches. Skipped when the model folder is absent.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/decoding/bundled_target.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/runner.h"

namespace tandem {
namespace {

using testing::BundledTargetTest;
using testing::kBundledTargetDir;

// Keeps the (drafted, accepted) of each self-speculation cycle: the one step of a cycle that
// reports drafts.
class CycleRecorder : public DecodingMode {
 public:
  explicit CycleRecorder(std::unique_ptr<DecodingMode> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  StepPlan Plan(const DecodeState& state) override { return inner_->Plan(state); }
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    absl::StatusOr<StepResult> r = inner_->Consume(state, plan, out);
    if (r.ok() && r->drafted > 0) cycles.push_back({r->drafted, r->accepted});
    if (r.ok()) steps.push_back(static_cast<int>(r->append.size()));
    return r;
  }
  std::vector<std::pair<int, int>> cycles;
  std::vector<int> steps;  // tokens appended by each step

 private:
  std::unique_ptr<DecodingMode> inner_;
};

class NldBundledTest : public BundledTargetTest {
 protected:
  void SetUp() override {
    BundledTargetTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    modes_ = testing::ReadJson(kBundledTargetDir + "/fixtures/modes.json");
    ASSERT_FALSE(modes_.is_discarded());
  }

  nlohmann::json modes_;
};

TEST_F(NldBundledTest, SelfSpecEqualsArAndTheReferenceCycles) {
  const nlohmann::json& ref = modes_["self_spec_linear"]["cases"];
  ASSERT_EQ(ref.size(), prompts_.size());
  const int k = modes_["self_spec_linear"]["draft_width"].get<int>();
  ModeOptions options;
  options.self_spec_draft_len = k;
  int64_t tokens = 0, forwards = 0, cycles = 0, accepted = 0, compared = 0;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    absl::StatusOr<std::unique_ptr<DecodingMode>> created =
        CreateMode("self_spec", options, model_->config(), SamplingParams{});
    ASSERT_TRUE(created.ok()) << created.status();
    CycleRecorder mode(std::move(*created));
    absl::StatusOr<RunStats> r = Decode(mode, prompts_[p]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens, ar_[p]) << "prompt " << p;
    EXPECT_EQ(r->tokens, ref[p]["continuation_ids"].get<std::vector<int32_t>>()) << "prompt " << p;
    // Cycles with the full draft width are the reference's cycles; near the end the budget
    // shortens ours (the reference overshoots and truncates).
    const std::vector<int> want = ref[p]["accepted_per_cycle"].get<std::vector<int>>();
    for (size_t c = 0; c < mode.cycles.size() && c < want.size(); ++c) {
      if (mode.cycles[c].first < k) break;
      EXPECT_EQ(mode.cycles[c].second, want[c]) << "prompt " << p << " cycle " << c;
      ++compared;
    }
    tokens += static_cast<int64_t>(r->tokens.size());
    forwards += r->forwards;
    cycles += static_cast<int64_t>(mode.cycles.size());
    accepted += r->accepted;
  }
  EXPECT_GT(compared, 0);
  std::printf(
      "[ tpf      ] self_spec k=%d on tandem-target: %.3f tokens/forward (%lld tokens, %lld "
      "forwards), %.3f drafts accepted per cycle, %.3f tokens per cycle\n",
      k, static_cast<double>(tokens) / forwards, static_cast<long long>(tokens),
      static_cast<long long>(forwards), static_cast<double>(accepted) / cycles,
      static_cast<double>(tokens) / cycles);
}

// The exactness harness's stop-token and max_tokens probes, on the trained model where drafts
// after the first are accepted often enough to make multi-token steps.
TEST_F(NldBundledTest, SelfSpecEqualsArWithStopsAndBudgets) {
  int stops_inside_steps = 0;
  int64_t accepted = 0;
  for (int k : {8, 3}) {
    ModeOptions options;
    options.self_spec_draft_len = k;
    for (size_t p = 0; p < prompts_.size(); ++p) {
      const auto run = [&](int max_tokens, std::optional<int32_t> stop) {
        ArMode ar(model_->config().vocab_size);
        absl::StatusOr<RunStats> want = Decode(ar, prompts_[p], max_tokens, stop);
        absl::StatusOr<std::unique_ptr<DecodingMode>> created =
            CreateMode("self_spec", options, model_->config(), SamplingParams{});
        ASSERT_TRUE(want.ok() && created.ok());
        CycleRecorder mode(std::move(*created));
        absl::StatusOr<RunStats> got = Decode(mode, prompts_[p], max_tokens, stop);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->tokens, want->tokens) << "prompt " << p << " k " << k << " max_tokens "
                                             << max_tokens << " stop " << stop.value_or(-1);
        EXPECT_EQ(got->finish, want->finish);
        accepted += got->accepted;
        size_t seen = 0;
        for (int n : mode.steps) {
          seen += n;
          if (seen >= got->tokens.size()) {
            stops_inside_steps += got->finish == FinishReason::kStop && seen > got->tokens.size();
            break;
          }
        }
      };
      for (int max_tokens : {1, 2, k, k + 1, 2 * k + 1}) run(max_tokens, std::nullopt);
      for (size_t at = 1; at < ar_[p].size(); at += 5) run(new_tokens_, ar_[p][at]);
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(stops_inside_steps, 0) << "no stop token fell inside a multi-token step";
  std::printf("[ stops    ] %d stop tokens fell inside a multi-token step\n", stops_inside_steps);
}

TEST_F(NldBundledTest, DiffusionEqualsTheReferenceDecodes) {
  const nlohmann::json& ref = modes_["diffusion"];
  ASSERT_GE(ref["runs"].size(), 1u);
  for (const nlohmann::json& run : ref["runs"]) {
    const float threshold = run["threshold"].get<float>();
    ASSERT_EQ(run["cases"].size(), prompts_.size());
    ModeOptions options;
    options.diffusion_block_size = ref["block_size"].get<int>();
    options.diffusion_threshold = threshold;
    for (size_t p = 0; p < prompts_.size(); ++p) {
      absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
          CreateMode("diffusion", options, model_->config(), SamplingParams{});
      ASSERT_TRUE(mode.ok()) << mode.status();
      absl::StatusOr<RunStats> r = Decode(**mode, prompts_[p]);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->tokens, run["cases"][p]["continuation_ids"].get<std::vector<int32_t>>())
          << "threshold " << threshold << " prompt " << p;
      // The reference counts denoising forwards only; here prefill and refreshes are fused into
      // them, so the counts are the same.
      EXPECT_EQ(r->forwards, run["cases"][p]["forwards"].get<int>())
          << "threshold " << threshold << " prompt " << p;
    }
  }
}

TEST_F(NldBundledTest, DiffusionTokensPerForwardByThreshold) {
  for (float threshold : {0.9f, 0.7f, 0.5f, 0.0f}) {
    ModeOptions options;
    options.diffusion_threshold = threshold;
    int64_t tokens = 0, forwards = 0, equal = 0, exact = 0;
    for (size_t p = 0; p < prompts_.size(); ++p) {
      absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
          CreateMode("diffusion", options, model_->config(), SamplingParams{});
      ASSERT_TRUE(mode.ok()) << mode.status();
      absl::StatusOr<RunStats> r = Decode(**mode, prompts_[p]);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->tokens.size(), ar_[p].size());
      tokens += static_cast<int64_t>(r->tokens.size());
      forwards += r->forwards;
      for (size_t i = 0; i < r->tokens.size(); ++i) equal += r->tokens[i] == ar_[p][i];
      exact += r->tokens == ar_[p];
      // Never fewer than one token per forward, never more than a block.
      EXPECT_GE(r->TokensPerForward(), 1.0);
      EXPECT_LE(r->TokensPerForward(), model_->config().diffusion.block_size);
    }
    std::printf(
        "[ tpf      ] diffusion threshold %.1f on tandem-target: %.3f tokens/forward (%lld "
        "tokens, %lld forwards); %.1f%% of tokens equal AR greedy, %lld of %zu outputs identical\n",
        threshold, static_cast<double>(tokens) / forwards, static_cast<long long>(tokens),
        static_cast<long long>(forwards), 100.0 * equal / tokens, static_cast<long long>(exact),
        prompts_.size());
  }
}

}  // namespace
}  // namespace tandem
