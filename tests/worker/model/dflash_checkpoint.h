// Random-weight DFlash drafter checkpoints for tests: config.json and model.safetensors with the
// tensor names and shapes of the checkpoint contract (docs/ARCHITECTURE.md, "DFlash drafter").
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/model/checkpoint/safetensors.h"

namespace tandem::testing {

struct DFlashSpec {
  int vocab_size = 97;
  int hidden_size = 32;
  int intermediate_size = 40;
  int num_layers = 2;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 12;
  int block_size = 6;
  int mask_token_id = 96;
  int max_anchor = 3;
  std::vector<int> target_layer_ids = {1, 3, 0};
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  int max_position_embeddings = 256;
};

struct RawTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using RawTensors = std::map<std::string, RawTensor>;

inline std::string DFlashConfigJson(const DFlashSpec& s) {
  return absl::StrCat(
      R"({"architectures": ["TandemDFlashDrafter"], "model_type": "qwen3", "vocab_size": )",
      s.vocab_size, R"(, "hidden_size": )", s.hidden_size, R"(, "intermediate_size": )",
      s.intermediate_size, R"(, "num_hidden_layers": )", s.num_layers,
      R"(, "num_attention_heads": )", s.num_heads, R"(, "num_key_value_heads": )", s.num_kv_heads,
      R"(, "head_dim": )", s.head_dim, R"(, "rms_norm_eps": )", s.rms_norm_eps,
      R"(, "rope_theta": )", s.rope_theta, R"(, "max_position_embeddings": )",
      s.max_position_embeddings, R"(, "tie_word_embeddings": false, "block_size": )", s.block_size,
      R"(, "mask_token_id": )", s.mask_token_id, R"(, "dflash": {"target_layer_ids": [)",
      absl::StrJoin(s.target_layer_ids, ", "), R"(], "target": "test-target", "max_anchor": )",
      s.max_anchor, "}}");
}

// Normal(0, stddev) matrices, norms around 1.
inline RawTensors RandomDFlashTensors(const DFlashSpec& s, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  RawTensors t;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = (norm ? 1.0f : 0.0f) + normal(rng);
    t[name] = {std::move(shape), std::move(v)};
  };
  const int64_t h = s.hidden_size, k = static_cast<int64_t>(s.target_layer_ids.size());
  const int64_t q = int64_t{s.num_heads} * s.head_dim, kv = int64_t{s.num_kv_heads} * s.head_dim;
  add("fc.weight", {h, k * h}, false);
  add("hidden_norm.weight", {h}, true);
  add("norm.weight", {h}, true);
  for (int i = 0; i < s.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "post_attention_layernorm.weight", {h}, true);
    add(p + "self_attn.q_proj.weight", {q, h}, false);
    add(p + "self_attn.k_proj.weight", {kv, h}, false);
    add(p + "self_attn.v_proj.weight", {kv, h}, false);
    add(p + "self_attn.o_proj.weight", {h, q}, false);
    add(p + "self_attn.q_norm.weight", {s.head_dim}, true);
    add(p + "self_attn.k_norm.weight", {s.head_dim}, true);
    add(p + "mlp.gate_proj.weight", {s.intermediate_size, h}, false);
    add(p + "mlp.up_proj.weight", {s.intermediate_size, h}, false);
    add(p + "mlp.down_proj.weight", {h, s.intermediate_size}, false);
  }
  return t;
}

// Writes <dir>/config.json and <dir>/model.safetensors.
inline absl::Status WriteDFlashCheckpoint(const std::string& dir, const std::string& config_json,
                                          const RawTensors& tensors, DType dtype = DType::kF32) {
  std::ofstream(dir + "/config.json") << config_json;
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.shape, t.values});
  return WriteSafetensors(dir + "/model.safetensors", out, dtype);
}

}  // namespace tandem::testing
