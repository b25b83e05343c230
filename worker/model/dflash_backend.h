// Where a DFlashModel runs: DFlashModel keeps the configuration, the fp32 host weights and the
// argument checks, and hands checked calls to its backend — CpuDFlash
// (worker/model/cpu_dflash.h) unless UseDevice attached another (CudaDFlash). The backend owns
// its copies of the weights and makes the storage of the contexts that live with it; that
// storage is opaque to everything but the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// cudaStream_t is `CUstream_st*`; naming the struct keeps CUDA headers out of CPU builds.
struct CUstream_st;

namespace tandem {

// The context rows of one DFlashContext on a backend's device.
class DFlashContextStorage {
 public:
  virtual ~DFlashContextStorage() = default;
};

class DFlashBackend {
 public:
  virtual ~DFlashBackend() = default;

  // Empty storage for a context on this backend's device.
  virtual absl::StatusOr<std::unique_ptr<DFlashContextStorage>> NewStorage() = 0;
  // True when `storage` was made by this backend's NewStorage.
  virtual bool Owns(const DFlashContextStorage& storage) const = 0;

  // Every call below gets arguments DFlashModel checked: `length` is the context's length, and
  // storage is this backend's (or null for an empty context that has none yet).

  // Appends `n` rows at positions [length, length + n). `hidden`: host fp32
  // [taps, n, hidden_size].
  virtual absl::Status AppendHost(DFlashContextStorage& storage, int length,
                                  std::span<const float> hidden, int n) = 0;
  // The same from device rows: bf16 [taps, n, hidden_size] in device memory, readable once the
  // work queued on `stream` so far has run. The backend's reads are ordered after that work, and
  // work queued on `stream` after the call runs after those reads, so the caller may reuse the
  // rows in stream order.
  virtual absl::Status AppendDevice(DFlashContextStorage& storage, int length, const void* rows,
                                    int n, CUstream_st* stream) = 0;

  // `block`: block_size tokens (the clean ones, then masks) at positions length ...
  // Logits [block_size, vocab].
  virtual absl::StatusOr<std::vector<float>> BlockLogits(const DFlashContextStorage* storage,
                                                         int length,
                                                         std::span<const int32_t> block) = 0;
  // The argmax of slots first .. block_size - 1.
  virtual absl::StatusOr<std::vector<int32_t>> Draft(const DFlashContextStorage* storage,
                                                     int length, std::span<const int32_t> block,
                                                     int first) = 0;

  // The rows [0, length) as fp32: keys and values [layers][length, kv_heads * head_dim].
  virtual absl::Status Read(const DFlashContextStorage& storage, int length,
                            std::vector<std::vector<float>>& keys,
                            std::vector<std::vector<float>>& values) = 0;
};

}  // namespace tandem
