// jacobi on the bundled trained model: greedy output equals AR token for token on held-out code
// prompts (the model's golden fixtures), and the tokens per forward it reaches are printed.
// Skipped when the model folder is absent.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/runner.h"

namespace tandem {
namespace {

constexpr int kMaxTokens = 48;
constexpr size_t kPrompts = 4;  // each forward of this model costs milliseconds on a CPU

const std::string kModelDir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";

std::vector<std::vector<int32_t>> HeldOutPrompts() {
  std::ifstream in(kModelDir + "/fixtures/greedy.json");
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<std::vector<int32_t>> prompts;
  if (doc.is_discarded() || !doc.contains("cases")) return prompts;
  for (const nlohmann::json& c : doc["cases"]) {
    if (prompts.size() == kPrompts) break;
    prompts.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
  }
  return prompts;
}

absl::StatusOr<RunStats> Decode(Transformer& model, DecodingMode& mode,
                                std::span<const int32_t> prompt) {
  KvCache kv(model.KvOptions(static_cast<int64_t>(prompt.size()) + kMaxTokens + 512));
  RunOptions options;
  options.max_tokens = kMaxTokens;
  return RunSequence(model, kv, 1, mode, prompt, options);
}

TEST(JacobiBundledModelTest, EqualsArOnHeldOutCode) {
  if (!std::filesystem::exists(kModelDir + "/config.json")) {
    GTEST_SKIP() << "no bundled model at " << kModelDir;
  }
  absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Load(kModelDir);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::vector<int32_t>> prompts = HeldOutPrompts();
  ASSERT_FALSE(prompts.empty()) << "no prompts in the model's fixtures/greedy.json";

  std::vector<std::vector<int32_t>> want;
  ArMode ar((*model)->config().vocab_size);
  for (const std::vector<int32_t>& prompt : prompts) {
    absl::StatusOr<RunStats> run = Decode(**model, ar, prompt);
    ASSERT_TRUE(run.ok()) << run.status();
    want.push_back(run->tokens);
  }

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
  };
  for (const Config& config : configs) {
    int64_t tokens = 0, forwards = 0, accepted = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      auto mode = CreateMode("jacobi", config.options, (*model)->config(), SamplingParams{});
      ASSERT_TRUE(mode.ok()) << mode.status();
      absl::StatusOr<RunStats> run = Decode(**model, **mode, prompts[p]);
      ASSERT_TRUE(run.ok()) << run.status();
      EXPECT_EQ(run->tokens, want[p]) << config.label << ", prompt " << p;
      tokens += static_cast<int64_t>(run->tokens.size());
      forwards += run->forwards;
      accepted += run->accepted;
    }
    std::printf(
        "[ tpf      ] tandem-target, jacobi %s: %.3f tokens/forward (%lld drafts accepted)\n",
        config.label, static_cast<double>(tokens) / static_cast<double>(forwards),
        static_cast<long long>(accepted));
  }
}

}  // namespace
}  // namespace tandem
