// KV write: the new tokens' K and V rows of one layer scattered to their paged-cache rows, as the
// CPU engine's memcpy into KvCache::KeyRow / ValueRow before attention. Rows copied bit for bit.
//
// Device-side contract: slots are pool rows (block * block_size + offset, from the sequence's
// block table on the host); a negative slot skips the token (padding rows of a captured decode
// graph); a slot >= pool_rows is clamped into the pool instead of writing outside it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

struct KvWriteParams {
  const __nv_bfloat16* k = nullptr;  // [tokens, row_elements], row stride k_stride
  int k_stride = 0;
  const __nv_bfloat16* v = nullptr;  // [tokens, row_elements], row stride v_stride
  int v_stride = 0;
  const int64_t* slots = nullptr;    // [tokens] device: pool row per token, < 0 = skip
  __nv_bfloat16* k_cache = nullptr;  // [pool_rows, row_elements] one layer's K pool
  __nv_bfloat16* v_cache = nullptr;  // [pool_rows, row_elements] one layer's V pool
  int64_t pool_rows = 0;             // > 0
  int tokens = 0;                    // 0 is a valid no-op
  int row_elements = 0;              // kv_heads * head_dim, > 0
  void* workspace = nullptr;         // unused (WorkspaceBytes is 0)
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

size_t WorkspaceBytes(const KvWriteParams& params);

absl::Status Invoke(const KvWriteParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
