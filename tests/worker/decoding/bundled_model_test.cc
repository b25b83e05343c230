// jacobi on the bundled trained model, and on it with its pcLLM adapter merged in: greedy output
// equals AR (the same model's) token for token on held-out code prompts (the model's golden
// fixtures), and the tokens per forward it reaches are printed. Skipped when the model folder
// (or the adapter) is absent.
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/worker/decoding/bundled_target.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/runner.h"

namespace tandem {
namespace {

class JacobiBundledModelTest : public testing::BundledTargetTest {
 protected:
  // jacobi in several configurations on every prompt: each must equal the AR decode. Prints
  // the tokens per forward of each, with `label`.
  void JacobiEqualsAr(const char* label);
};

void JacobiBundledModelTest::JacobiEqualsAr(const char* label) {
  struct Config {
    const char* label;
    ModeOptions options;
  };
  const Config configs[] = {
      {"n8 K1 plain", {.jacobi_block_size = 8, .jacobi_pool_size = 0, .jacobi_candidates = 0}},
      {"n8 K2 recycling", {.jacobi_block_size = 8, .jacobi_blocks = 2, .jacobi_candidates = 2}},
      {"n8 K2 recycling + prompt lookup",
       {.jacobi_block_size = 8,
        .jacobi_blocks = 2,
        .jacobi_candidates = 2,
        .jacobi_prompt_lookup = true}},
      {"n16 K1 recycling (default)", {}},
  };
  for (const Config& config : configs) {
    int64_t tokens = 0, forwards = 0, accepted = 0;
    for (size_t p = 0; p < prompts_.size(); ++p) {
      auto mode = CreateMode("jacobi", config.options, model_->config(), SamplingParams{});
      ASSERT_TRUE(mode.ok()) << mode.status();
      absl::StatusOr<RunStats> run = Decode(**mode, prompts_[p]);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->tokens, ar_[p]) << label << ", " << config.label << ", prompt " << p;
      tokens += static_cast<int64_t>(run->tokens.size());
      forwards += run->forwards;
      accepted += run->accepted;
    }
    std::printf("[ tpf      ] %s, jacobi %s: %.3f tokens/forward (%lld drafts accepted)\n", label,
                config.label, static_cast<double>(tokens) / static_cast<double>(forwards),
                static_cast<long long>(accepted));
  }
}

TEST_F(JacobiBundledModelTest, EqualsArOnHeldOutCode) {
  ASSERT_FALSE(prompts_.empty()) << "no prompts in the model's fixtures/greedy.json";
  JacobiEqualsAr("tandem-target");
}

// pcLLM (progressive consistency distillation) as an adapter merged into the target: jacobi on
// the adapted model reproduces the adapted model's AR output.
class JacobiPcllmBundledModelTest : public JacobiBundledModelTest {
 protected:
  std::string MergeLora() const override { return testing::kBundledTargetDir + "/pcllm-lora"; }
};

TEST_F(JacobiPcllmBundledModelTest, EqualsTheAdaptedModelsArOnHeldOutCode) {
  ASSERT_FALSE(prompts_.empty()) << "no prompts in the model's fixtures/greedy.json";
  JacobiEqualsAr("tandem-target + pcllm-lora");
}

}  // namespace
}  // namespace tandem
