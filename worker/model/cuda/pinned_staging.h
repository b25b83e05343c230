// Page-locked host staging for a step's host-to-device uploads, for the CUDA backend.
//
// cudaMemcpyAsync from pageable memory is not asynchronous: the driver first copies the data
// into its own pinned bounce buffer, synchronously with respect to the host. Staging the
// step's inputs in memory allocated with cudaMallocHost lets the copy engine read them
// directly while the host goes on enqueueing.
//
// The price is lifetime: a staged copy reads its bytes when the stream reaches it, so they must
// stay untouched until then. The arena hands out space only forward within a step and is
// rewound by Reset, which its owner calls only once every copy staged before has completed
// (after a stream synchronisation). A step that outgrows the buffer gets a further block; the
// blocks in use stay alive until Reset, which then replaces them by one block of their total
// size, so a steady workload stages into a single buffer.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda_backend {

class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging() { FreeAll(); }

  // Rewinds to the start. Every copy from staged memory must have completed.
  absl::Status Reset() {
    if (blocks_.size() > 1) {
      size_t total = 0;
      for (const Block& b : blocks_) total += b.capacity;
      FreeAll();
      if (absl::Status status = AddBlock(total); !status.ok()) return status;
    }
    for (Block& b : blocks_) b.used = 0;
    return absl::OkStatus();
  }

  // Copies `bytes` bytes of `src` into page-locked memory and returns where; valid until the
  // next Reset.
  absl::StatusOr<const void*> Stage(const void* src, size_t bytes) {
    const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    if (blocks_.empty() || blocks_.back().capacity - blocks_.back().used < size) {
      const size_t last = blocks_.empty() ? 0 : blocks_.back().capacity;
      if (absl::Status status = AddBlock(std::max({size, 2 * last, kMinBlock})); !status.ok()) {
        return status;
      }
    }
    Block& b = blocks_.back();
    char* dst = b.data + b.used;
    if (bytes > 0) std::memcpy(dst, src, bytes);
    b.used += size;
    return dst;
  }

  // Bytes of page-locked memory held.
  size_t capacity() const {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.capacity;
    return total;
  }

 private:
  static constexpr size_t kAlign = 256;
  static constexpr size_t kMinBlock = size_t{64} << 10;

  struct Block {
    char* data = nullptr;
    size_t capacity = 0;
    size_t used = 0;
  };

  absl::Status AddBlock(size_t capacity) {
    void* raw = nullptr;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMallocHost(&raw, capacity));
    blocks_.push_back({static_cast<char*>(raw), capacity, 0});
    return absl::OkStatus();
  }

  void FreeAll() {
    for (const Block& b : blocks_) cudaFreeHost(b.data);
    blocks_.clear();
  }

  std::vector<Block> blocks_;
};

}  // namespace tandem::cuda_backend
