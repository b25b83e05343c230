#include "worker/model/transformer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/cpu_transformer.h"

#ifdef TANDEM_HAVE_CUDA
#include "worker/model/cuda/cuda_transformer.h"
#endif

namespace tandem {

Transformer::Transformer(ModelConfig config, ModelWeights weights,
                         kernels::cpu::WeightType cpu_weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  weights_.PackForCpu(cpu_weights);
  backend_ = std::make_unique<CpuTransformer>(this);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& dir,
                                                               kernels::cpu::WeightType cpu_weights,
                                                               const std::string& merge_lora) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  TANDEM_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(dir, config));
  if (!merge_lora.empty()) {
    TANDEM_ASSIGN_OR_RETURN(LoraAdapter adapter, LoadLoraAdapter(merge_lora, config));
    TANDEM_RETURN_IF_ERROR(MergeLoraAdapter(adapter, config, weights));
  }
  return FromWeights(std::move(config), std::move(weights), cpu_weights);
}

std::unique_ptr<Transformer> Transformer::FromWeights(ModelConfig config, ModelWeights weights,
                                                      kernels::cpu::WeightType cpu_weights) {
  return std::unique_ptr<Transformer>(
      new Transformer(std::move(config), std::move(weights), cpu_weights));
}

KvCacheOptions Transformer::KvOptions(int64_t max_tokens, int block_size) const {
  KvCacheOptions o;
  o.num_layers = config_.num_layers;
  o.num_kv_heads = config_.num_kv_heads;
  o.head_dim = config_.head_dim;
  o.block_size = block_size;
  o.num_blocks = static_cast<int32_t>((max_tokens + block_size - 1) / block_size);
  o.make_storage = backend_->StorageFactory();
  return o;
}

absl::Status Transformer::UseDevice(const DeviceOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
  if (options.device == Device::kCpu) {
    backend_ = std::make_unique<CpuTransformer>(this);
    device_ = Device::kCpu;
    return absl::OkStatus();
  }
#ifdef TANDEM_HAVE_CUDA
  TANDEM_ASSIGN_OR_RETURN(backend_, CudaTransformer::Create(this, options));
  device_ = options.device;
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

absl::Status Transformer::Validate(std::span<const Extend> batch, const KvCache& kv) const {
  for (size_t e = 0; e < batch.size(); ++e) {
    const Extend& x = batch[e];
    const int n = static_cast<int>(x.tokens.size());
    auto bad = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("extend ", e, " (sequence ", x.seq, "): ", parts...));
    };
    if (!kv.HasSequence(x.seq)) return bad("sequence not in the KV cache");
    if (kv.TentativeLength(x.seq) != n) {
      return bad("reserved ", kv.TentativeLength(x.seq), " KV slots but has ", n, " tokens");
    }
    if (x.positions.size() != x.tokens.size()) return bad("positions and tokens differ in length");
    for (int i = 0; i < n; ++i) {
      if (x.tokens[i] < 0 || x.tokens[i] >= config_.vocab_size) {
        return bad("token ", x.tokens[i], " at ", i, " outside the vocabulary of ",
                   config_.vocab_size);
      }
      if (x.positions[i] < 0) return bad("negative position at ", i);
    }
    for (int32_t o : x.outputs) {
      if (o < 0 || o >= n) return bad("output index ", o, " outside [0, ", n, ")");
    }
    if (!x.samples.empty() && x.samples.size() != x.outputs.size()) {
      return bad(x.samples.size(), " sample requests for ", x.outputs.size(), " outputs");
    }
    for (size_t i = 0; i < x.samples.size(); ++i) {
      const SampleRequest& r = x.samples[i];
      if (std::isnan(r.params.temperature) || std::isnan(r.params.top_p) ||
          std::isnan(r.params.min_p)) {
        return bad("sample request ", i, " has a NaN temperature, top_p or min_p");
      }
      if (r.params.top_k < 0) return bad("sample request ", i, " has top_k ", r.params.top_k);
      if (static_cast<uint32_t>(r.purpose) > static_cast<uint32_t>(RngPurpose::kMask)) {
        return bad("sample request ", i, " has an unknown RNG purpose ",
                   static_cast<uint32_t>(r.purpose));
      }
      if (r.draft < -1 || r.draft >= config_.vocab_size) {
        return bad("sample request ", i, " has draft token ", r.draft,
                   " outside the vocabulary of ", config_.vocab_size, " (-1 = no draft)");
      }
    }
    if (!x.lora_gate.empty()) {
      if (static_cast<int>(x.lora_gate.size()) != n)
        return bad("lora_gate length differs from tokens");
      if (!lora_.has_value() &&
          std::any_of(x.lora_gate.begin(), x.lora_gate.end(), [](uint8_t g) { return g != 0; })) {
        return bad("LoRA gate set but the model has no adapter");
      }
    }
    for (int32_t l : x.hidden_layers) {
      if (l < 0 || l > config_.num_layers)
        return bad("hidden layer ", l, " outside [0, ", config_.num_layers, "]");
    }
    switch (x.visible.kind) {
      case Visibility::Kind::kBlock:
        if (x.visible.block_size <= 0) return bad("block visibility needs block_size > 0");
        break;
      case Visibility::Kind::kExplicit:
        if (x.visible.n != n ||
            x.visible.bits.size() != static_cast<size_t>(n) * Visibility::Words(n)) {
          return bad("explicit visibility describes ", x.visible.n, " tokens, extend has ", n);
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ExtendOutput>> Transformer::Forward(std::span<const Extend> batch,
                                                               KvCache& kv) {
  TANDEM_RETURN_IF_ERROR(Validate(batch, kv));
  if (!backend_->OwnsStorage(kv)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model runs on ", std::string(DeviceName(device_)),
        " but the KV cache's storage is not that device's (make it from KvOptions after "
        "UseDevice)"));
  }
  return backend_->Forward(batch, kv);
}

}  // namespace tandem
