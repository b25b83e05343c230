#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/rmsnorm.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMaxThreads = 1024;
// 8 bf16 = one 16-byte transaction per thread; used when every row start is 16-byte aligned.
constexpr int kVectorWidth = 8;

// kWidth consecutive bf16 elements moved as one load/store.
template <int kWidth>
struct alignas(sizeof(__nv_bfloat16) * kWidth) Pack {
  __nv_bfloat16 v[kWidth];
};

// Sum of `value` over the CTA, returned to every thread. blockDim.x is a multiple of 32 (full
// warps for the shuffles); `shared` holds one partial per warp.
__device__ float BlockSum(float value, float* shared) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  value = lane < warps ? shared[lane] : 0.0f;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// One CTA per row. Pass 1 forms the (residual-added) row and its sum of squares; pass 2 scales
// it. Each thread touches the same packs in both passes, so pass 2 sees its own pass-1 stores,
// and the __syncthreads in BlockSum orders every pass-1 read of x before any store to y (y may
// alias x).
template <int kWidth, bool kResidual>
__global__ void RmsNormKernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                              const __nv_bfloat16* weight, __nv_bfloat16* y, int dim, float eps) {
  __shared__ float partials[kMaxThreads / kWarpSize];
  internal::LetDependentsStart();  // the next projection may start streaming its weights
  const size_t row_start = static_cast<size_t>(blockIdx.x) * static_cast<size_t>(dim);
  const int packs = dim / kWidth;
  const auto* x_row = reinterpret_cast<const Pack<kWidth>*>(x + row_start);
  auto* residual_row = reinterpret_cast<Pack<kWidth>*>(residual + (kResidual ? row_start : 0));
  const auto* weight_packs = reinterpret_cast<const Pack<kWidth>*>(weight);
  auto* y_row = reinterpret_cast<Pack<kWidth>*>(y + row_start);

  float sum_squares = 0.0f;
  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    const Pack<kWidth> in = x_row[i];
    if constexpr (kResidual) {
      Pack<kWidth> sum = residual_row[i];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        sum.v[k] = __float2bfloat16(__bfloat162float(sum.v[k]) + __bfloat162float(in.v[k]));
        const float rounded = __bfloat162float(sum.v[k]);
        sum_squares += rounded * rounded;
      }
      residual_row[i] = sum;
    } else {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        const float value = __bfloat162float(in.v[k]);
        sum_squares += value * value;
      }
    }
  }
  const float scale = rsqrtf(BlockSum(sum_squares, partials) / static_cast<float>(dim) + eps);

  for (int i = threadIdx.x; i < packs; i += blockDim.x) {
    const Pack<kWidth> in = kResidual ? residual_row[i] : x_row[i];
    const Pack<kWidth> w = weight_packs[i];
    Pack<kWidth> out;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      out.v[k] = __float2bfloat16(__bfloat162float(in.v[k]) * scale * __bfloat162float(w.v[k]));
    }
    y_row[i] = out;
  }
}

bool Aligned(const void* pointer, size_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// True when [a, a + bytes) and [b, b + bytes) share at least one byte.
bool Overlap(const void* a, const void* b, size_t bytes) {
  const auto begin_a = reinterpret_cast<uintptr_t>(a);
  const auto begin_b = reinterpret_cast<uintptr_t>(b);
  return begin_a < begin_b + bytes && begin_b < begin_a + bytes;
}

template <int kWidth, bool kResidual>
void Launch(const RmsNormParams& params, cudaStream_t stream) {
  const int packs = params.dim / kWidth;
  const int threads = std::min(kMaxThreads, (packs + kWarpSize - 1) / kWarpSize * kWarpSize);
  RmsNormKernel<kWidth, kResidual><<<params.rows, threads, 0, stream>>>(
      params.x, params.residual, params.weight, params.y, params.dim, params.eps);
}

}  // namespace

absl::Status RmsNormParams::Check() const {
  if (dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormParams.dim must be > 0, got ", dim));
  }
  if (rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormParams.rows must be >= 0, got ", rows));
  }
  if (!std::isfinite(eps) || eps < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormParams.eps must be finite and >= 0, got ", eps));
  }
  const size_t needed = WorkspaceBytes(*this);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormParams.workspace: ", needed,
                                                   " bytes required, got ", workspace_bytes,
                                                   workspace == nullptr ? " at null" : ""));
  }
  if (rows == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("RmsNormParams.x is null");
  if (weight == nullptr) return absl::InvalidArgumentError("RmsNormParams.weight is null");
  if (y == nullptr) return absl::InvalidArgumentError("RmsNormParams.y is null");
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(dim) * sizeof(*x);
  if (y != x && Overlap(x, y, bytes)) {
    return absl::InvalidArgumentError(
        "RmsNormParams.y partially overlaps x; it must be x itself or disjoint from it");
  }
  if (residual != nullptr && Overlap(residual, y, bytes)) {
    return absl::InvalidArgumentError(
        "RmsNormParams.residual overlaps y; both are outputs and must be disjoint");
  }
  if (residual != nullptr && Overlap(residual, x, bytes)) {
    return absl::InvalidArgumentError(
        "RmsNormParams.residual overlaps x; residual is updated in place and x is read");
  }
  return absl::OkStatus();
}

size_t WorkspaceBytes(const RmsNormParams& /*params*/) { return 0; }

absl::Status Invoke(const RmsNormParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.rows == 0) return absl::OkStatus();
  const size_t vector_bytes = sizeof(Pack<kVectorWidth>);
  const bool vectorized = params.dim % kVectorWidth == 0 && Aligned(params.x, vector_bytes) &&
                          Aligned(params.y, vector_bytes) && Aligned(params.weight, vector_bytes) &&
                          Aligned(params.residual, vector_bytes);
  const bool has_residual = params.residual != nullptr;
  if (vectorized && has_residual) {
    Launch<kVectorWidth, true>(params, stream);
  } else if (vectorized) {
    Launch<kVectorWidth, false>(params, stream);
  } else if (has_residual) {
    Launch<1, true>(params, stream);
  } else {
    Launch<1, false>(params, stream);
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
