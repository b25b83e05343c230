// KV commit/compaction on the device, as worker/kv/kv_cache.cc KvCache::Commit moves rows: for
// each sequence of the batch, the kept tentative slots committed + keep[j] move, in increasing
// j, to committed + j, in every layer's K and V pool. Block allocation and freeing stay on the
// host (the KvCache bookkeeping); this op only moves the rows.
//
// Device-side contract (the indices are on the device): keep is strictly increasing within a
// sequence and below its tentative count, as KvCache::Commit validates on the host before
// the call. Since keep[j] >= j, a row is always read before the move that overwrites it; each
// thread copies one column of the row for every j in order, so no barrier is needed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// One sequence's commit; an array of these lives in device memory.
struct KvCommitSequence {
  int32_t block_table_offset = 0;  // first entry of its block table in block_tables
  int32_t committed = 0;           // committed slots before this commit
  int32_t keep_offset = 0;         // first of its indices in keep
  int32_t keep_count = 0;          // kept tentative tokens
};

struct KvCommitParams {
  // Pools of all layers, layer-major: [num_layers, num_blocks, block_size, kv_heads, head_dim];
  // layer l starts layer_stride elements after layer l - 1.
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  int64_t layer_stride = 0;                     // >= num_blocks * block_size * row_elements
  int num_layers = 0;                           // > 0
  int block_size = 0;                           // > 0
  int row_elements = 0;                         // kv_heads * head_dim, > 0
  const int32_t* block_tables = nullptr;        // flat, see KvCommitSequence
  const int32_t* keep = nullptr;                // flat indices into each sequence's tentative slots
  const KvCommitSequence* sequences = nullptr;  // [num_sequences] device
  int num_sequences = 0;                        // 0 is a valid no-op
  void* workspace = nullptr;                    // unused (WorkspaceBytes is 0)
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

size_t WorkspaceBytes(const KvCommitParams& params);

absl::Status Invoke(const KvCommitParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
