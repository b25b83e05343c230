// KV storage of the CUDA backend: bf16 K and V pools in GPU memory, layer-major
// ([num_layers, num_blocks, block_size, kv_heads, head_dim], the layout kernels/cuda kv_commit
// expects), indexed by the host KvCache's block tables.
//
// KvCache::Commit's row moves are queued on the host and applied by Flush() as one kv_commit
// launch on the backend's stream; the backend flushes before each forward, the only reader and
// writer of the pools. A second commit of a sequence already queued flushes the queue first, so
// one launch never holds two commits of the same sequence.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/kv_commit.cuh"
#include "worker/kv/kv_cache.h"
#include "worker/model/cuda/device_array.h"

namespace tandem::cuda_backend {

class CudaKvStorage final : public KvStorage {
 public:
  // Allocates and zeroes the pools (an allocation failure is kept in status()). `stream` and
  // `owner` (the backend that made the storage) must outlive it.
  static std::unique_ptr<CudaKvStorage> Create(const KvCacheOptions& options, cudaStream_t stream,
                                               const void* owner);

  void Commit(SeqId seq, std::span<const int32_t> blocks, int committed,
              std::span<const int32_t> keep) override;
  // Flushes queued commits, then copies the block's rows of every layer on the stream (one
  // strided copy for K and one for V); an error is kept in status().
  void CopyBlock(int32_t from, int32_t to) override;
  size_t ElementBytes() const override { return sizeof(__nv_bfloat16); }
  // Flushes queued commits, then kernels/cuda FillUniform over both pools on the stream.
  absl::Status Randomize(uint64_t seed, float half_width) override;

  // The allocation error, if the pools could not be made (the factory cannot return one), or
  // the error of a flush.
  const absl::Status& status() const { return status_; }
  // Enqueues the queued row moves on the stream as one kv_commit launch.
  absl::Status Flush();
  size_t pending_commits() const { return sequences_.size(); }

  const void* owner() const { return owner_; }
  // Unique per storage made in this process (graphs captured on one storage's pools are not
  // reused on another's).
  uint64_t id() const { return id_; }
  int64_t pool_rows() const { return pool_rows_; }
  int block_size() const { return options_.block_size; }
  __nv_bfloat16* keys(int layer) const { return keys_.get() + layer * layer_stride_; }
  __nv_bfloat16* values(int layer) const { return values_.get() + layer * layer_stride_; }

 private:
  CudaKvStorage(const KvCacheOptions& options, cudaStream_t stream, const void* owner);

  KvCacheOptions options_;
  cudaStream_t stream_;
  const void* owner_;
  uint64_t id_;
  absl::Status status_;
  int64_t pool_rows_ = 0;
  int64_t layer_stride_ = 0;
  DeviceArray<__nv_bfloat16> keys_;
  DeviceArray<__nv_bfloat16> values_;
  // Queued commits (host) and their device copies.
  std::vector<int32_t> tables_;
  std::vector<int32_t> keep_;
  std::vector<kernels::cuda::KvCommitSequence> sequences_;
  std::unordered_set<SeqId> queued_;
  DeviceArray<int32_t> tables_device_;
  DeviceArray<int32_t> keep_device_;
  DeviceArray<kernels::cuda::KvCommitSequence> sequences_device_;
};

}  // namespace tandem::cuda_backend
