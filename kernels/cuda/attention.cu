#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"

namespace tandem::kernels::cuda {
namespace {

using internal::kWarpSize;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerThread = kMaxHeadDim / kThreads;
// Slots scored per step of the online softmax.
constexpr int kTile = 64;
constexpr int kMaxSplits = 64;
constexpr int kHeuristicMaxSplits = 16;
// The split heuristic aims for eight CTAs per multiprocessor of an H100 (132 SMs): a CTA is
// 128 threads that wait on one round of K/V loads after another, so a step's attention takes
// as long as its longest chain of rounds, and many short chains beat a few long ones. Measured
// on an H200 (docs/PERF.md, GPU): a batch-1 decode step at context 512 took 28 us per layer in
// one chain of 16 rounds per head (32 CTAs). A constant keeps AttentionSplits (and
// WorkspaceBytes) pure host functions; on a smaller GPU it only means somewhat more splits than
// needed.
constexpr int kTargetCtas = 8 * 132;
// Below this many slots a sequence is not worth splitting; each split gets at least this many
// (two rounds of the vector kernel's loads for head_dim 128).
constexpr int kMinSplitSlots = 64;
// The heuristic before: two waves of CTAs, chunks of at least 512 slots, any count up to 16.
// TANDEM_CUDA_ATTENTION_SHORT_SPLITS=0 brings it back (read once per process; for side-by-side
// timings).
constexpr int kLongTargetCtas = 2 * 132;
constexpr int kLongMinSplitSlots = 512;

bool ShortSplits() {
  static const bool enabled = internal::SwitchOn("TANDEM_CUDA_ATTENTION_SHORT_SPLITS");
  return enabled;
}

// The extend that owns batch row `t`: the last one whose token_offset <= t.
__device__ int FindExtend(const AttentionExtend* extends, int count, int t) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (extends[mid].token_offset <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Whether new token i sees new token j (worker/model/extend.h Visibility::Sees).
__device__ bool Sees(const AttentionExtend& e, const uint64_t* masks, int i, int j) {
  switch (e.visibility) {
    case AttentionVisibility::kCausal:
      return j <= i;
    case AttentionVisibility::kFull:
      return true;
    case AttentionVisibility::kBlock:
      return j / e.visibility_block <= i / e.visibility_block;
    case AttentionVisibility::kExplicit: {
      const int words = (e.new_tokens + 63) / 64;
      const uint64_t word = masks[e.mask_offset + static_cast<int64_t>(i) * words + j / 64];
      return (word >> (j % 64)) & 1u;
    }
  }
  return false;
}

// Slots [lo, hi) outside which query i sees nothing; inside, new tokens still go through Sees.
__device__ void VisibleSpan(const AttentionExtend& e, int i, int window, int* lo, int* hi) {
  const int c = e.context_len;
  *lo = window > 0 ? max(0, c + i - window + 1) : 0;
  switch (e.visibility) {
    case AttentionVisibility::kCausal:
      *hi = c + i + 1;
      break;
    case AttentionVisibility::kBlock:
      *hi = c + min(e.new_tokens, (i / e.visibility_block + 1) * e.visibility_block);
      break;
    default:
      *hi = c + e.new_tokens;
      break;
  }
}

// One CTA per (batch row, q head, split). Online softmax over the split's slots in tiles of
// kTile: warps score the tile's slots (lanes over head_dim), then every thread folds the tile
// into its own head_dim columns of the running P·V. `splits` == 1 writes the normalised bf16
// output; otherwise the unnormalised partial goes to the workspace for MergeKernel.
__global__ void __launch_bounds__(kThreads)
    AttentionKernel(const __nv_bfloat16* q, int q_stride, const __nv_bfloat16* k_cache,
                    const __nv_bfloat16* v_cache, const int32_t* block_tables, int block_size,
                    const AttentionExtend* extends, int num_extends, const uint64_t* masks,
                    int q_heads, int kv_heads, int head_dim, float scale, int window,
                    __nv_bfloat16* out, int out_stride, float* partial_o, float* partial_m,
                    float* partial_l) {
  __shared__ float q_shared[kMaxHeadDim];
  __shared__ float scores[kTile];
  __shared__ int64_t rows[kTile];  // element offset of each tile slot's K/V row
  internal::LetDependentsStart();  // the o projection may start streaming its weights

  const int t = blockIdx.x;
  const int head = blockIdx.y;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int total_tokens = gridDim.x;
  const int kv_head = head / (q_heads / kv_heads);
  const AttentionExtend e = extends[FindExtend(extends, num_extends, t)];
  const int i = t - e.token_offset;
  const int32_t* table = block_tables + e.block_table_offset;
  const int64_t row_elements = static_cast<int64_t>(kv_heads) * head_dim;

  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    q_shared[d] = __bfloat162float(q[static_cast<size_t>(t) * q_stride + head * head_dim + d]);
  }

  int lo = 0, hi = 0;
  if (i >= 0 && i < e.new_tokens) VisibleSpan(e, i, window, &lo, &hi);
  const int span = max(0, hi - lo);
  const int chunk = (span + splits - 1) / splits;
  const int begin = lo + min(span, split * chunk);
  const int end = lo + min(span, (split + 1) * chunk);

  float m = -INFINITY;  // running max of the scores seen
  float l = 0.0f;       // running sum of exp(score - m)
  float acc[kDimsPerThread] = {};
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();  // q_shared

  for (int tile = begin; tile < end; tile += kTile) {
    const int tile_n = min(kTile, end - tile);
    for (int kk = warp; kk < tile_n; kk += kWarps) {
      const int slot = tile + kk;
      const int64_t row =
          static_cast<int64_t>(table[slot / block_size]) * block_size * row_elements +
          static_cast<int64_t>(slot % block_size) * row_elements +
          static_cast<int64_t>(kv_head) * head_dim;
      const bool visible = slot < e.context_len || Sees(e, masks, i, slot - e.context_len);
      float dot = 0.0f;
      if (visible) {
        for (int d = lane; d < head_dim; d += kWarpSize) {
          dot += q_shared[d] * __bfloat162float(k_cache[row + d]);
        }
        dot = internal::WarpSum(dot);
      }
      if (lane == 0) {
        scores[kk] = visible ? dot * scale : -INFINITY;
        rows[kk] = row;
      }
    }
    __syncthreads();
    float tile_max = -INFINITY;
    for (int kk = 0; kk < tile_n; ++kk) tile_max = fmaxf(tile_max, scores[kk]);
    const float m_new = fmaxf(m, tile_max);
    if (m_new != -INFINITY) {
      const float correction = expf(m - m_new);  // m == -inf: 0 (nothing accumulated yet)
      l *= correction;
#pragma unroll
      for (int j = 0; j < kDimsPerThread; ++j) acc[j] *= correction;
      for (int kk = 0; kk < tile_n; ++kk) {
        const float p = expf(scores[kk] - m_new);  // hidden slots: exp(-inf) = 0
        if (p == 0.0f) continue;
        l += p;
        const __nv_bfloat16* v = v_cache + rows[kk];
#pragma unroll
        for (int j = 0; j < kDimsPerThread; ++j) {
          const int d = threadIdx.x + j * kThreads;
          if (d < head_dim) acc[j] += p * __bfloat162float(v[d]);
        }
      }
      m = m_new;
    }
    __syncthreads();  // scores / rows are rewritten by the next tile
  }

  if (splits == 1) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // sees nothing: zero output
    __nv_bfloat16* o = out + static_cast<size_t>(t) * out_stride + head * head_dim;
#pragma unroll
    for (int j = 0; j < kDimsPerThread; ++j) {
      const int d = threadIdx.x + j * kThreads;
      if (d < head_dim) o[d] = __float2bfloat16(acc[j] * inv);
    }
    return;
  }
  const size_t item = (static_cast<size_t>(split) * total_tokens + t) * q_heads + head;
  float* o = partial_o + item * head_dim;
#pragma unroll
  for (int j = 0; j < kDimsPerThread; ++j) {
    const int d = threadIdx.x + j * kThreads;
    if (d < head_dim) o[d] = acc[j];
  }
  if (threadIdx.x == 0) {
    partial_m[item] = m;
    partial_l[item] = l;
  }
}

// The vector path of AttentionKernel, for head_dim = 8 * G with G a power of two (head_dim 8 to
// 256) and 16-byte-aligned caches: the same grid and the same outputs, laid out for memory
// latency. G threads share a slot, each holding 8 of its dimensions (one 16-byte load of K and
// one of V), so the CTA's kThreads / G slot groups work on as many slots at once, each group on
// every (kThreads / G)-th slot with its own running max, sum and P·V; a round issues kRound
// slots' K and V loads per thread before any is used. The groups merge through shared memory at
// the end, as the splits do in MergeKernel.
constexpr int kVector = 8;  // bf16 dims per 16-byte load
constexpr int kRound = 4;   // slots per group whose loads are in flight together

template <int G>
__global__ void __launch_bounds__(kThreads)
    AttentionVectorKernel(const __nv_bfloat16* q, int q_stride, const __nv_bfloat16* k_cache,
                          const __nv_bfloat16* v_cache, const int32_t* block_tables, int block_size,
                          const AttentionExtend* extends, int num_extends, const uint64_t* masks,
                          int q_heads, int kv_heads, float scale, int window, __nv_bfloat16* out,
                          int out_stride, float* partial_o, float* partial_m, float* partial_l) {
  constexpr int kGroups = kThreads / G;
  constexpr int kHeadDim = G * kVector;
  __shared__ float group_m[kGroups];
  __shared__ float group_l[kGroups];
  __shared__ float group_o[kGroups * kHeadDim];
  internal::LetDependentsStart();  // the o projection may start streaming its weights

  const int t = blockIdx.x;
  const int head = blockIdx.y;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int total_tokens = gridDim.x;
  const int kv_head = head / (q_heads / kv_heads);
  const AttentionExtend e = extends[FindExtend(extends, num_extends, t)];
  const int i = t - e.token_offset;
  const int32_t* table = block_tables + e.block_table_offset;
  const int64_t row_elements = static_cast<int64_t>(kv_heads) * kHeadDim;
  const int group = threadIdx.x / G;
  const int part = threadIdx.x % G;  // dims [part * 8, part * 8 + 8)

  float qf[kVector];
  const __nv_bfloat16* q_row = q + static_cast<size_t>(t) * q_stride + head * kHeadDim;
#pragma unroll
  for (int j = 0; j < kVector; ++j) qf[j] = __bfloat162float(q_row[part * kVector + j]);

  int lo = 0, hi = 0;
  if (i >= 0 && i < e.new_tokens) VisibleSpan(e, i, window, &lo, &hi);
  const int span = max(0, hi - lo);
  const int chunk = (span + splits - 1) / splits;
  const int begin = lo + min(span, split * chunk);
  const int end = lo + min(span, (split + 1) * chunk);

  float m = -INFINITY, l = 0.0f;
  float acc[kVector] = {};
  // Every thread runs the same rounds (the shuffles below need whole warps); slots past `end`
  // are masked.
  for (int round = begin; round < end; round += kGroups * kRound) {
    uint4 kv_k[kRound], kv_v[kRound];
    bool seen[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int slot = round + u * kGroups + group;
      seen[u] = slot < end && (slot < e.context_len || Sees(e, masks, i, slot - e.context_len));
      kv_k[u] = kv_v[u] = make_uint4(0, 0, 0, 0);
      if (seen[u]) {
        const int64_t row =
            static_cast<int64_t>(table[slot / block_size]) * block_size * row_elements +
            static_cast<int64_t>(slot % block_size) * row_elements +
            static_cast<int64_t>(kv_head) * kHeadDim + part * kVector;
        kv_k[u] = *reinterpret_cast<const uint4*>(k_cache + row);
        kv_v[u] = *reinterpret_cast<const uint4*>(v_cache + row);
      }
    }
    float score[kRound];
    float round_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const __nv_bfloat162* kp = reinterpret_cast<const __nv_bfloat162*>(&kv_k[u]);
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kVector / 2; ++j) {
        const float2 kf = __bfloat1622float2(kp[j]);
        dot = fmaf(qf[2 * j], kf.x, dot);
        dot = fmaf(qf[2 * j + 1], kf.y, dot);
      }
#pragma unroll
      for (int offset = G / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      score[u] = seen[u] ? dot * scale : -INFINITY;
      round_max = fmaxf(round_max, score[u]);
    }
    const float m_new = fmaxf(m, round_max);
    if (m_new != -INFINITY) {
      const float correction = expf(m - m_new);  // m == -inf: 0 (nothing accumulated yet)
      l *= correction;
#pragma unroll
      for (int j = 0; j < kVector; ++j) acc[j] *= correction;
#pragma unroll
      for (int u = 0; u < kRound; ++u) {
        const float p = expf(score[u] - m_new);  // hidden slots: exp(-inf) = 0
        l += p;
        const __nv_bfloat162* vp = reinterpret_cast<const __nv_bfloat162*>(&kv_v[u]);
#pragma unroll
        for (int j = 0; j < kVector / 2; ++j) {
          const float2 vf = __bfloat1622float2(vp[j]);
          acc[2 * j] = fmaf(p, vf.x, acc[2 * j]);
          acc[2 * j + 1] = fmaf(p, vf.y, acc[2 * j + 1]);
        }
      }
      m = m_new;
    }
  }

  if (part == 0) {
    group_m[group] = m;
    group_l[group] = l;
  }
#pragma unroll
  for (int j = 0; j < kVector; ++j) group_o[group * kHeadDim + part * kVector + j] = acc[j];
  __syncthreads();
  float m_all = -INFINITY;
  for (int g = 0; g < kGroups; ++g) m_all = fmaxf(m_all, group_m[g]);
  float l_all = 0.0f;
  for (int g = 0; g < kGroups; ++g) {
    if (group_m[g] != -INFINITY) l_all += group_l[g] * expf(group_m[g] - m_all);
  }
  const size_t item = (static_cast<size_t>(split) * total_tokens + t) * q_heads + head;
  for (int d = threadIdx.x; d < kHeadDim; d += kThreads) {
    float sum = 0.0f;
    for (int g = 0; g < kGroups; ++g) {
      if (group_m[g] != -INFINITY) sum += group_o[g * kHeadDim + d] * expf(group_m[g] - m_all);
    }
    if (splits == 1) {
      const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;  // sees nothing: zero output
      out[static_cast<size_t>(t) * out_stride + head * kHeadDim + d] = __float2bfloat16(sum * inv);
    } else {
      partial_o[item * kHeadDim + d] = sum;
    }
  }
  if (splits > 1 && threadIdx.x == 0) {
    partial_m[item] = m_all;
    partial_l[item] = l_all;
  }
}

// One CTA per (batch row, q head): rescales each split's partial to the common maximum and
// normalises by the combined sum. Splits that saw nothing have m = -inf and l = 0.
__global__ void MergeKernel(const float* partial_o, const float* partial_m, const float* partial_l,
                            int splits, int q_heads, int head_dim, __nv_bfloat16* out,
                            int out_stride) {
  internal::LetDependentsStart();  // the o projection may start streaming its weights
  const int t = blockIdx.x;
  const int head = blockIdx.y;
  const int total_tokens = gridDim.x;
  auto item = [&](int s) { return (static_cast<size_t>(s) * total_tokens + t) * q_heads + head; };
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, partial_m[item(s)]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s) {
    if (partial_m[item(s)] != -INFINITY) l += partial_l[item(s)] * expf(partial_m[item(s)] - m);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  __nv_bfloat16* o = out + static_cast<size_t>(t) * out_stride + head * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      if (partial_m[item(s)] == -INFINITY) continue;
      sum += partial_o[item(s) * head_dim + d] * expf(partial_m[item(s)] - m);
    }
    o[d] = __float2bfloat16(sum * inv);
  }
}

// G (threads per slot) of the vector path for `params`, or 0 for the general kernel: head_dim
// a multiple of 8 whose eighth is a power of two, both caches 16-byte aligned, and the path not
// switched off (TANDEM_CUDA_ATTENTION_VECTOR=0, read once per process; for comparisons).
int VectorPathGroup(const PagedAttentionParams& params) {
  static const bool enabled = internal::SwitchOn("TANDEM_CUDA_ATTENTION_VECTOR");
  const int g = params.head_dim / kVector;
  if (!enabled || params.head_dim % kVector != 0 || (g & (g - 1)) != 0 || g > kWarpSize) return 0;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return aligned(params.k_cache) && aligned(params.v_cache) ? g : 0;
}

}  // namespace

absl::Status PagedAttentionParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttentionParams.", parts...));
  };
  if (total_tokens < 0) return bad("total_tokens must be >= 0, got ", total_tokens);
  if (num_extends < 0) return bad("num_extends must be >= 0, got ", num_extends);
  if (total_tokens > 0 && num_extends == 0) return bad("num_extends is 0 but total_tokens > 0");
  if (q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0) {
    return bad("q_heads (", q_heads, ") must be a positive multiple of kv_heads (", kv_heads, ")");
  }
  if (q_heads > 65535) return bad("q_heads must be <= 65535, got ", q_heads);
  if (head_dim <= 0 || head_dim > kMaxHeadDim) {
    return bad("head_dim must be in [1, ", kMaxHeadDim, "], got ", head_dim);
  }
  if (block_size <= 0) return bad("block_size must be > 0, got ", block_size);
  if (q_stride < q_heads * head_dim) {
    return bad("q_stride ", q_stride, " is below q_heads * head_dim ", q_heads * head_dim);
  }
  if (out_stride < q_heads * head_dim) {
    return bad("out_stride ", out_stride, " is below q_heads * head_dim ", q_heads * head_dim);
  }
  if (!std::isfinite(scale)) return bad("scale must be finite");
  if (window < 0) return bad("window must be >= 0, got ", window);
  if (max_kv_len < 0) return bad("max_kv_len must be >= 0, got ", max_kv_len);
  if (num_splits < 0 || num_splits > kMaxSplits) {
    return bad("num_splits must be in [0, ", kMaxSplits, "], got ", num_splits);
  }
  const size_t needed = WorkspaceBytes(*this);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return bad("workspace: ", needed, " bytes required, got ", workspace_bytes,
               workspace == nullptr ? " at null" : "");
  }
  if (total_tokens == 0) return absl::OkStatus();
  if (q == nullptr) return bad("q is null");
  if (k_cache == nullptr) return bad("k_cache is null");
  if (v_cache == nullptr) return bad("v_cache is null");
  if (block_tables == nullptr) return bad("block_tables is null");
  if (extends == nullptr) return bad("extends is null");
  if (out == nullptr) return bad("out is null");
  const size_t out_bytes = (static_cast<size_t>(total_tokens - 1) * out_stride +
                            static_cast<size_t>(q_heads) * head_dim) *
                           sizeof(__nv_bfloat16);
  const size_t q_bytes =
      (static_cast<size_t>(total_tokens - 1) * q_stride + static_cast<size_t>(q_heads) * head_dim) *
      sizeof(__nv_bfloat16);
  if (internal::Overlap(out, out_bytes, q, q_bytes)) return bad("out overlaps q");
  return absl::OkStatus();
}

int AttentionSplits(const PagedAttentionParams& params) {
  if (params.num_splits > 0) return std::min(params.num_splits, kMaxSplits);
  const bool short_splits = ShortSplits();
  const int64_t target = short_splits ? kTargetCtas : kLongTargetCtas;
  const int64_t min_slots = short_splits ? kMinSplitSlots : kLongMinSplitSlots;
  const int64_t ctas = static_cast<int64_t>(params.total_tokens) * params.q_heads;
  if (ctas <= 0 || ctas >= target || params.max_kv_len < 2 * min_slots) return 1;
  const int64_t by_occupancy = (target + ctas - 1) / ctas;
  const int64_t by_length = params.max_kv_len / min_slots;
  const int64_t most = std::min({by_occupancy, by_length, int64_t{kHeuristicMaxSplits}});
  if (!short_splits) return static_cast<int>(std::max<int64_t>(1, most));
  // A power of two: a decoding sequence keeps its split count (and its captured graph) over
  // long stretches of context instead of changing it every kMinSplitSlots tokens.
  int splits = 1;
  while (splits * 2 <= most) splits *= 2;
  return splits;
}

size_t WorkspaceBytes(const PagedAttentionParams& params) {
  const int splits = AttentionSplits(params);
  if (splits <= 1 || params.total_tokens <= 0 || params.q_heads <= 0 || params.head_dim <= 0) {
    return 0;
  }
  return static_cast<size_t>(splits) * params.total_tokens * params.q_heads *
         (static_cast<size_t>(params.head_dim) + 2) * sizeof(float);
}

absl::Status Invoke(const PagedAttentionParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.total_tokens == 0) return absl::OkStatus();
  const int splits = AttentionSplits(params);
  float* partial_o = nullptr;
  float* partial_m = nullptr;
  float* partial_l = nullptr;
  if (splits > 1) {
    const size_t items = static_cast<size_t>(splits) * params.total_tokens * params.q_heads;
    partial_o = static_cast<float*>(params.workspace);
    partial_m = partial_o + items * params.head_dim;
    partial_l = partial_m + items;
  }
  const dim3 grid(params.total_tokens, params.q_heads, splits);
  const auto vector = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(params.q, params.q_stride, params.k_cache, params.v_cache,
                                          params.block_tables, params.block_size, params.extends,
                                          params.num_extends, params.masks, params.q_heads,
                                          params.kv_heads, params.scale, params.window, params.out,
                                          params.out_stride, partial_o, partial_m, partial_l);
  };
  switch (VectorPathGroup(params)) {
    case 1:
      vector(AttentionVectorKernel<1>);
      break;
    case 2:
      vector(AttentionVectorKernel<2>);
      break;
    case 4:
      vector(AttentionVectorKernel<4>);
      break;
    case 8:
      vector(AttentionVectorKernel<8>);
      break;
    case 16:
      vector(AttentionVectorKernel<16>);
      break;
    case 32:
      vector(AttentionVectorKernel<32>);
      break;
    default:
      AttentionKernel<<<grid, kThreads, 0, stream>>>(
          params.q, params.q_stride, params.k_cache, params.v_cache, params.block_tables,
          params.block_size, params.extends, params.num_extends, params.masks, params.q_heads,
          params.kv_heads, params.head_dim, params.scale, params.window, params.out,
          params.out_stride, partial_o, partial_m, partial_l);
      break;
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (splits > 1) {
    const int threads = std::min(kThreads, internal::CeilDiv(params.head_dim, 32) * 32);
    MergeKernel<<<dim3(params.total_tokens, params.q_heads), threads, 0, stream>>>(
        partial_o, partial_m, partial_l, splits, params.q_heads, params.head_dim, params.out,
        params.out_stride);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
