// Helpers the CUDA model backends (CudaTransformer, CudaDFlash) share: weight upload in bf16 and
// the two ops every layer calls with the same settings, a bf16 linear product and RMSNorm.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "absl/status/status.h"
#include "worker/model/cuda/device_array.h"

namespace tandem::cuda_backend {

// `host` rounded to bf16 (nearest even) and uploaded into `out` (resized to fit).
absl::Status UploadBf16(DeviceArray<__nv_bfloat16>& out, const std::vector<float>& host);

// y[m, n] = x[m, k] · w[n, k]^T (+ bias[n] when not null), rows `ldx` / `ldy` apart, w dense;
// y in fp32 when `fp32_out`, else bf16. `workspace` is cuBLASLt's scratch.
absl::Status LinearGemm(cublasHandle_t handle, const DeviceArray<char>& workspace,
                        cudaStream_t stream, const __nv_bfloat16* x, int ldx,
                        const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y, int ldy,
                        bool fp32_out, int m, int n, int k);

// kernels/cuda RMSNorm over `rows` rows of `dim`: y = RmsNorm(x) · weight, or with `residual`
// the fused add (residual += x, y = RmsNorm(residual) · weight).
absl::Status RmsNorm(cudaStream_t stream, float eps, const __nv_bfloat16* x,
                     __nv_bfloat16* residual, const __nv_bfloat16* weight, __nv_bfloat16* y,
                     int rows, int dim);

}  // namespace tandem::cuda_backend
