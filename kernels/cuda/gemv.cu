#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemv.cuh"

namespace tandem::kernels::cuda::internal {
namespace {

constexpr int kGemvThreads = 256;  // 8 warps, one output column each
constexpr int kGemvWarps = kGemvThreads / kWarpSize;
constexpr int kVector = 8;  // bf16 values per 16-byte load
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

__device__ __forceinline__ void AccumulateVector(const uint4& w, const uint4& x, float& acc) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int i = 0; i < kVector / 2; ++i) {
    const float2 wf = __bfloat1622float2(wp[i]);
    const float2 xf = __bfloat1622float2(xp[i]);
    acc = fmaf(wf.x, xf.x, acc);
    acc = fmaf(wf.y, xf.y, acc);
  }
}

template <typename T>
__device__ __forceinline__ float Load(const T* p);
template <>
__device__ __forceinline__ float Load(const float* p) {
  return *p;
}
template <>
__device__ __forceinline__ float Load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ float RoundLike(float, float v) { return v; }
__device__ __forceinline__ float RoundLike(__nv_bfloat16, float v) {
  return __bfloat162float(__float2bfloat16(v));
}

// Grid: ceil(n / kGemvWarps) CTAs; warp w of CTA b owns column c = b * kGemvWarps + w. Lane l
// reads the 16-byte vectors l, l + 32, ... of weight row c and the same vectors of each x row.
template <int M, typename T>
__global__ void __launch_bounds__(kGemvThreads)
    GemvKernel(const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w,
               int ldw, const __nv_bfloat16* __restrict__ bias, T* y, int ldy, int n, int k,
               float alpha, float beta) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int c = blockIdx.x * kGemvWarps + warp;
  if (c >= n) return;
  const uint4* row = reinterpret_cast<const uint4*>(w + static_cast<size_t>(c) * ldw);
  const int vectors = k / kVector;
  const int x_stride = ldx / kVector;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;

  int v = lane;
  // Full rounds: kUnroll loads per lane issued before any is used.
  for (; v + (kUnroll - 1) * kWarpSize < vectors; v += kUnroll * kWarpSize) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(row + v + u * kWarpSize);  // streamed once
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < M; ++r) {
        AccumulateVector(wv[u], __ldg(xv + static_cast<size_t>(r) * x_stride + v + u * kWarpSize),
                         acc[r]);
      }
    }
  }
  for (; v < vectors; v += kWarpSize) {
    const uint4 wv = __ldcs(row + v);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      AccumulateVector(wv, __ldg(xv + static_cast<size_t>(r) * x_stride + v), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = WarpSum(acc[r]);
    // Lane r writes row r (M <= kGemvMaxRows < 32), so the stores of one column go out together.
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (lane != r) continue;
    T* out = y + static_cast<size_t>(r) * ldy + c;
    float value = alpha * acc[r];
    if (beta != 0.0f) value += beta * Load(out);
    if (bias != nullptr) value = RoundLike(T(), value) + __bfloat162float(bias[c]);
    Store(out, value);
  }
}

template <typename T>
absl::Status Launch(const GemmParams& p, T* y, cudaStream_t stream) {
  const dim3 grid(CeilDiv(p.n, kGemvWarps));
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kGemvThreads, 0, stream>>>(p.x, p.ldx, p.w, p.ldw, p.bias, y, p.ldy, p.n, p.k,
                                              p.alpha, p.beta);
  };
  static_assert(kGemvMaxRows == 2, "one case per row count below");
  switch (p.m) {
    case 1:
      launch(GemvKernel<1, T>);
      break;
    case 2:
      launch(GemvKernel<2, T>);
      break;
    default:
      return absl::InternalError("GemvKernel launched with m outside [1, kGemvMaxRows]");
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool GemvEnabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TANDEM_CUDA_GEMV");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

}  // namespace

bool GemvApplies(const GemmParams& params) {
  return params.m >= 1 && params.m <= kGemvMaxRows && params.k % kVector == 0 &&
         params.ldx % kVector == 0 && params.ldw % kVector == 0 && Aligned16(params.x) &&
         Aligned16(params.w) && GemvEnabled();
}

absl::Status InvokeGemv(const GemmParams& params, cudaStream_t stream) {
  if (params.y_type == GemmOutput::kBf16) {
    return Launch(params, static_cast<__nv_bfloat16*>(params.y), stream);
  }
  return Launch(params, static_cast<float*>(params.y), stream);
}

}  // namespace tandem::kernels::cuda::internal
