// RMSNorm over the last dimension, alone or fused with the residual add that precedes it in a
// pre-norm transformer block. bf16 in memory, fp32 for every sum and product.
//
// Kernel API pattern shared by every op in kernels/cuda:
//   XxxParams p{...};              // device pointers + sizes; every pointer carries its shape
//   p.workspace_bytes = WorkspaceBytes(p);
//   p.workspace = <caller-owned device buffer of that size, or nullptr when 0>;
//   TANDEM_RETURN_IF_ERROR(Invoke(p, stream));   // runs p.Check() first; asynchronous on stream
// Ops never allocate or synchronise; the caller owns memory and streams.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// Without residual (plain RMSNorm, reference kernels/cpu RmsNorm):
//   y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight
// With residual (reference kernels/cpu AddRmsNorm, x playing the role of delta):
//   residual[r, :] = bf16(residual[r, :] + x[r, :])    (updated in place)
//   y[r, :] = RmsNorm(residual[r, :])                  (of the rounded bf16 sum: what the next
//                                                       layer's residual stream will hold)
struct RmsNormParams {
  const __nv_bfloat16* x = nullptr;       // [rows, dim] input, or the delta added to residual
  __nv_bfloat16* residual = nullptr;      // [rows, dim] optional (nullptr: plain RMSNorm)
  const __nv_bfloat16* weight = nullptr;  // [dim]
  __nv_bfloat16* y = nullptr;             // [rows, dim] output; may alias x, never residual
  int rows = 0;                           // 0 is a valid no-op
  int dim = 0;                            // > 0
  float eps = 1e-6f;                      // finite, >= 0
  void* workspace = nullptr;              // [workspace_bytes] device memory, caller-owned
  size_t workspace_bytes = 0;             // >= WorkspaceBytes(*this)

  // OK when the fields describe a launchable problem; INVALID_ARGUMENT naming the bad field
  // otherwise. Pure host check: needs no GPU and does not dereference the pointers.
  absl::Status Check() const;
};

// Device workspace Invoke needs for these params (currently 0: one CTA owns a whole row).
size_t WorkspaceBytes(const RmsNormParams& params);

// Enqueues the op on `stream` after params.Check(); returns launch errors, not asynchronous
// execution errors (those surface at the caller's next synchronisation).
absl::Status Invoke(const RmsNormParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
