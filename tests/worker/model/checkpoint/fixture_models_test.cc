// The tiny checkpoints under tests/fixtures/models were saved by transformers itself. Loading
// each one checks config parsing (families, defaults, bias/norm flags) against what the modeling
// code actually put in the weights: every expected tensor is present with its shape, and no
// tensor is left unexplained.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/checkpoint/checkpoint.h"
#include "worker/model/checkpoint/model_config.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::vector<int64_t>> ExpectedTensors(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t mlp = c.intermediate_size;
  std::map<std::string, std::vector<int64_t>> expected = {
      {"model.embed_tokens.weight", {c.vocab_size, hidden}},
      {"model.norm.weight", {hidden}},
  };
  if (!c.tie_word_embeddings) expected["lm_head.weight"] = {c.vocab_size, hidden};
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    expected[p + "input_layernorm.weight"] = {hidden};
    expected[p + "post_attention_layernorm.weight"] = {hidden};
    expected[p + "self_attn.q_proj.weight"] = {q_width, hidden};
    expected[p + "self_attn.k_proj.weight"] = {kv_width, hidden};
    expected[p + "self_attn.v_proj.weight"] = {kv_width, hidden};
    expected[p + "self_attn.o_proj.weight"] = {hidden, q_width};
    if (c.attention_bias) {
      expected[p + "self_attn.q_proj.bias"] = {q_width};
      expected[p + "self_attn.k_proj.bias"] = {kv_width};
      expected[p + "self_attn.v_proj.bias"] = {kv_width};
    }
    if (c.o_proj_bias) expected[p + "self_attn.o_proj.bias"] = {hidden};
    if (c.qk_norm) {
      expected[p + "self_attn.q_norm.weight"] = {c.head_dim};
      expected[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
    expected[p + "mlp.gate_proj.weight"] = {mlp, hidden};
    expected[p + "mlp.up_proj.weight"] = {mlp, hidden};
    expected[p + "mlp.down_proj.weight"] = {hidden, mlp};
    if (c.mlp_bias) {
      expected[p + "mlp.gate_proj.bias"] = {mlp};
      expected[p + "mlp.up_proj.bias"] = {mlp};
      expected[p + "mlp.down_proj.bias"] = {hidden};
    }
  }
  return expected;
}

TEST(FixtureModelsTest, EveryFixtureCheckpointLoadsWithTheTensorsItsConfigImplies) {
  const fs::path root = fs::path(TANDEM_SOURCE_DIR) / "tests/fixtures/models";
  int checked = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    if (!fs::exists(entry.path() / "config.json")) continue;
    SCOPED_TRACE(entry.path().string());
    absl::StatusOr<ModelConfig> config = LoadModelConfig(entry.path().string());
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint =
        Checkpoint::Open(entry.path().string());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();

    const auto expected = ExpectedTensors(*config);
    for (const auto& [name, shape] : expected) {
      absl::StatusOr<std::vector<float>> values = (*checkpoint)->LoadF32(name, shape);
      EXPECT_TRUE(values.ok()) << values.status();
    }
    for (const std::string& name : (*checkpoint)->TensorNames()) {
      EXPECT_TRUE(expected.count(name) != 0 || name == "lm_head.weight")
          << "unexplained tensor " << name;
    }
    const RopeTables rope = ComputeRope(*config);
    EXPECT_EQ(rope.inv_freq.size(), static_cast<size_t>(config->head_dim / 2));
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no fixture checkpoints under " << root;
}

}  // namespace
}  // namespace tandem
