// config.json of a decoder-only transformer, normalised across the families we load.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

enum class Arch { kLlama, kMistral, kQwen2, kQwen3 };

// HF "rope_scaling" kinds. Frequencies follow transformers' modeling_rope_utils.
struct RopeScaling {
  enum class Kind { kNone, kLinear, kDynamic, kYarn, kLlama3 };
  Kind kind = Kind::kNone;
  float factor = 1.0f;
  int original_max_position_embeddings = 0;
  // llama3
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // yarn
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  std::optional<float> mscale;
  std::optional<float> mscale_all_dim;
  std::optional<float> attention_factor;
  bool truncate = true;  // yarn: round the correction range to whole dimensions
};

// Diffusion-specific fields of SDAR / I-DLM / Nemotron-Labs-Diffusion style checkpoints.
struct DiffusionConfig {
  std::optional<int> mask_token_id;  // from config.json, else from tokenizer.json "<|mask|>"
  int block_size = 0;                // 0 when the checkpoint does not state one
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string model_type;    // as written in config.json, e.g. "qwen3"
  std::string architecture;  // first entry of "architectures", e.g. "Qwen3ForCausalLM"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;  // GQA: num_heads % num_kv_heads == 0
  int head_dim = 0;      // explicit "head_dim" or hidden_size / num_heads
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int max_position_embeddings = 0;
  int sliding_window = 0;  // 0 = none (Mistral may set one)
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2, or "attention_bias": true)
  bool o_proj_bias = false;     // o_proj bias (Llama / Qwen3 "attention_bias": true; not Qwen2)
  bool mlp_bias = false;        // gate/up/down biases (Llama "mlp_bias": true)
  bool qk_norm = false;         // per-head RMSNorm on q and k (Qwen3)
  std::string hidden_act = "silu";
  std::vector<int> eos_token_ids;
  std::optional<int> bos_token_id;
  DiffusionConfig diffusion;
};

// Parses config.json text. Unknown model_type / architectures, missing or inconsistent sizes are
// InvalidArgument naming the field.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& origin = "config.json");

// Reads <dir>/config.json; fills diffusion.mask_token_id from <dir>/tokenizer.json when the
// config has none and the tokenizer's added_tokens define "<|mask|>" (or "<mask>", "[MASK]",
// any case). eos ids of <dir>/generation_config.json, which generate() stops on, are appended
// to eos_token_ids.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// Inverse frequencies [head_dim / 2] and the attention scaling factor (multiplies cos and sin;
// yarn only) for RoPE, including the rope_scaling kind. Dynamic NTK is evaluated at
// max(seq_len, max_position_embeddings); transformers only ever grows it, so callers pass the
// longest sequence length seen so far.
struct RopeTables {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};
RopeTables ComputeRope(const ModelConfig& config, int seq_len = 0);

}  // namespace tandem
