// fp32 weights of a decoder-only transformer, laid out for the CPU forward: q/k/v and gate/up
// projections fused so each is one matrix product.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint/model_config.h"

namespace tandem {

struct LayerWeights {
  std::vector<float> input_norm;    // [hidden]
  std::vector<float> qkv;           // [(q_heads + 2 * kv_heads) * head_dim, hidden]
  std::vector<float> qkv_bias;      // [(q_heads + 2 * kv_heads) * head_dim] or empty
  std::vector<float> q_norm;        // [head_dim] or empty (Qwen3)
  std::vector<float> k_norm;        // [head_dim] or empty
  std::vector<float> o;             // [hidden, q_heads * head_dim]
  std::vector<float> o_bias;        // [hidden] or empty
  std::vector<float> post_norm;     // [hidden]
  std::vector<float> gate_up;       // [2 * intermediate, hidden]: gate rows, then up rows
  std::vector<float> gate_up_bias;  // [2 * intermediate] or empty (Llama mlp_bias)
  std::vector<float> down;          // [hidden, intermediate]
  std::vector<float> down_bias;     // [hidden] or empty
};

struct ModelWeights {
  std::vector<float> embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab, hidden]; empty when tied to embed

  const std::vector<float>& Head() const { return lm_head.empty() ? embed : lm_head; }
  // Bytes of parameters read by one decode step (the embedding row aside).
  size_t StepBytes() const;
  size_t ParameterCount() const;
};

// Loads Hugging Face tensor names (model.layers.{i}.self_attn.q_proj.weight, ...) from the
// checkpoint in `dir`, converting to fp32. Missing tensors and shape mismatches are errors
// naming the tensor.
absl::StatusOr<ModelWeights> LoadWeights(const std::string& dir, const ModelConfig& config);

// Random weights (normal with `stddev`, norms around 1) for benchmarks and tests.
ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed, float stddev = 0.02f);

// Random weights of the same shapes for benchmark-size models: counter-based uniform draws with
// standard deviation `stddev` (norms around 1), filled on every core, so that an 8B-parameter
// model takes seconds rather than minutes. Not the values RandomWeights draws for the seed.
ModelWeights BenchmarkWeights(const ModelConfig& config, uint64_t seed, float stddev = 0.02f);

}  // namespace tandem
