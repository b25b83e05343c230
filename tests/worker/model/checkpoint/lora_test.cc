#include "worker/model/checkpoint/lora.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/model/checkpoint/temp_dir.h"
#include "worker/model/checkpoint/safetensors.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// hidden 16, 4 query heads and 2 kv heads of width 8 (q width 32 != hidden), MLP 24, 2 layers.
ModelConfig TinyConfig() {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(R"({
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 50,
    "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8})");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::vector<float> Ramp(size_t n, float start) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = start + 0.25f * static_cast<float>(i);
  return values;
}

Json BaseAdapterConfig() {
  return Json::parse(R"({
    "peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "bias": "none",
    "target_modules": ["q_proj", "v_proj"], "use_rslora": false, "use_dora": false,
    "fan_in_fan_out": false, "modules_to_save": null, "rank_pattern": {}, "alpha_pattern": {},
    "task_type": "CAUSAL_LM"})");
}

class LoraTest : public ::testing::Test {
 protected:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };

  // Writes adapter_config.json and adapter_model.safetensors; tensor values are ramps whose
  // start encodes the tensor's position in `tensors`.
  void WriteAdapter(const Json& config, const std::vector<Tensor>& tensors) {
    dir_.Write("adapter_config.json", config.dump());
    values_.clear();
    values_.reserve(tensors.size());
    std::vector<TensorToWrite> to_write;
    for (size_t i = 0; i < tensors.size(); ++i) {
      int64_t numel = 1;
      for (int64_t d : tensors[i].shape) numel *= d;
      values_.push_back(Ramp(static_cast<size_t>(numel), static_cast<float>(i)));
      to_write.push_back({tensors[i].name, tensors[i].shape, values_.back()});
    }
    ASSERT_TRUE(
        WriteSafetensors(dir_.File("adapter_model.safetensors"), to_write, DType::kF32).ok());
  }

  absl::StatusOr<LoraAdapter> Load() { return LoadLoraAdapter(dir_.path().string(), config_); }

  std::string LoadError() {
    absl::StatusOr<LoraAdapter> adapter = Load();
    EXPECT_FALSE(adapter.ok());
    return adapter.ok() ? "" : std::string(adapter.status().message());
  }

  static std::string Name(int layer, const std::string& module, const std::string& ab,
                          const std::string& prefix = "base_model.model.",
                          const std::string& adapter = "") {
    return prefix + "model.layers." + std::to_string(layer) + "." + module + ".lora_" + ab +
           adapter + ".weight";
  }

  test::TempDir dir_;
  ModelConfig config_ = TinyConfig();
  std::vector<std::vector<float>> values_;
};

TEST_F(LoraTest, LoadsQAndVForEveryLayer) {
  WriteAdapter(BaseAdapterConfig(), {{Name(0, "self_attn.q_proj", "A"), {4, 16}},
                                     {Name(0, "self_attn.q_proj", "B"), {32, 4}},
                                     {Name(0, "self_attn.v_proj", "A"), {4, 16}},
                                     {Name(0, "self_attn.v_proj", "B"), {16, 4}},
                                     {Name(1, "self_attn.q_proj", "A"), {4, 16}},
                                     {Name(1, "self_attn.q_proj", "B"), {32, 4}}});
  absl::StatusOr<LoraAdapter> adapter = Load();
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->name, dir_.path().filename().string());
  EXPECT_EQ(adapter->scale, 2.0f);  // alpha 8 / r 4
  ASSERT_EQ(adapter->layers.size(), 2u);
  ASSERT_EQ(adapter->layers[0].size(), 2u);
  ASSERT_EQ(adapter->layers[1].size(), 1u);
  const LoraPair& q0 = adapter->layers[0].at(LoraTarget::kQ);
  EXPECT_EQ(q0.rank, 4);
  EXPECT_EQ(q0.a, values_[0]);
  EXPECT_EQ(q0.b, values_[1]);
  EXPECT_EQ(adapter->layers[0].at(LoraTarget::kV).b, values_[3]);
  EXPECT_EQ(adapter->layers[1].at(LoraTarget::kQ).a, values_[4]);
  EXPECT_EQ(adapter->layers[1].count(LoraTarget::kV), 0u);
}

TEST_F(LoraTest, AcceptsNamesWithoutPrefixAndWithAdapterName) {
  Json config = BaseAdapterConfig();
  config["target_modules"] = "all-linear";
  config["use_rslora"] = true;
  config["lora_alpha"] = 16;
  WriteAdapter(config, {{Name(1, "self_attn.o_proj", "A", ""), {4, 32}},
                        {Name(1, "self_attn.o_proj", "B", ""), {16, 4}},
                        {Name(0, "mlp.down_proj", "A", "base_model.model.", ".default"), {4, 24}},
                        {Name(0, "mlp.down_proj", "B", "base_model.model.", ".default"), {16, 4}},
                        {"layers.0.mlp.gate_proj.lora_A.weight", {4, 16}},
                        {"layers.0.mlp.gate_proj.lora_B.weight", {24, 4}}});
  absl::StatusOr<LoraAdapter> adapter = Load();
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_FLOAT_EQ(adapter->scale, 16.0f / 2.0f);  // rsLoRA: alpha / sqrt(r)
  EXPECT_EQ(adapter->layers[1].at(LoraTarget::kO).a, values_[0]);
  EXPECT_EQ(adapter->layers[0].at(LoraTarget::kDown).b, values_[3]);
  EXPECT_EQ(adapter->layers[0].at(LoraTarget::kGate).b, values_[5]);
}

TEST_F(LoraTest, RegexAndQualifiedTargetModules) {
  Json config = BaseAdapterConfig();
  config["target_modules"] = R"(.*\.(k_proj|up_proj))";
  WriteAdapter(config, {{Name(0, "self_attn.k_proj", "A"), {4, 16}},
                        {Name(0, "self_attn.k_proj", "B"), {16, 4}},
                        {Name(1, "mlp.up_proj", "A"), {4, 16}},
                        {Name(1, "mlp.up_proj", "B"), {24, 4}}});
  absl::StatusOr<LoraAdapter> adapter = Load();
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ(adapter->layers[1].at(LoraTarget::kUp).b, values_[3]);

  config["target_modules"] = {"self_attn.k_proj", "model.layers.1.mlp.up_proj"};
  dir_.Write("adapter_config.json", config.dump());
  EXPECT_TRUE(Load().ok());

  config["target_modules"] = R"(.*\.q_proj)";  // does not select k_proj
  dir_.Write("adapter_config.json", config.dump());
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("k_proj"), HasSubstr("target_modules")));

  config["target_modules"] = "(unclosed";
  dir_.Write("adapter_config.json", config.dump());
  EXPECT_THAT(LoadError(), HasSubstr("regex"));
}

TEST_F(LoraTest, ShapeMismatchesNameTheTensorAndShapes) {
  // k_proj's out_features is num_kv_heads * head_dim = 16, not the q width 32.
  Json config = BaseAdapterConfig();
  config["target_modules"] = {"k_proj"};
  WriteAdapter(config, {{Name(0, "self_attn.k_proj", "A"), {4, 16}},
                        {Name(0, "self_attn.k_proj", "B"), {32, 4}}});
  EXPECT_THAT(LoadError(), AllOf(HasSubstr(Name(0, "self_attn.k_proj", "B")), HasSubstr("[32, 4]"),
                                 HasSubstr("expected [16, 4]")));

  // o_proj's in_features is num_heads * head_dim = 32.
  config["target_modules"] = {"o_proj"};
  WriteAdapter(config, {{Name(0, "self_attn.o_proj", "A"), {4, 16}},
                        {Name(0, "self_attn.o_proj", "B"), {16, 4}}});
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("o_proj"), HasSubstr("expected [4, 32]")));

  // down_proj's in_features is intermediate_size.
  config["target_modules"] = {"down_proj"};
  WriteAdapter(
      config, {{Name(0, "mlp.down_proj", "A"), {4, 16}}, {Name(0, "mlp.down_proj", "B"), {16, 4}}});
  EXPECT_THAT(LoadError(), HasSubstr("expected [4, 24]"));

  // Rank other than r.
  config["target_modules"] = {"gate_proj"};
  WriteAdapter(
      config, {{Name(0, "mlp.gate_proj", "A"), {8, 16}}, {Name(0, "mlp.gate_proj", "B"), {24, 8}}});
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("rank 4"), HasSubstr("expected [4, 16]")));
}

TEST_F(LoraTest, UnsupportedOptionsAreRejected) {
  const std::vector<Tensor> tensors = {{Name(0, "self_attn.q_proj", "A"), {4, 16}},
                                       {Name(0, "self_attn.q_proj", "B"), {32, 4}}};
  const std::vector<std::pair<std::string, Json>> cases = {
      {"use_dora", true},
      {"bias", "all"},
      {"fan_in_fan_out", true},
      {"peft_type", "IA3"},
      {"rank_pattern", {{"q_proj", 8}}},
      {"modules_to_save", {"lm_head"}},
      {"target_modules", {"lm_head"}},
      {"target_modules", {"embed_tokens", "q_proj"}},
      {"r", 0},
      {"target_modules", 5}};
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key + "=" + value.dump());
    Json config = BaseAdapterConfig();
    config[key] = value;
    WriteAdapter(config, tensors);
    const std::string error = LoadError();
    EXPECT_THAT(error,
                AllOf(HasSubstr("adapter_config.json"), HasSubstr(key == "r" ? "\"r\"" : key)));
  }
}

TEST_F(LoraTest, InconsistentWeightsAreRejected) {
  // Only lora_A.
  WriteAdapter(BaseAdapterConfig(), {{Name(0, "self_attn.q_proj", "A"), {4, 16}}});
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("lora_A and lora_B"), HasSubstr("q_proj")));

  // A layer beyond the model.
  WriteAdapter(BaseAdapterConfig(), {{Name(5, "self_attn.q_proj", "A"), {4, 16}},
                                     {Name(5, "self_attn.q_proj", "B"), {32, 4}}});
  EXPECT_THAT(LoadError(), HasSubstr("layer 5"));

  // A module the config does not target.
  WriteAdapter(BaseAdapterConfig(),
               {{Name(0, "mlp.up_proj", "A"), {4, 16}}, {Name(0, "mlp.up_proj", "B"), {24, 4}}});
  EXPECT_THAT(LoadError(), AllOf(HasSubstr("up_proj"), HasSubstr("target_modules")));

  // Something that is not a LoRA weight (e.g. a DoRA magnitude vector or an embedding).
  WriteAdapter(BaseAdapterConfig(),
               {{"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", {32}}});
  EXPECT_THAT(LoadError(), HasSubstr("lora_magnitude_vector"));
  WriteAdapter(BaseAdapterConfig(), {{"base_model.model.lm_head.lora_A.weight", {4, 16}}});
  EXPECT_THAT(LoadError(), HasSubstr("lm_head"));

  // The same weight under two spellings.
  WriteAdapter(BaseAdapterConfig(),
               {{Name(0, "self_attn.q_proj", "A"), {4, 16}},
                {Name(0, "self_attn.q_proj", "A", "base_model.model.", ".default"), {4, 16}},
                {Name(0, "self_attn.q_proj", "B"), {32, 4}}});
  EXPECT_THAT(LoadError(), HasSubstr("same LoRA weight"));

  // No tensors at all.
  WriteAdapter(BaseAdapterConfig(), {});
  EXPECT_THAT(LoadError(), HasSubstr("no LoRA weights"));
}

TEST_F(LoraTest, MissingFilesAreNamed) {
  absl::StatusOr<LoraAdapter> no_config = Load();
  EXPECT_EQ(no_config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_config.status().message()), HasSubstr("adapter_config.json"));
  dir_.Write("adapter_config.json", BaseAdapterConfig().dump());
  dir_.Write("adapter_model.bin", "pickle");
  absl::StatusOr<LoraAdapter> no_weights = Load();
  EXPECT_EQ(no_weights.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(no_weights.status().message()), HasSubstr("adapter_model.safetensors"));
}

}  // namespace
}  // namespace tandem
