// fp32 weights of a decoder-only transformer, laid out for the CPU forward: q/k/v and gate/up
// projections fused so each is one matrix product, and (once PackForCpu has run) every product's
// matrix packed for the CPU kernels (kernels/cpu/packed_gemm.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/packed_gemm.h"
#include "worker/model/checkpoint/lora.h"
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

// A layer's product matrices packed for the CPU.
struct PackedLayer {
  kernels::cpu::PackedMatrix qkv, o, gate_up, down;
};

// `v` ([rows, cols] row-major) packed as `type`, and released (empty); empty stays empty.
kernels::cpu::PackedMatrix PackRows(std::vector<float>& v, int cols, kernels::cpu::WeightType type);
// The row-major values of `m`, or `v` when m is empty (not packed).
std::vector<float> RowMajorOf(const std::vector<float>& v, const kernels::cpu::PackedMatrix& m);
// `layer`'s qkv, o, gate_up and down packed (hidden: the model's hidden size), their vectors
// released.
PackedLayer PackLayer(LayerWeights& layer, int hidden, kernels::cpu::WeightType type);
// `layer` with its matrices row-major (a copy): from `packed` when it holds them.
LayerWeights RowMajorLayerOf(const LayerWeights& layer, const PackedLayer* packed);

struct ModelWeights {
  std::vector<float> embed;  // [vocab, hidden]; empty when packed as the tied head
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab, hidden]; empty when tied to embed, or packed

  // Filled by PackForCpu: each layer's qkv, o, gate_up and down, and the LM head (lm_head, or
  // embed when tied), packed. Their row-major vectors are then released (empty), so the host
  // holds each matrix once; EmbedRow, RowMajorLayer, EmbedRowMajor and HeadRowMajor read them in
  // either state.
  std::vector<PackedLayer> packed_layers;
  kernels::cpu::PackedMatrix packed_head;
  bool head_tied = false;  // set by PackForCpu: the packed head is also the embedding

  bool packed() const { return !packed_head.empty(); }
  // Packs the matrices as `type` (no-op when packed). Shapes come from the vectors: hidden is
  // final_norm.size(). With kBf16 the values are rounded to bf16 (the row-major accessors then
  // give the rounded values).
  void PackForCpu(kernels::cpu::WeightType type = kernels::cpu::WeightType::kF32);

  // Row-major head; only before PackForCpu.
  const std::vector<float>& Head() const { return lm_head.empty() ? embed : lm_head; }
  // Token `token`'s embedding into out[0, hidden).
  void EmbedRow(int32_t token, float* out) const;
  std::vector<float> EmbedRowMajor() const;
  // The untied head row-major, or empty when the head is the embedding.
  std::vector<float> HeadRowMajor() const;
  // Layer i with its matrices row-major (a copy).
  LayerWeights RowMajorLayer(int i) const;
  // A copy in the checkpoint's layout, not packed (to edit, or to write out).
  ModelWeights Unpacked() const;

  // Bytes of parameters read by one decode step (the embedding row aside; packed matrices with
  // their last panel's padding).
  size_t StepBytes() const;
  size_t ParameterCount() const;
};

// Loads Hugging Face tensor names (model.layers.{i}.self_attn.q_proj.weight, ...) from the
// checkpoint in `dir`, converting to fp32. Missing tensors and shape mismatches are errors
// naming the tensor.
absl::StatusOr<ModelWeights> LoadWeights(const std::string& dir, const ModelConfig& config);

// Adds `adapter`'s residual, scale * B A, to every projection it adapts: the weights become the
// adapted model's on every row (a PEFT merge), in fp32. The adapter's shapes must fit `config`
// (LoadLoraAdapter checks them); FailedPrecondition when `weights` are packed.
absl::Status MergeLoraAdapter(const LoraAdapter& adapter, const ModelConfig& config,
                              ModelWeights& weights);

// Random weights (normal with `stddev`, norms around 1) for benchmarks and tests.
ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed, float stddev = 0.02f);

// Random weights of the same shapes for benchmark-size models: counter-based uniform draws with
// standard deviation `stddev` (norms around 1), filled on every core, so that an 8B-parameter
// model takes seconds rather than minutes. Not the values RandomWeights draws for the seed.
ModelWeights BenchmarkWeights(const ModelConfig& config, uint64_t seed, float stddev = 0.02f);

}  // namespace tandem
