// Where a Transformer's forward runs: Transformer keeps the configuration, the host weights
// and the validation, and hands validated batches to its backend — CpuTransformer
// (worker/model/cpu_transformer.h) unless UseDevice attached another (CudaTransformer). A third
// backend is a new implementation of this interface and a case in Transformer::UseDevice.
#pragma once

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/extend.h"

namespace tandem {

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  // Runs a batch Transformer::Validate accepted, on a KvCache whose storage this backend's
  // StorageFactory made; same outputs as Transformer::Forward (logits only for extends with
  // return_logits, sampled tokens for extends with sample requests).
  virtual absl::StatusOr<std::vector<ExtendOutput>> Forward(std::span<const Extend> batch,
                                                            KvCache& kv) = 0;

  // Makes the KV storage of caches for this backend (set in Transformer::KvOptions); an empty
  // factory means KvCache's own host storage.
  virtual KvStorageFactory StorageFactory() = 0;

  // True when `kv`'s storage was made by this backend's StorageFactory.
  virtual bool OwnsStorage(const KvCache& kv) const = 0;

  // The model's LoRA adapter changed; the backend picks it up before its next forward.
  virtual void LoraChanged() = 0;

  // The longest causal extend whose every token gets the KV and logits that one-token extends
  // would give it, bit for bit (when its batch is that extend alone); 0 when the backend promises
  // no such thing. The engine replays a migrated sequence's tokens in extends this long, so that
  // their KV is the one its first verifier decoded them with.
  virtual int ExactExtendTokens() const { return 0; }
};

}  // namespace tandem
