#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_skinny.cuh"
#include "kernels/cuda/gemv.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
constexpr int kBiasThreads = 256;

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat(float v) {
  return __float2bfloat16(v);
}

// y[r, c] += bias[c]; grid (rows, column blocks).
template <typename T>
__global__ void AddBiasKernel(T* y, const __nv_bfloat16* bias, int n, int ldy) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= n) return;
  T* at = y + static_cast<size_t>(blockIdx.x) * ldy + c;
  *at = FromFloat<T>(ToFloat(*at) + __bfloat162float(bias[c]));
}

}  // namespace

absl::Status CublasStatusToStatus(cublasStatus_t status, const char* expression) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(expression, " failed: ", cublasGetStatusName(status),
                                           " (", cublasGetStatusString(status), ")");
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

#define TANDEM_CUBLAS_RETURN_IF_ERROR(expr)                                      \
  do {                                                                           \
    if (const absl::Status s_ = CublasStatusToStatus((expr), #expr); !s_.ok()) { \
      return s_;                                                                 \
    }                                                                            \
  } while (false)

absl::Status GemmParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("GemmParams.", parts...));
  };
  if (m < 0) return bad("m must be >= 0, got ", m);
  if (n <= 0) return bad("n must be > 0, got ", n);
  if (k <= 0) return bad("k must be > 0, got ", k);
  if (ldx < k) return bad("ldx ", ldx, " is below k ", k);
  if (ldw < k) return bad("ldw ", ldw, " is below k ", k);
  if (ldy < n) return bad("ldy ", ldy, " is below n ", n);
  if (!std::isfinite(alpha) || !std::isfinite(beta)) return bad("alpha and beta must be finite");
  if (m == 0) return absl::OkStatus();
  if (handle == nullptr) return bad("handle is null");
  if (x == nullptr) return bad("x is null");
  if (w == nullptr) return bad("w is null");
  if (y == nullptr) return bad("y is null");
  const size_t needed = WorkspaceBytes(*this);
  if (workspace_bytes < needed || workspace == nullptr) {
    return bad("workspace: ", needed, " bytes required, got ", workspace_bytes,
               workspace == nullptr ? " at null" : "");
  }
  const size_t y_bytes = (static_cast<size_t>(m - 1) * ldy + n) *
                         (y_type == GemmOutput::kBf16 ? sizeof(__nv_bfloat16) : sizeof(float));
  const size_t x_bytes = (static_cast<size_t>(m - 1) * ldx + k) * sizeof(__nv_bfloat16);
  const size_t w_bytes = (static_cast<size_t>(n - 1) * ldw + k) * sizeof(__nv_bfloat16);
  if (internal::Overlap(y, y_bytes, x, x_bytes)) return bad("y overlaps x");
  if (internal::Overlap(y, y_bytes, w, w_bytes)) return bad("y overlaps w");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const GemmParams& /*params*/) { return kCublasWorkspaceBytes; }

absl::Status Invoke(const GemmParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.m == 0) return absl::OkStatus();
  if (internal::GemvApplies(params)) return internal::InvokeGemv(params, stream);
  if (internal::SkinnyApplies(params)) return internal::InvokeSkinny(params, stream);
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(params.handle, stream));
  TANDEM_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(params.handle, params.workspace, params.workspace_bytes));
  const cudaDataType_t y_type = params.y_type == GemmOutput::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Column-major view: Y^T[n, m] = W[n, k] · X^T[k, m]; W row-major [n, k] is column-major
  // [k, n] (transposed by cuBLAS), X row-major [m, k] is column-major [k, m].
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      params.handle, CUBLAS_OP_T, CUBLAS_OP_N, params.n, params.m, params.k, &params.alpha,
      params.w, CUDA_R_16BF, params.ldw, params.x, CUDA_R_16BF, params.ldx, &params.beta, params.y,
      y_type, params.ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (params.bias != nullptr) {
    const int threads = std::min(kBiasThreads, internal::CeilDiv(params.n, 32) * 32);
    const dim3 grid(params.m, internal::CeilDiv(params.n, threads));
    if (params.y_type == GemmOutput::kBf16) {
      AddBiasKernel<<<grid, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(params.y),
                                                  params.bias, params.n, params.ldy);
    } else {
      AddBiasKernel<<<grid, threads, 0, stream>>>(static_cast<float*>(params.y), params.bias,
                                                  params.n, params.ldy);
    }
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
