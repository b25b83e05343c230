// A decoder-only transformer (Llama / Mistral / Qwen2 / Qwen3 blocks): the model description,
// its host weights and adapter, and the validation of every batch. The forward itself is its
// backend's (worker/model/backend.h): the CPU in fp32 (worker/model/cpu_transformer.h), or a
// GPU in bf16 after UseDevice({Device::kCuda}) (worker/model/cuda/cuda_transformer.h).
//
// Forward runs a batch of extends over the paged KV cache: every extend's sequence must have
// Reserve()d exactly its token count in the cache first; the new tokens' K/V are written to
// those tentative slots and KvCache::Commit decides which are kept.
//
// Thread-safety: Forward mutates only the KvCache passed in and per-call buffers; one caller at a
// time (the worker actor).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/backend.h"
#include "worker/model/checkpoint/lora.h"
#include "worker/model/checkpoint/model_config.h"
#include "worker/model/device.h"
#include "worker/model/extend.h"
#include "worker/model/weights.h"

namespace tandem {

class Transformer {
 public:
  // Loads config.json and the safetensors weights in `dir`; the CPU forward's products hold
  // their weights as `cpu_weights` (ModelWeights::PackForCpu). With `merge_lora` (a PEFT
  // adapter directory) the adapter is merged into the weights first (MergeLoraAdapter): the
  // model is then base + adapter on every row, on every backend.
  static absl::StatusOr<std::unique_ptr<Transformer>> Load(
      const std::string& dir, kernels::cpu::WeightType cpu_weights = kernels::cpu::WeightType::kF32,
      const std::string& merge_lora = "");
  static std::unique_ptr<Transformer> FromWeights(
      ModelConfig config, ModelWeights weights,
      kernels::cpu::WeightType cpu_weights = kernels::cpu::WeightType::kF32);

  const ModelConfig& config() const { return config_; }
  // Packed for the CPU (ModelWeights::PackForCpu) when the model is built: the products'
  // matrices are in packed_layers / packed_head, their row-major vectors empty.
  const ModelWeights& weights() const { return weights_; }

  // Moves the forward to `options.device`: kCuda uploads bf16 weights to the GPU and runs
  // every later Forward there (KV caches must then come from KvOptions called afterwards);
  // kCpu returns to the fp32 CPU forward. Errors (no GPU, a build without CUDA, out of
  // memory) leave the model where it was.
  absl::Status UseDevice(const DeviceOptions& options);
  Device device() const { return device_; }
  // The backend the forward runs on (a CpuTransformer on the CPU); never null.
  ModelBackend* backend() { return backend_.get(); }

  // Options for a KV cache that fits this model, holding `max_tokens` tokens in total; its
  // storage is the current device's.
  KvCacheOptions KvOptions(int64_t max_tokens, int block_size = 16) const;

  // The adapter used by extends whose lora_gate is set (one adapter per model).
  void SetLoraAdapter(LoraAdapter adapter) {
    lora_ = std::move(adapter);
    if (backend_ != nullptr) backend_->LoraChanged();
  }
  bool has_lora() const { return lora_.has_value(); }
  const std::optional<LoraAdapter>& lora() const { return lora_; }

  // Runs the batch; returns one output per extend, in order: the logits of its outputs when
  // return_logits, and for its sample requests the tokens SampleToken picks from those rows, or
  // for requests with a draft VerifyDraft's token and verdict (on the CPU by calling them; on a
  // device by its sampler and verifier, see kernels/cuda/sampling.cuh and verify.cuh).
  // InvalidArgument for malformed extends (token or position out of range, missing
  // reservation, bad indices, sample requests not one per output, with NaN settings or with a
  // draft outside the vocabulary) or a cache whose storage is not the current device's; nothing
  // is written to the cache then.
  absl::StatusOr<std::vector<ExtendOutput>> Forward(std::span<const Extend> batch, KvCache& kv);

 private:
  Transformer(ModelConfig config, ModelWeights weights, kernels::cpu::WeightType cpu_weights);

  absl::Status Validate(std::span<const Extend> batch, const KvCache& kv) const;

  ModelConfig config_;
  ModelWeights weights_;
  std::optional<LoraAdapter> lora_;
  Device device_ = Device::kCpu;
  std::unique_ptr<ModelBackend> backend_;
};

}  // namespace tandem
