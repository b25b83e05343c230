#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kv_commit.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Grid (sequence, layer, K or V); threads stride over the row's columns. Each thread walks the
// kept indices in order for its own columns, which preserves KvCache::Commit's sequential order
// (see the header) without barriers.
__global__ void CommitKernel(__nv_bfloat16* k_cache, __nv_bfloat16* v_cache, int64_t layer_stride,
                             int block_size, int row_elements, const int32_t* block_tables,
                             const int32_t* keep, const KvCommitSequence* sequences) {
  const KvCommitSequence s = sequences[blockIdx.x];
  __nv_bfloat16* pool =
      (blockIdx.z == 0 ? k_cache : v_cache) + static_cast<int64_t>(blockIdx.y) * layer_stride;
  const int32_t* table = block_tables + s.block_table_offset;
  auto row = [&](int slot) {
    return pool +
           (static_cast<int64_t>(table[slot / block_size]) * block_size + slot % block_size) *
               row_elements;
  };
  for (int j = 0; j < s.keep_count; ++j) {
    const int from_index = keep[s.keep_offset + j];
    if (from_index == j) continue;
    const __nv_bfloat16* from = row(s.committed + from_index);
    __nv_bfloat16* to = row(s.committed + j);
    for (int c = threadIdx.x; c < row_elements; c += blockDim.x) to[c] = from[c];
  }
}

}  // namespace

absl::Status KvCommitParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("KvCommitParams.", parts...));
  };
  if (num_sequences < 0) return bad("num_sequences must be >= 0, got ", num_sequences);
  if (num_layers <= 0 || num_layers > 65535) {
    return bad("num_layers must be in [1, 65535], got ", num_layers);
  }
  if (block_size <= 0) return bad("block_size must be > 0, got ", block_size);
  if (row_elements <= 0) return bad("row_elements must be > 0, got ", row_elements);
  if (num_layers > 1 && layer_stride < static_cast<int64_t>(block_size) * row_elements) {
    return bad("layer_stride ", layer_stride, " is below one block (", block_size * row_elements,
               " elements)");
  }
  if (num_sequences == 0) return absl::OkStatus();
  if (k_cache == nullptr) return bad("k_cache is null");
  if (v_cache == nullptr) return bad("v_cache is null");
  if (block_tables == nullptr) return bad("block_tables is null");
  if (keep == nullptr) return bad("keep is null");
  if (sequences == nullptr) return bad("sequences is null");
  if (k_cache == v_cache) return bad("v_cache is k_cache");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const KvCommitParams& /*params*/) { return 0; }

absl::Status Invoke(const KvCommitParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.num_sequences == 0) return absl::OkStatus();
  const int threads = std::min(kThreads, internal::CeilDiv(params.row_elements, 32) * 32);
  const dim3 grid(params.num_sequences, params.num_layers, 2);
  CommitKernel<<<grid, threads, 0, stream>>>(params.k_cache, params.v_cache, params.layer_stride,
                                             params.block_size, params.row_elements,
                                             params.block_tables, params.keep, params.sequences);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
