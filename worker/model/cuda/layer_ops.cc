#include "worker/model/cuda/layer_ops.h"

#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/rmsnorm.cuh"

namespace tandem::cuda_backend {

namespace kcu = kernels::cuda;

absl::Status UploadBf16(DeviceArray<__nv_bfloat16>& out, const std::vector<float>& host) {
  std::vector<__nv_bfloat16> converted(host.size());
  // On every core: an 8B-parameter model converts 8e9 values.
#pragma omp parallel for schedule(static) if (host.size() > (size_t{1} << 20))
  for (size_t i = 0; i < host.size(); ++i) converted[i] = __float2bfloat16(host[i]);
  return out.Upload(converted.data(), converted.size());
}

absl::Status LinearGemm(cublasHandle_t handle, const DeviceArray<char>& workspace,
                        cudaStream_t stream, const __nv_bfloat16* x, int ldx,
                        const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y, int ldy,
                        bool fp32_out, int m, int n, int k) {
  kcu::GemmParams p;
  p.handle = handle;
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.y_type = fp32_out ? kcu::GemmOutput::kFloat32 : kcu::GemmOutput::kBf16;
  p.m = m;
  p.n = n;
  p.k = k;
  p.ldx = ldx;
  p.ldw = k;
  p.ldy = ldy;
  p.workspace = workspace.get();
  p.workspace_bytes = workspace.bytes();
  return kcu::Invoke(p, stream);
}

absl::Status RmsNorm(cudaStream_t stream, float eps, const __nv_bfloat16* x,
                     __nv_bfloat16* residual, const __nv_bfloat16* weight, __nv_bfloat16* y,
                     int rows, int dim) {
  kcu::RmsNormParams p;
  p.x = x;
  p.residual = residual;
  p.weight = weight;
  p.y = y;
  p.rows = rows;
  p.dim = dim;
  p.eps = eps;
  return kcu::Invoke(p, stream);
}

}  // namespace tandem::cuda_backend
