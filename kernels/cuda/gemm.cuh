// Matrix product through cuBLAS, in the layout of kernels/cpu Linear (a Hugging Face Linear
// weight is [out_features, in_features]):
//   y[m, n] = alpha * x[m, k] · w[n, k]^T + beta * y[m, n]  (+ bias[n])
// bf16 x and w, fp32 accumulation (CUBLAS_COMPUTE_32F), y in bf16 or fp32. Row-major with row
// strides; cuBLAS sees the column-major transpose (y^T = w · x^T), so no copy is made.
//
// Products of at most 8 rows with 16-byte-aligned inputs take bandwidth-bound kernels of our
// own instead: 1-2 rows (batch-1 decode steps) kernels/cuda/gemv.cuh, 3-8 rows (short verify
// steps, small batches) the tensor-core kernel of kernels/cuda/gemm_skinny.cuh. TANDEM_CUDA_GEMV=0
// sends 1-2 rows to the skinny kernel, TANDEM_CUDA_SKINNY=0 sends what it would take to cuBLAS.
//
// The cuBLAS handle is the caller's (one per stream/thread, as cuBLAS requires). Invoke binds
// `stream` and the caller's workspace to the handle (cublasSetStream, cublasSetWorkspace), so
// cuBLAS itself allocates nothing during the call.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

enum class GemmOutput { kBf16, kFloat32 };

struct GemmParams {
  cublasHandle_t handle = nullptr;      // caller-owned
  const __nv_bfloat16* x = nullptr;     // [m, k], row stride ldx >= k
  const __nv_bfloat16* w = nullptr;     // [n, k], row stride ldw >= k
  const __nv_bfloat16* bias = nullptr;  // [n] optional, added after the product
  void* y = nullptr;                    // [m, n], row stride ldy >= n; bf16 or fp32
  GemmOutput y_type = GemmOutput::kBf16;
  int m = 0;  // 0 is a valid no-op
  int n = 0;  // > 0
  int k = 0;  // > 0
  int ldx = 0;
  int ldw = 0;
  int ldy = 0;
  float alpha = 1.0f;
  float beta = 0.0f;          // 1: accumulate into y (y is then read)
  void* workspace = nullptr;  // >= WorkspaceBytes, handed to cuBLAS
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

// cuBLAS workspace the product may use: 32 MiB, NVIDIA's recommendation for Hopper (enough for
// every algorithm cuBLAS picks on Ampere too).
size_t WorkspaceBytes(const GemmParams& params);

// cuBLAS status -> absl::Status naming the call.
absl::Status CublasStatusToStatus(cublasStatus_t status, const char* expression);

absl::Status Invoke(const GemmParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
