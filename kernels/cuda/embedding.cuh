// Embedding gather: out[t, :] = table[ids[t], :]. bf16 rows copied bit for bit (the CPU path's
// memcpy of the embedding row, kernels/cuda API pattern as in rmsnorm.cuh).
//
// Token ids live in device memory, so Check() cannot see them. Contract: the caller validates
// ids on the host before they are uploaded (CheckTokenIds, or the engine's own request
// validation); device code clamps an out-of-range id into [0, vocab) so a bad id reads a wrong
// row instead of faulting, and never writes outside `out`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

struct EmbeddingParams {
  const int32_t* ids = nullptr;          // [tokens] device; each in [0, vocab) (clamped if not)
  const __nv_bfloat16* table = nullptr;  // [vocab, hidden]
  __nv_bfloat16* out = nullptr;          // [tokens, out_stride], first `hidden` of each row
  int tokens = 0;                        // 0 is a valid no-op
  int vocab = 0;                         // > 0
  int hidden = 0;                        // > 0
  int out_stride = 0;                    // elements between output rows, >= hidden
  void* workspace = nullptr;             // unused (WorkspaceBytes is 0)
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only, pointers are not dereferenced.
  absl::Status Check() const;
};

// Host-side validation of token ids before upload: INVALID_ARGUMENT naming the first id outside
// [0, vocab) and its index.
absl::Status CheckTokenIds(std::span<const int32_t> ids, int vocab);

size_t WorkspaceBytes(const EmbeddingParams& params);

// Enqueues the gather on `stream` after Check(); no allocation, no synchronisation.
absl::Status Invoke(const EmbeddingParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
