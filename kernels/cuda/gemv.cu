#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

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

// Grid: ceil(n * S / kGemvWarps) CTAs; the S consecutive warps w of CTA b with the same w / S
// own column c = b * (kGemvWarps / S) + w / S, each one of S near-equal slices of k (split-k:
// a short product gets S times as many warps streaming its weights). Lane l reads the 16-byte
// vectors begin + l, begin + l + 32, ... of its slice of weight row c and the same vectors of
// each x row. With S > 1 the slices' sums meet in shared memory, added in slice order.
template <int M, int S, typename T>
__global__ void __launch_bounds__(kGemvThreads)
    GemvKernel(const __nv_bfloat16* __restrict__ x, int ldx, const __nv_bfloat16* __restrict__ w,
               int ldw, const __nv_bfloat16* __restrict__ bias, T* y, int ldy, int n, int k,
               float alpha, float beta) {
  static_assert(kGemvWarps % S == 0, "a CTA holds whole columns");
  __shared__ float partial[S > 1 ? kGemvWarps : 1][M];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int c = blockIdx.x * (kGemvWarps / S) + warp / S;
  const int slice = warp % S;
  const int vectors = k / kVector;
  const int end = static_cast<int>(static_cast<int64_t>(vectors) * (slice + 1) / S);
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;

  if (c < n) {
    const uint4* row = reinterpret_cast<const uint4*>(w + static_cast<size_t>(c) * ldw);
    const int x_stride = ldx / kVector;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    // The first round of weight loads goes out before waiting for the kernel that writes x:
    // with a programmatic launch this overlaps that kernel (the weights never depend on it).
    int v = static_cast<int>(static_cast<int64_t>(vectors) * slice / S) + lane;
    uint4 wv[kUnroll];
    bool full = v + (kUnroll - 1) * kWarpSize < end;
    if (full) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(row + v + u * kWarpSize);  // read once
    }
    WaitForPrecedingKernel();
    // Full rounds: kUnroll loads per lane issued before any is used.
    while (full) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int r = 0; r < M; ++r) {
          AccumulateVector(wv[u], __ldg(xv + static_cast<size_t>(r) * x_stride + v + u * kWarpSize),
                           acc[r]);
        }
      }
      v += kUnroll * kWarpSize;
      full = v + (kUnroll - 1) * kWarpSize < end;
      if (full) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(row + v + u * kWarpSize);
      }
    }
    for (; v < end; v += kWarpSize) {
      const uint4 tail = __ldcs(row + v);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        AccumulateVector(tail, __ldg(xv + static_cast<size_t>(r) * x_stride + v), acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = WarpSum(acc[r]);
  if constexpr (S > 1) {
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < M; ++r) partial[warp][r] = acc[r];
    }
    __syncthreads();  // every warp reaches it: columns past n only add zeros
    if (slice != 0) return;
#pragma unroll
    for (int r = 0; r < M; ++r) {
      acc[r] = partial[warp][r];
#pragma unroll
      for (int s = 1; s < S; ++s) acc[r] += partial[warp + s][r];
    }
  }
  if (c >= n) return;
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

// Warps per column: the fewest (1, 2, 4 or 8) that give the product kSplitWarps warps in all,
// while every warp keeps at least one full round of loads per lane (k / 8 / S >= 32 * kUnroll).
// TANDEM_CUDA_GEMV_SPLIT=0 keeps one warp per column (read once per process; for side-by-side
// timings).
constexpr int kSplitWarps = 16384;  // 2048 CTAs: about 15 per multiprocessor of an H100/H200

int SplitFor(int n, int k) {
  static const bool enabled = SwitchOn("TANDEM_CUDA_GEMV_SPLIT");
  if (!enabled) return 1;
  int split = 1;
  while (split < 8 && static_cast<int64_t>(n) * split < kSplitWarps &&
         k / kVector / (2 * split) >= kWarpSize * kUnroll) {
    split *= 2;
  }
  return split;
}

template <typename T>
absl::Status Launch(const GemmParams& p, T* y, cudaStream_t stream) {
  const int split = SplitFor(p.n, p.k);
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(CeilDiv(p.n, kGemvWarps / split));
  config.blockDim = dim3(kGemvThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = ProgrammaticLaunch() ? 1 : 0;
  const auto launch = [&](auto kernel) {
    return cudaLaunchKernelEx(&config, kernel, p.x, p.ldx, p.w, p.ldw, p.bias, y, p.ldy, p.n, p.k,
                              p.alpha, p.beta);
  };
  // One instance per (rows, warps per column).
  const auto for_rows = [&](auto rows) -> cudaError_t {
    constexpr int M = decltype(rows)::value;
    switch (split) {
      case 1:
        return launch(GemvKernel<M, 1, T>);
      case 2:
        return launch(GemvKernel<M, 2, T>);
      case 4:
        return launch(GemvKernel<M, 4, T>);
      default:
        return launch(GemvKernel<M, 8, T>);
    }
  };
  static_assert(kGemvMaxRows == 2, "one case per row count below");
  switch (p.m) {
    case 1:
      TANDEM_CUDA_RETURN_IF_ERROR(for_rows(std::integral_constant<int, 1>()));
      break;
    case 2:
      TANDEM_CUDA_RETURN_IF_ERROR(for_rows(std::integral_constant<int, 2>()));
      break;
    default:
      return absl::InternalError("GemvKernel launched with m outside [1, kGemvMaxRows]");
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

bool GemvEnabled() {
  static const bool enabled = SwitchOn("TANDEM_CUDA_GEMV");
  return enabled;
}

}  // namespace

int ComputeCapabilityMajor() {
  // Per device: 0 not yet asked, else the major version.
  static std::array<std::atomic<int>, 64> known{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 ||
      device >= static_cast<int>(known.size())) {
    (void)cudaGetLastError();
    return 0;
  }
  int major = known[device].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    known[device].store(major, std::memory_order_relaxed);
  }
  return major;
}

bool ProgrammaticLaunch() {
  static const bool enabled = SwitchOn("TANDEM_CUDA_PDL");
  return enabled && ComputeCapabilityMajor() >= 9;
}

bool GemvApplies(const GemmParams& params) {
  return params.m >= 1 && params.m <= kGemvMaxRows && params.k % kVector == 0 &&
         params.ldx % kVector == 0 && params.ldw % kVector == 0 && Aligned(params.x, 16) &&
         Aligned(params.w, 16) && GemvEnabled();
}

absl::Status InvokeGemv(const GemmParams& params, cudaStream_t stream) {
  if (params.y_type == GemmOutput::kBf16) {
    return Launch(params, static_cast<__nv_bfloat16*>(params.y), stream);
  }
  return Launch(params, static_cast<float*>(params.y), stream);
}

}  // namespace tandem::kernels::cuda::internal
