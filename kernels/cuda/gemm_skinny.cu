#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm_skinny.cuh"
#include "kernels/cuda/gemv.cuh"

namespace tandem::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kTileRows = 16;  // weight rows per warp: the mma's M
constexpr int kStep = 32;      // k values per lane group per step: 4 lanes x 8 values
constexpr int kUnroll = 4;     // steps whose weight loads go out together (8 per lane)

// acc (16 x 8, fp32) += a (16 x 16, bf16, row-major) · b (16 x 8, bf16, column-major).
__device__ __forceinline__ void Mma(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // SkinnyApplies keeps older devices off this path
#endif
}

__device__ __forceinline__ float Load(const float* p) { return *p; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void Store(float* p, float v) { *p = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ float RoundLike(float, float v) { return v; }
__device__ __forceinline__ float RoundLike(__nv_bfloat16, float v) {
  return __bfloat162float(__float2bfloat16(v));
}

// Grid: ceil(n / (16 * G)) CTAs. Warp w of CTA b owns weight rows (b * G + w / S) * 16 + [0, 16)
// and slice w % S of the k steps (S = 8 / G). Lane (g, t) = (lane / 4, lane % 4) loads, per step
// of 32 k values at k0, the 8 values k0 + 8t .. k0 + 8t + 7 of weight rows g and g + 8 and of
// x row (token) g: one 16-byte vector each. In mma terms, the step's first k16 tile takes the
// vectors' values 0-3 as the tile's columns 2t, 2t + 1, 2t + 8, 2t + 9 (exactly the registers a
// lane holds in the m16n8k16 fragments) and the second tile values 4-7; x's fragments use the
// same permutation. Tokens past m (of the mma's 8) multiply zeros and are not stored.
template <int G, typename T>
__global__ void __launch_bounds__(kThreads)
    SkinnyKernel(const __nv_bfloat16* x, int ldx, const __nv_bfloat16* __restrict__ w, int ldw,
                 const __nv_bfloat16* __restrict__ bias, T* y, int ldy, int m, int n, int k,
                 float alpha, float beta) {
  constexpr int S = kWarps / G;
  __shared__ float partial[kWarps][kTileRows][kSkinnyMaxRows];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int group = warp / S, slice = warp % S;
  const int row0 = (blockIdx.x * G + group) * kTileRows;
  const int steps = (k + kStep - 1) / kStep;
  const int begin = static_cast<int>(static_cast<int64_t>(steps) * slice / S);
  const int end = static_cast<int>(static_cast<int64_t>(steps) * (slice + 1) / S);
  const int vectors = k / 8;  // 16-byte vectors per row
  // Rows past n read row n - 1 (never stored), so every lane loads unconditionally.
  const uint4* w_lo =
      reinterpret_cast<const uint4*>(w + static_cast<size_t>(min(row0 + g, n - 1)) * ldw);
  const uint4* w_hi =
      reinterpret_cast<const uint4*>(w + static_cast<size_t>(min(row0 + g + 8, n - 1)) * ldw);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 a_lo[kUnroll], a_hi[kUnroll];
  const auto load_weights = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = (s0 + u) * 4 + t;
      const bool live = s0 + u < end && v < vectors;
      a_lo[u] = live ? __ldcs(w_lo + v) : zero;  // read once
      a_hi[u] = live ? __ldcs(w_hi + v) : zero;
    }
  };
  // The first weight loads go out before waiting for the kernel that writes x: with a
  // programmatic launch they overlap that kernel (the weights never depend on it). Nothing of
  // x is read before the wait, and x is read through L2 only (ld.global.cg), never through a
  // cache that could hold a line from before the preceding kernel's writes.
  load_weights(begin);
  WaitForPrecedingKernel();
  const bool x_live = g < m;  // lane group g carries token g
  const uint4* x_row =
      reinterpret_cast<const uint4*>(x + static_cast<size_t>(x_live ? g : 0) * ldx);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s0 = begin; s0 < end; s0 += kUnroll) {
    if (s0 != begin) load_weights(s0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = (s0 + u) * 4 + t;
      const bool live = s0 + u < end && v < vectors;
      const uint4 b = live && x_live ? __ldcg(x_row + v) : zero;
      Mma(acc, a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y, b.x, b.y);
      Mma(acc, a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w, b.z, b.w);
    }
  }
  // Fragment c0, c1: row g, columns 2t, 2t + 1; c2, c3: row g + 8.
  partial[warp][g][2 * t] = acc[0];
  partial[warp][g][2 * t + 1] = acc[1];
  partial[warp][g + 8][2 * t] = acc[2];
  partial[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
  // One output per thread (row fastest, so a token's outputs are stored together).
  constexpr int kTile = kTileRows * kSkinnyMaxRows;  // outputs per 16 weight rows
  for (int i = threadIdx.x; i < G * kTile; i += kThreads) {
    const int tile = i / kTile;
    const int row = i % kTileRows;
    const int token = (i % kTile) / kTileRows;
    const int column = (blockIdx.x * G + tile) * kTileRows + row;
    if (token >= m || column >= n) continue;
    float sum = partial[tile * S][row][token];
#pragma unroll
    for (int s = 1; s < S; ++s) sum += partial[tile * S + s][row][token];
    T* out = y + static_cast<size_t>(token) * ldy + column;
    float value = alpha * sum;
    if (beta != 0.0f) value += beta * Load(out);
    if (bias != nullptr) value = RoundLike(T(), value) + __bfloat162float(bias[column]);
    Store(out, value);
  }
}

// Row groups per CTA: more for wide products (fewer x reads per weight byte), one for narrow
// ones so that they still spread over every multiprocessor (4096 rows: 256 CTAs).
int GroupsFor(int n) {
  if (n >= 16384) return 4;
  if (n >= 8192) return 2;
  return 1;
}

template <typename T>
absl::Status Launch(const GemmParams& p, T* y, cudaStream_t stream) {
  const int groups = GroupsFor(p.n);
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(CeilDiv(p.n, kTileRows * groups));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = ProgrammaticLaunch() ? 1 : 0;
  const auto launch = [&](auto kernel) {
    return cudaLaunchKernelEx(&config, kernel, p.x, p.ldx, p.w, p.ldw, p.bias, y, p.ldy, p.m, p.n,
                              p.k, p.alpha, p.beta);
  };
  // One instance per row-group count.
  switch (groups) {
    case 1:
      TANDEM_CUDA_RETURN_IF_ERROR(launch(SkinnyKernel<1, T>));
      break;
    case 2:
      TANDEM_CUDA_RETURN_IF_ERROR(launch(SkinnyKernel<2, T>));
      break;
    default:
      TANDEM_CUDA_RETURN_IF_ERROR(launch(SkinnyKernel<4, T>));
      break;
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

bool SkinnyEnabled() {
  static const bool enabled = SwitchOn("TANDEM_CUDA_SKINNY");
  return enabled;
}

}  // namespace

bool SkinnyApplies(const GemmParams& params) {
  return params.m >= 1 && params.m <= kSkinnyMaxRows && params.k % 8 == 0 && params.ldx % 8 == 0 &&
         params.ldw % 8 == 0 && Aligned(params.x, 16) && Aligned(params.w, 16) && SkinnyEnabled() &&
         ComputeCapabilityMajor() >= 8;
}

absl::Status InvokeSkinny(const GemmParams& params, cudaStream_t stream) {
  if (params.y_type == GemmOutput::kBf16) {
    return Launch(params, static_cast<__nv_bfloat16*>(params.y), stream);
  }
  return Launch(params, static_cast<float*>(params.y), stream);
}

}  // namespace tandem::kernels::cuda::internal
