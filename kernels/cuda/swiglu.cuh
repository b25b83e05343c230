// SwiGLU activation of the fused gate/up projection, as kernels/cpu SiluMulFused:
//   out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i],  silu(g) = g / (1 + exp(-g))
// bf16 in memory, fp32 arithmetic, one rounding to bf16 at the end.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

struct SwiGluParams {
  const __nv_bfloat16* gate_up = nullptr;  // [rows, 2 * inter]: gate columns, then up columns
  __nv_bfloat16* out = nullptr;            // [rows, inter]; disjoint from gate_up
  int rows = 0;                            // 0 is a valid no-op
  int inter = 0;                           // > 0
  void* workspace = nullptr;               // unused (WorkspaceBytes is 0)
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

size_t WorkspaceBytes(const SwiGluParams& params);

absl::Status Invoke(const SwiGluParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
