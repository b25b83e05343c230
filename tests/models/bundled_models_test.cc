// Every bundled model loads in the engine and continues held-out prompts exactly as PyTorch
// does (fixtures/greedy.json, written by tools/train/evaluate.py).
#include <fstream>
#include <memory>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/decoding/ar.h"
#include "worker/decoding/drafter.h"
#include "worker/decoding/runner.h"
#include "worker/decoding/spec.h"
#include "worker/engine/local_generator.h"

namespace tandem {
namespace {

std::string ModelDir(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/models/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
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

// models/tandem-drafter is the separately trained drafter of models/tandem-target: it says so
// in config.json, shares the target's tokenizer byte for byte, is several times smaller, and
// `spec` with it reproduces the target's greedy fixtures while accepting a real share of its
// drafts (an untrained or misaligned drafter accepts almost none).
TEST(BundledDrafterTest, DraftsForTheTargetLosslessly) {
  const nlohmann::json config =
      nlohmann::json::parse(ReadFile(ModelDir("tandem-drafter") + "/config.json"));
  EXPECT_EQ(config["tandem"]["role"], "drafter");
  EXPECT_EQ(config["tandem"]["drafter_for"], "models/tandem-target");
  EXPECT_EQ(ReadFile(ModelDir("tandem-drafter") + "/tokenizer.json"),
            ReadFile(ModelDir("tandem-target") + "/tokenizer.json"));
  EXPECT_LT(ReadFile(ModelDir("tandem-drafter") + "/model.safetensors").size() * 3,
            ReadFile(ModelDir("tandem-target") + "/model.safetensors").size());

  auto target = LoadModelDir(ModelDir("tandem-target"));
  ASSERT_TRUE(target.ok()) << target.status();
  auto drafter = LoadModelDir(ModelDir("tandem-drafter"));
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const nlohmann::json fixture =
      nlohmann::json::parse(ReadFile(ModelDir("tandem-target") + "/fixtures/greedy.json"));
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < 4; ++i) {  // half the fixture cases keep the test quick
    const nlohmann::json& c = fixture["cases"][i];
    const std::vector<int32_t> prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c["continuation_ids"].get<std::vector<int32_t>>();
    const int capacity = static_cast<int>(prompt.size() + want.size()) + kMaxSpecGamma + 16;
    const Transformer& t = *target->model;
    SpecMode mode(4, std::make_unique<InProcessArDrafter>(drafter->model.get(), capacity),
                  t.config().vocab_size, t.config().max_position_embeddings);
    KvCache kv(target->model->KvOptions(capacity));
    RunOptions options;
    options.max_tokens = static_cast<int>(want.size());
    auto run = RunSequence(*target->model, kv, 1, mode, prompt, options);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->tokens, want) << c["source"];
    EXPECT_EQ(mode.stats().drafter_failures, 0) << mode.stats().last_drafter_error;
    drafted += mode.stats().drafted;
    accepted += mode.stats().accepted;
  }
  ASSERT_GT(drafted, 0);
  EXPECT_GT(accepted * 4, drafted) << accepted << " of " << drafted << " drafts accepted";
}

INSTANTIATE_TEST_SUITE_P(Models, BundledModelTest,
                         ::testing::Values("tandem-target", "tandem-drafter", "tandem-sdlm",
                                           "tandem-idlm"));

}  // namespace
}  // namespace tandem
