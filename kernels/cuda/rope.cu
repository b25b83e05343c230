#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/rope.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// The fused KV write's destination (RopeParams::k_cache); dormant when k_cache is null.
struct CacheWrite {
  const __nv_bfloat16* v;
  int v_stride;
  const int64_t* slots;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
  int64_t pool_rows;
  int row_elements;

  __device__ bool live() const { return k_cache != nullptr; }

  // The token's pool row, or -1 to skip it.
  __device__ int64_t Row(int t) const {
    const int64_t slot = slots[t];
    return slot < 0 ? -1 : min(slot, pool_rows - 1);
  }

  // Pair (i, i + half) of k head `head` of token t, already rotated in `rotated`.
  __device__ void StoreK(int t, int head, int head_dim, const __nv_bfloat16* rotated, int i,
                         int half) const {
    if (!live()) return;
    const int64_t row = Row(t);
    if (row < 0) return;
    __nv_bfloat16* dst = k_cache + row * row_elements + head * head_dim;
    dst[i] = rotated[i];
    dst[i + half] = rotated[i + half];
  }

  // Pair (i, i + half) of v head `head` of token t.
  __device__ void StoreV(int t, int head, int head_dim, int i, int half) const {
    const int64_t row = Row(t);
    if (row < 0) return;
    const __nv_bfloat16* src = v + static_cast<int64_t>(t) * v_stride + head * head_dim;
    __nv_bfloat16* dst = v_cache + row * row_elements + head * head_dim;
    dst[i] = src[i];
    dst[i + half] = src[i + half];
  }
};

// Grid (token, chunk of kThreads pairs): one thread per (head, pair), the q heads then the k
// heads, so a decode step's few tokens still spread over several CTAs. Each thread reads and
// writes only its own pair, so in-place is race free.
__global__ void RopeKernel(__nv_bfloat16* q, int q_stride, int q_heads, __nv_bfloat16* k,
                           int k_stride, int k_heads, const int32_t* positions,
                           const float* inv_freq, float scaling, int head_dim, CacheWrite cache) {
  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const float position = static_cast<float>(positions[t]);
  const int pairs = (q_heads + (cache.live() ? 2 : 1) * k_heads) * half;
  const int p = blockIdx.y * blockDim.x + threadIdx.x;
  if (p < pairs) {
    const int head = p / half;
    const int i = p % half;
    if (head >= q_heads + k_heads) {  // a v head: stored as it is
      cache.StoreV(t, head - q_heads - k_heads, head_dim, i, half);
      return;
    }
    __nv_bfloat16* v = head < q_heads
                           ? q + static_cast<size_t>(t) * q_stride + head * head_dim
                           : k + static_cast<size_t>(t) * k_stride + (head - q_heads) * head_dim;
    // Accurate cosf/sinf (not the __ intrinsics): positions reach 1e5+, where the fast versions'
    // missing range reduction is visibly wrong.
    const float angle = position * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    c *= scaling;
    s *= scaling;
    const float a = __bfloat162float(v[i]);
    const float b = __bfloat162float(v[i + half]);
    v[i] = __float2bfloat16(a * c - b * s);
    v[i + half] = __float2bfloat16(b * c + a * s);
    if (head >= q_heads) cache.StoreK(t, head - q_heads, head_dim, v, i, half);
  }
}

constexpr int kNormWarps = 4;  // heads per CTA of the normalising kernel

// Grid (token, chunk of kNormWarps heads): one warp per head, the q heads then the k heads.
// Lane l owns the pairs (i, i + half) for i = l, l + 32, ...: it sums their squares, the warp
// reduces, and the lane then normalises, rounds and rotates its own pairs in place.
__global__ void __launch_bounds__(kNormWarps* internal::kWarpSize)
    NormRopeKernel(__nv_bfloat16* q, int q_stride, int q_heads, __nv_bfloat16* k, int k_stride,
                   int k_heads, const int32_t* positions, const float* inv_freq, float scaling,
                   int head_dim, const __nv_bfloat16* q_norm, const __nv_bfloat16* k_norm,
                   float eps, CacheWrite cache) {
  const int t = blockIdx.x;
  const int head = blockIdx.y * kNormWarps + threadIdx.x / internal::kWarpSize;
  const int lane = threadIdx.x % internal::kWarpSize;
  const int half = head_dim / 2;
  if (head >= q_heads + k_heads) {  // a v head (with the cache write): stored as it is
    if (head < q_heads + (cache.live() ? 2 : 1) * k_heads) {
      for (int i = lane; i < half; i += internal::kWarpSize) {
        cache.StoreV(t, head - q_heads - k_heads, head_dim, i, half);
      }
    }
    return;
  }
  const bool is_q = head < q_heads;
  __nv_bfloat16* v = is_q ? q + static_cast<size_t>(t) * q_stride + head * head_dim
                          : k + static_cast<size_t>(t) * k_stride + (head - q_heads) * head_dim;
  const __nv_bfloat16* weight = is_q ? q_norm : k_norm;
  float sum_squares = 0.0f;
  for (int i = lane; i < half; i += internal::kWarpSize) {
    const float a = __bfloat162float(v[i]);
    const float b = __bfloat162float(v[i + half]);
    sum_squares += a * a + b * b;
  }
  const float scale = rsqrtf(internal::WarpSum(sum_squares) / static_cast<float>(head_dim) + eps);
  const float position = static_cast<float>(positions[t]);
  for (int i = lane; i < half; i += internal::kWarpSize) {
    // The norm's output as the norm kernel stores it: (x * scale) * w, rounded to bf16.
    const float a = __bfloat162float(
        __float2bfloat16(__bfloat162float(v[i]) * scale * __bfloat162float(weight[i])));
    const float b = __bfloat162float(__float2bfloat16(__bfloat162float(v[i + half]) * scale *
                                                      __bfloat162float(weight[i + half])));
    float s, c;
    sincosf(position * inv_freq[i], &s, &c);
    c *= scaling;
    s *= scaling;
    v[i] = __float2bfloat16(a * c - b * s);
    v[i + half] = __float2bfloat16(b * c + a * s);
    if (!is_q) cache.StoreK(t, head - q_heads, head_dim, v, i, half);
  }
}

}  // namespace

absl::Status RopeParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("RopeParams.", parts...));
  };
  if (tokens < 0) return bad("tokens must be >= 0, got ", tokens);
  if (head_dim <= 0 || head_dim % 2 != 0)
    return bad("head_dim must be even and > 0, got ", head_dim);
  if (q_heads < 0 || k_heads < 0) return bad("q_heads and k_heads must be >= 0");
  if (q_heads > 0 && q_stride < q_heads * head_dim) {
    return bad("q_stride ", q_stride, " is below q_heads * head_dim ", q_heads * head_dim);
  }
  if (k_heads > 0 && k_stride < k_heads * head_dim) {
    return bad("k_stride ", k_stride, " is below k_heads * head_dim ", k_heads * head_dim);
  }
  if (!std::isfinite(attention_scaling)) return bad("attention_scaling must be finite");
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return bad("q_norm and k_norm must be set together (or neither)");
  }
  if (!std::isfinite(norm_eps) || norm_eps < 0.0f) {
    return bad("norm_eps must be finite and >= 0, got ", norm_eps);
  }
  const bool cache = k_cache != nullptr;
  if (cache) {
    if (k_heads == 0) return bad("k_cache is set without k heads");
    if (v_stride < k_heads * head_dim) {
      return bad("v_stride ", v_stride, " is below k_heads * head_dim ", k_heads * head_dim);
    }
    if (pool_rows <= 0) return bad("pool_rows must be > 0 with k_cache, got ", pool_rows);
  } else if (v != nullptr || slots != nullptr || v_cache != nullptr) {
    return bad("v, slots and v_cache are for the KV write: set k_cache with them");
  }
  if (tokens == 0 || q_heads + k_heads == 0) return absl::OkStatus();
  if (cache) {
    if (v == nullptr) return bad("v is null");
    if (slots == nullptr) return bad("slots is null");
    if (v_cache == nullptr) return bad("v_cache is null");
    if (v_cache == k_cache) return bad("v_cache is k_cache");
  }
  if (q_heads > 0 && q == nullptr) return bad("q is null");
  if (k_heads > 0 && k == nullptr) return bad("k is null");
  if (positions == nullptr) return bad("positions is null");
  if (inv_freq == nullptr) return bad("inv_freq is null");
  if (q_heads > 0 && k_heads > 0) {
    // Within one token's row: q's heads and k's heads must be disjoint ranges (same-stride
    // layouts, e.g. both views of a fused qkv row, are the supported sharing).
    const size_t q_row = static_cast<size_t>(q_heads) * head_dim * sizeof(__nv_bfloat16);
    const size_t k_row = static_cast<size_t>(k_heads) * head_dim * sizeof(__nv_bfloat16);
    if (internal::Overlap(q, q_row, k, k_row)) return bad("k overlaps q's heads");
  }
  return absl::OkStatus();
}

size_t WorkspaceBytes(const RopeParams& /*params*/) { return 0; }

absl::Status Invoke(const RopeParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  const int pairs = (params.q_heads + params.k_heads) * params.head_dim / 2;
  if (params.tokens == 0 || pairs == 0) return absl::OkStatus();
  const CacheWrite cache{params.v,
                         params.v_stride,
                         params.slots,
                         params.k_cache,
                         params.v_cache,
                         params.pool_rows,
                         params.k_heads * params.head_dim};
  // With the cache write, the v heads come after the k heads.
  const int heads = params.q_heads + (cache.k_cache != nullptr ? 2 : 1) * params.k_heads;
  if (params.q_norm != nullptr) {
    const dim3 grid(params.tokens, internal::CeilDiv(heads, kNormWarps));
    NormRopeKernel<<<grid, kNormWarps * internal::kWarpSize, 0, stream>>>(
        params.q, params.q_stride, params.q_heads, params.k, params.k_stride, params.k_heads,
        params.positions, params.inv_freq, params.attention_scaling, params.head_dim, params.q_norm,
        params.k_norm, params.norm_eps, cache);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }
  const int all_pairs = heads * params.head_dim / 2;
  const int threads = std::min(kThreads, internal::CeilDiv(all_pairs, 32) * 32);
  const dim3 grid(params.tokens, internal::CeilDiv(all_pairs, threads));
  RopeKernel<<<grid, threads, 0, stream>>>(
      params.q, params.q_stride, params.q_heads, params.k, params.k_stride, params.k_heads,
      params.positions, params.inv_freq, params.attention_scaling, params.head_dim, cache);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
