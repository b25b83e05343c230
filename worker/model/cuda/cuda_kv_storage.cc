#include "worker/model/cuda/cuda_kv_storage.h"

#include <atomic>
#include <utility>

#include "kernels/cuda/device.h"
#include "kernels/cuda/fill.cuh"

namespace tandem::cuda_backend {

namespace kcu = kernels::cuda;

CudaKvStorage::CudaKvStorage(const KvCacheOptions& options, cudaStream_t stream, const void* owner)
    : options_(options), stream_(stream), owner_(owner) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1);
  options_.make_storage = nullptr;
  pool_rows_ = static_cast<int64_t>(options.num_blocks) * options.block_size;
  layer_stride_ = pool_rows_ * options.num_kv_heads * options.head_dim;
}

std::unique_ptr<CudaKvStorage> CudaKvStorage::Create(const KvCacheOptions& options,
                                                     cudaStream_t stream, const void* owner) {
  std::unique_ptr<CudaKvStorage> storage(new CudaKvStorage(options, stream, owner));
  const size_t elements = static_cast<size_t>(storage->layer_stride_) * options.num_layers;
  auto init = [&]() -> absl::Status {
    if (absl::Status s = storage->keys_.Reserve(elements); !s.ok()) return s;
    if (absl::Status s = storage->values_.Reserve(elements); !s.ok()) return s;
    // Zeroed pools: the rows a padded graph row reads are finite.
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(storage->keys_.get(), 0, storage->keys_.bytes(), stream));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(storage->values_.get(), 0, storage->values_.bytes(), stream));
    return absl::OkStatus();
  };
  storage->status_ = init();
  return storage;
}

void CudaKvStorage::Commit(SeqId seq, std::span<const int32_t> blocks, int committed,
                           std::span<const int32_t> keep) {
  if (queued_.contains(seq)) {
    absl::Status flushed = Flush();
    if (!flushed.ok() && status_.ok()) status_ = flushed;
  }
  kcu::KvCommitSequence s;
  s.block_table_offset = static_cast<int32_t>(tables_.size());
  s.committed = committed;
  s.keep_offset = static_cast<int32_t>(keep_.size());
  s.keep_count = static_cast<int32_t>(keep.size());
  tables_.insert(tables_.end(), blocks.begin(), blocks.end());
  keep_.insert(keep_.end(), keep.begin(), keep.end());
  sequences_.push_back(s);
  queued_.insert(seq);
}

absl::Status CudaKvStorage::Flush() {
  if (!status_.ok()) return status_;
  if (sequences_.empty()) return absl::OkStatus();
  auto upload = [&]() -> absl::Status {
    // Device buffers are replaced only when too small; cudaFree waits for a launch still
    // reading the old ones.
    if (absl::Status s = tables_device_.Reserve(tables_.size()); !s.ok()) return s;
    if (absl::Status s = keep_device_.Reserve(keep_.size()); !s.ok()) return s;
    if (absl::Status s = sequences_device_.Reserve(sequences_.size()); !s.ok()) return s;
    if (absl::Status s = tables_device_.UploadAsync(tables_.data(), tables_.size(), stream_);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = keep_device_.UploadAsync(keep_.data(), keep_.size(), stream_); !s.ok()) {
      return s;
    }
    if (absl::Status s =
            sequences_device_.UploadAsync(sequences_.data(), sequences_.size(), stream_);
        !s.ok()) {
      return s;
    }
    kcu::KvCommitParams p;
    p.k_cache = keys_.get();
    p.v_cache = values_.get();
    p.layer_stride = layer_stride_;
    p.num_layers = options_.num_layers;
    p.block_size = options_.block_size;
    p.row_elements = options_.num_kv_heads * options_.head_dim;
    p.block_tables = tables_device_.get();
    p.keep = keep_device_.get();
    p.sequences = sequences_device_.get();
    p.num_sequences = static_cast<int>(sequences_.size());
    return kcu::Invoke(p, stream_);
  };
  status_ = upload();
  tables_.clear();
  keep_.clear();
  sequences_.clear();
  queued_.clear();
  return status_;
}

void CudaKvStorage::CopyBlock(int32_t from, int32_t to) {
  auto copy = [&]() -> absl::Status {
    if (absl::Status flushed = Flush(); !flushed.ok()) return flushed;
    const size_t block_elements =
        static_cast<size_t>(options_.block_size) * options_.num_kv_heads * options_.head_dim;
    const size_t pitch = static_cast<size_t>(layer_stride_) * sizeof(__nv_bfloat16);
    const size_t width = block_elements * sizeof(__nv_bfloat16);
    for (__nv_bfloat16* pool : {keys_.get(), values_.get()}) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy2DAsync(pool + static_cast<size_t>(to) * block_elements, pitch,
                            pool + static_cast<size_t>(from) * block_elements, pitch, width,
                            options_.num_layers, cudaMemcpyDeviceToDevice, stream_));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = copy(); !s.ok() && status_.ok()) status_ = s;
}

absl::Status CudaKvStorage::Randomize(uint64_t seed, float half_width) {
  if (absl::Status flushed = Flush(); !flushed.ok()) return flushed;
  kcu::FillUniformParams p;
  p.half_width = half_width;
  p.data = keys_.get();
  p.count = keys_.size();
  p.seed = seed;
  if (absl::Status s = kcu::Invoke(p, stream_); !s.ok()) return s;
  p.data = values_.get();
  p.count = values_.size();
  p.seed = seed + 1;
  return kcu::Invoke(p, stream_);
}

}  // namespace tandem::cuda_backend
