#include "worker/model/checkpoint/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/model/checkpoint/temp_dir.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

ModelConfig ParseOk(const Json& json) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json.dump(), "test/config.json");
  EXPECT_TRUE(config.ok()) << config.status() << "\n" << json.dump(1);
  return config.ok() ? *config : ModelConfig{};
}

std::string ParseError(const Json& json) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json.dump(), "test/config.json");
  EXPECT_FALSE(config.ok()) << json.dump(1);
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

// Shapes of Llama-3.2-1B-Instruct's config.json.
Json LlamaConfig() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "attention_bias": false, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "num_attention_heads": 32,
    "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

// Shapes of Qwen3-0.6B's config.json.
Json Qwen3Config() {
  return Json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": false,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
    "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

// Shapes of Qwen2.5-0.5B-Instruct's config.json.
Json Qwen2Config() {
  return Json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// Shapes of Mistral-7B-Instruct-v0.3's config.json.
Json MistralConfig() {
  return Json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 32768})");
}

TEST(ModelConfigTest, Llama) {
  const ModelConfig c = ParseOk(LlamaConfig());
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.diffusion.mask_token_id.has_value());
  EXPECT_EQ(c.diffusion.block_size, 0);
}

TEST(ModelConfigTest, LlamaDefaultsAndBiasFlags) {
  Json json = LlamaConfig();
  for (const char* key : {"head_dim", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                          "rope_scaling", "tie_word_embeddings", "eos_token_id", "bos_token_id",
                          "max_position_embeddings", "hidden_act"}) {
    json.erase(key);
  }
  json["attention_bias"] = true;
  json["mlp_bias"] = true;
  const ModelConfig c = ParseOk(json);
  EXPECT_EQ(c.head_dim, 2048 / 32);
  EXPECT_EQ(c.num_kv_heads, 32);  // LlamaConfig: None -> num_attention_heads
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);  // Llama's attention_bias also covers o_proj
  EXPECT_TRUE(c.mlp_bias);

  json["eos_token_id"] = nullptr;
  json["bos_token_id"] = nullptr;
  const ModelConfig nulls = ParseOk(json);
  EXPECT_TRUE(nulls.eos_token_ids.empty());
  EXPECT_FALSE(nulls.bos_token_id.has_value());
}

TEST(ModelConfigTest, Qwen3) {
  const ModelConfig c = ParseOk(Qwen3Config());
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not hidden_size / heads (64)
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151645));
}

TEST(ModelConfigTest, Qwen3DefaultsFollowTransformers) {
  Json json = Qwen3Config();
  json.erase("head_dim");
  json.erase("eos_token_id");
  json.erase("bos_token_id");
  json["attention_bias"] = true;
  json["num_key_value_heads"] = nullptr;  // explicit null: same as num_attention_heads
  const ModelConfig c = ParseOk(json);
  EXPECT_EQ(c.head_dim, 128);  // Qwen3Config default, independent of hidden_size / heads
  EXPECT_EQ(c.num_kv_heads, 16);
  EXPECT_TRUE(c.eos_token_ids.empty());
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);

  // Absent: Qwen3Config's default of 32 key/value heads.
  json.erase("num_key_value_heads");
  json["num_attention_heads"] = 64;
  EXPECT_EQ(ParseOk(json).num_kv_heads, 32);
  json["num_attention_heads"] = 16;  // 32 kv heads cannot serve 16 query heads
  EXPECT_THAT(ParseError(json), HasSubstr("num_key_value_heads"));
}

TEST(ModelConfigTest, Qwen2HasQkvBiasWithoutOProjBias) {
  const ModelConfig c = ParseOk(Qwen2Config());
  EXPECT_EQ(c.arch, Arch::kQwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
}

TEST(ModelConfigTest, QwenSlidingWindowOnlyWhenEnabledAndReached) {
  Json json = Qwen2Config();
  json["use_sliding_window"] = true;
  json["max_window_layers"] = 24;  // no layer index >= 24: nothing slides
  EXPECT_EQ(ParseOk(json).sliding_window, 0);
  json["max_window_layers"] = 21;
  EXPECT_THAT(ParseError(json), HasSubstr("use_sliding_window"));
}

TEST(ModelConfigTest, Mistral) {
  const ModelConfig c = ParseOk(MistralConfig());
  EXPECT_EQ(c.arch, Arch::kMistral);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 0);  // explicit null
  EXPECT_FALSE(c.attention_bias);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));

  Json json = MistralConfig();
  json.erase("sliding_window");
  json.erase("num_key_value_heads");
  const ModelConfig defaults = ParseOk(json);
  EXPECT_EQ(defaults.sliding_window, 4096);  // MistralConfig default
  EXPECT_EQ(defaults.num_kv_heads, 8);
  json["sliding_window"] = 2048;
  json["attention_bias"] = true;  // MistralAttention ignores it
  const ModelConfig windowed = ParseOk(json);
  EXPECT_EQ(windowed.sliding_window, 2048);
  EXPECT_FALSE(windowed.attention_bias);
}

TEST(ModelConfigTest, DiffusionCheckpointsMapToTheirBaseFamily) {
  Json sdar = Qwen3Config();
  sdar["model_type"] = "sdar";
  sdar["architectures"] = {"SDARForCausalLM"};
  sdar["block_size"] = 4;
  sdar["mask_token_id"] = 151669;
  ModelConfig c = ParseOk(sdar);
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.model_type, "sdar");
  EXPECT_EQ(c.diffusion.block_size, 4);
  EXPECT_EQ(c.diffusion.mask_token_id, 151669);

  Json custom = Qwen2Config();
  custom["model_type"] = "my_block_diffusion";
  custom["architectures"] = {"BlockDiffusionQwen2ForCausalLM"};
  custom["bd_size"] = 8;
  c = ParseOk(custom);
  EXPECT_EQ(c.arch, Arch::kQwen2);
  EXPECT_EQ(c.diffusion.block_size, 8);

  Json llama_like = LlamaConfig();
  llama_like["model_type"] = "nld";
  llama_like["architectures"] = {"NLDLlamaForCausalLM"};
  llama_like["block_length"] = 32;
  c = ParseOk(llama_like);
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.diffusion.block_size, 32);
}

TEST(ModelConfigTest, UnsupportedArchitecturesAreRejectedWithTheSupportedList) {
  Json json = Qwen3Config();
  json["model_type"] = "gpt2";
  json["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_THAT(ParseError(json), AllOf(HasSubstr("unsupported architecture"), HasSubstr("gpt2"),
                                      HasSubstr("GPT2LMHeadModel"), HasSubstr("supported: ")));
  for (const auto& [model_type, architecture] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3_moe", "Qwen3MoeForCausalLM"},
           {"llama4", "Llama4ForCausalLM"},
           {"qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"},
           {"qwen3_5", "Qwen3_5ForCausalLM"},
           {"mistral3", "Mistral3ForConditionalGeneration"},
           {"sdar_moe", "SDARMoeForCausalLM"}}) {
    json["model_type"] = model_type;
    json["architectures"] = {architecture};
    EXPECT_THAT(ParseError(json), HasSubstr("unsupported architecture")) << model_type;
  }
  json = Qwen3Config();
  json["num_experts"] = 8;
  EXPECT_THAT(ParseError(json), HasSubstr("num_experts"));
}

TEST(ModelConfigTest, MissingOrInconsistentFieldsNameTheField) {
  Json json = Qwen3Config();
  json.erase("hidden_size");
  EXPECT_THAT(ParseError(json), AllOf(HasSubstr("test/config.json"), HasSubstr("hidden_size")));
  json = Qwen3Config();
  json["num_key_value_heads"] = 3;
  EXPECT_THAT(ParseError(json), HasSubstr("num_key_value_heads"));
  json = Qwen3Config();
  json["vocab_size"] = "big";
  EXPECT_THAT(ParseError(json), HasSubstr("vocab_size"));
  json = Qwen3Config();
  json["num_hidden_layers"] = 0;
  EXPECT_THAT(ParseError(json), HasSubstr("num_hidden_layers"));
  json = Qwen3Config();
  json["head_dim"] = 33;
  EXPECT_THAT(ParseError(json), HasSubstr("head_dim"));
  json = LlamaConfig();
  json.erase("head_dim");
  json["hidden_size"] = 2050;
  EXPECT_THAT(ParseError(json), HasSubstr("hidden_size"));
  json = LlamaConfig();
  json["eos_token_id"] = {1, "x"};
  EXPECT_THAT(ParseError(json), HasSubstr("eos_token_id"));
  EXPECT_FALSE(ParseModelConfig("[1, 2]", "c.json").ok());
  EXPECT_THAT(std::string(ParseModelConfig("{oops", "c.json").status().message()),
              HasSubstr("c.json"));
}

TEST(ModelConfigTest, IntegralFloatsAreAcceptedAsIntegers) {
  Json json = Qwen3Config();
  json["hidden_size"] = 1024.0;
  EXPECT_EQ(ParseOk(json).hidden_size, 1024);
  json["hidden_size"] = 1024.5;
  EXPECT_THAT(ParseError(json), HasSubstr("hidden_size"));
}

TEST(ModelConfigTest, RopeKindsAndKeySpellings) {
  Json json = Qwen2Config();
  json["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  ModelConfig c = ParseOk(json);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kLinear);
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);

  json["rope_scaling"] = {{"rope_type", "dynamic"}, {"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(ParseOk(json).rope_scaling.kind, RopeScaling::Kind::kDynamic);  // rope_type wins

  json["rope_scaling"] = {
      {"type", "yarn"},   {"factor", 4.0}, {"original_max_position_embeddings", 8192},
      {"beta_fast", 16},  {"mscale", 0.5}, {"mscale_all_dim", 1.0},
      {"truncate", false}};
  c = ParseOk(json);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kYarn);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.rope_scaling.beta_fast, 16.0f);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.0f);
  EXPECT_EQ(c.rope_scaling.mscale, 0.5f);
  EXPECT_EQ(c.rope_scaling.mscale_all_dim, 1.0f);
  EXPECT_FALSE(c.rope_scaling.attention_factor.has_value());
  EXPECT_FALSE(c.rope_scaling.truncate);

  // yarn without original_max_position_embeddings: max_position_embeddings stands in.
  json["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}};
  EXPECT_EQ(ParseOk(json).rope_scaling.original_max_position_embeddings, 32768);

  // transformers v5: rope_parameters carries rope_theta too, and wins over the top level.
  json.erase("rope_scaling");
  json["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  c = ParseOk(json);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_EQ(c.rope_theta, 5e6f);

  // A non-empty rope_scaling wins over rope_parameters (transformers' precedence).
  json["rope_scaling"] = {{"type", "linear"}, {"factor", 3.0}};
  EXPECT_EQ(ParseOk(json).rope_scaling.kind, RopeScaling::Kind::kLinear);
}

TEST(ModelConfigTest, BadRopeSettingsAreErrors) {
  Json json = LlamaConfig();
  json["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  EXPECT_THAT(ParseError(json), AllOf(HasSubstr("longrope"), HasSubstr("supported")));
  json["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_THAT(ParseError(json), HasSubstr("factor"));
  json["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0}};
  EXPECT_THAT(ParseError(json), HasSubstr("low_freq_factor"));
  json["rope_scaling"] = "linear";
  EXPECT_THAT(ParseError(json), HasSubstr("rope_scaling"));
  json.erase("rope_scaling");
  json["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(ParseError(json), HasSubstr("partial_rotary_factor"));
}

TEST(LoadModelConfigTest, MaskTokenFromTokenizerAndEosFromGenerationConfig) {
  test::TempDir dir;
  Json config = Qwen3Config();
  dir.Write("config.json", config.dump());
  dir.Write("tokenizer.json", R"({"version": "1.0", "added_tokens": [
      {"id": 151643, "content": "<|endoftext|>", "special": true},
      {"id": 151669, "content": "<|MASK|>", "special": true}], "model": {"type": "BPE"}})");
  dir.Write("generation_config.json", R"({"eos_token_id": [151645, 151643], "top_k": 20})");
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir.path().string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->diffusion.mask_token_id, 151669);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645, 151643));

  // The config's own mask_token_id wins over the tokenizer's.
  config["mask_token_id"] = 7;
  dir.Write("config.json", config.dump());
  c = LoadModelConfig(dir.path().string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->diffusion.mask_token_id, 7);
}

TEST(LoadModelConfigTest, OtherMaskSpellingsAndAbsentMask) {
  test::TempDir dir;
  dir.Write("config.json", LlamaConfig().dump());
  dir.Write("tokenizer.json", R"({"added_tokens": [{"id": 5, "content": "[MASK]"}]})");
  EXPECT_EQ(LoadModelConfig(dir.path().string())->diffusion.mask_token_id, 5);
  dir.Write("tokenizer.json", R"({"added_tokens": [{"id": 9, "content": "<mask>"}]})");
  EXPECT_EQ(LoadModelConfig(dir.path().string())->diffusion.mask_token_id, 9);
  dir.Write("tokenizer.json", R"({"added_tokens": [{"id": 9, "content": "<|endoftext|>"}]})");
  EXPECT_FALSE(LoadModelConfig(dir.path().string())->diffusion.mask_token_id.has_value());
}

TEST(LoadModelConfigTest, MissingOrBrokenFilesAreNamed) {
  test::TempDir dir;
  absl::StatusOr<ModelConfig> missing = LoadModelConfig(dir.path().string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("config.json"));
  dir.Write("config.json", Qwen3Config().dump());
  dir.Write("tokenizer.json", "{broken");
  absl::StatusOr<ModelConfig> broken = LoadModelConfig(dir.path().string());
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("tokenizer.json"));
}

}  // namespace
}  // namespace tandem
