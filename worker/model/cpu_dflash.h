// The CPU backend of DFlashModel: fp32 context rows in host vectors and the block forward with
// kernels/cpu, the backend every DFlash drafter starts on (DFlashModel::UseDevice({Device::kCpu})
// returns to it).
//
// A context's rows: per layer, the K and V projections of each committed token's fused target
// taps (fc, hidden norm, then each layer's k/v rows with k-norm and RoPE on the keys). The
// block forward embeds the block with the target's embeddings, runs every layer with the
// block's queries attending to the context rows and the whole block, and ends with the final
// norm and the target's LM head.
//
// Thread-safety: the backend is stateless beyond its model; calls on one context are the
// caller's to serialise.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "worker/model/dflash.h"
#include "worker/model/dflash_backend.h"

namespace tandem {

// A context's rows on the host: [layers][rows, kv_heads * head_dim], RoPE applied to the keys.
// Rows at or past the context's length are stale (a truncation only moves the length; appends
// overwrite them).
class CpuDFlashContext final : public DFlashContextStorage {
 public:
  CpuDFlashContext(int layers, int kv_row) : keys(layers), values(layers), kv_row(kv_row) {}
  std::vector<std::vector<float>> keys;
  std::vector<std::vector<float>> values;
  const int kv_row;
};

class CpuDFlash final : public DFlashBackend {
 public:
  // `model` outlives the backend (it owns it).
  explicit CpuDFlash(const DFlashModel* model);

  absl::StatusOr<std::unique_ptr<DFlashContextStorage>> NewStorage() override;
  // Host rows of this model's shape (layers and K/V width): a CPU context moves between CPU
  // models of one shape, as host vectors always could.
  bool Owns(const DFlashContextStorage& storage) const override;
  absl::Status AppendHost(DFlashContextStorage& storage, int length, std::span<const float> hidden,
                          int n) override;
  // FailedPrecondition: device rows need the model on a GPU.
  absl::Status AppendDevice(DFlashContextStorage& storage, int length, const void* rows, int n,
                            CUstream_st* stream) override;
  absl::StatusOr<std::vector<float>> BlockLogits(const DFlashContextStorage* storage, int length,
                                                 std::span<const int32_t> block) override;
  absl::StatusOr<std::vector<int32_t>> Draft(const DFlashContextStorage* storage, int length,
                                             std::span<const int32_t> block, int first) override;
  absl::Status Read(const DFlashContextStorage& storage, int length,
                    std::vector<std::vector<float>>& keys,
                    std::vector<std::vector<float>>& values) override;

 private:
  const DFlashModel* model_;
  RopeTables rope_;
};

}  // namespace tandem
