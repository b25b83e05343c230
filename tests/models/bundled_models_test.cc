// Every bundled model loads in the engine and continues held-out prompts exactly as PyTorch
// does (fixtures/greedy.json, written by tools/train/evaluate.py).
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/decoding/ar.h"
#include "worker/decoding/runner.h"
#include "worker/engine/local_generator.h"

namespace tandem {
namespace {

std::string ModelDir(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/models/" + name;
}

class BundledModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BundledModelTest, GreedyContinuationsEqualPyTorch) {
  auto loaded = LoadModelDir(ModelDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::ifstream in(ModelDir(GetParam()) + "/fixtures/greedy.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  ASSERT_GE(fixture["cases"].size(), 4u);
  for (const auto& c : fixture["cases"]) {
    const std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c["continuation_ids"].get<std::vector<int32_t>>();
    ArMode mode(loaded->model->config().vocab_size);
    KvCache kv(loaded->model->KvOptions(prompt.size() + want.size() + 16));
    RunOptions options;
    options.max_tokens = static_cast<int>(want.size());
    auto run = RunSequence(*loaded->model, kv, 1, mode, prompt, options);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tokens, want) << c["source"];
  }
}

TEST_P(BundledModelTest, TokenizerRoundTripsAndGenerates) {
  auto loaded = LoadModelDir(ModelDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::string text = "def main():\n    return 0\n";
  auto ids = loaded->tokenizer->Encode(text);
  ASSERT_TRUE(ids.ok());
  auto back = loaded->tokenizer->Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"}) {
    EXPECT_TRUE(loaded->tokenizer->TokenId(special).has_value()) << special;
  }
  LocalGenerator generator(&*loaded);
  GenerateOptions options;
  options.max_tokens = 8;
  auto result = generator.Generate("import ", options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->tokens.empty());
}

INSTANTIATE_TEST_SUITE_P(Models, BundledModelTest, ::testing::Values("tandem-target"));

}  // namespace
}  // namespace tandem
