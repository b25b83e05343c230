// Device building blocks shared by sampling.cu and verify.cu: one CTA turns one row of logits
// into worker/sampling's distribution and draws from it. Internal to kernels/cuda.
//
// Every function is called by all threads of the CTA (they contain barriers); blockDim.x is a
// multiple of 32 and at most 1024.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"
#include "kernels/cuda/sampling.cuh"

namespace tandem::kernels::cuda::internal {

inline constexpr int kSamplingThreads = 512;

// Scratch for the block reductions.
struct SamplingShared {
  double doubles[kMaxWarps];
  float floats[kMaxWarps];
  int ints[kMaxWarps];
  float values[kMaxWarps];
  int indices[kMaxWarps];
  int found;
};

__device__ inline bool Usable(float p) { return p > 0.0f && p < INFINITY; }

// The workspace row of a sampled row `row` (SamplingRow::workspace_row), or -1 when it lies
// outside the workspace's `workspace_rows` rows.
__device__ inline int WorkspaceSlot(const SamplingRow& r, int row, int workspace_rows) {
  const int slot = r.workspace_row >= 0 ? r.workspace_row : row;
  return slot < workspace_rows ? slot : -1;
}

// worker/sampling Argmax: lowest index of the maximum, NaN skipped, 0 when nothing is > -inf.
// Sets *max_value to that maximum (-inf when none).
__device__ inline int RowArgmax(const float* logits, int vocab, SamplingShared& s,
                                float* max_value) {
  float best_value = -INFINITY;
  int best = INT32_MAX;
  // Rounds of kArgmaxLoads loads per thread issued before any compare (a 150k vocabulary is
  // ~300 loads per thread: one at a time, the scan waits on each). Each thread still visits its
  // indices in increasing order.
  constexpr int kArgmaxLoads = 8;
  const int stride = blockDim.x;
  for (int base = threadIdx.x; base < vocab; base += kArgmaxLoads * stride) {
    float x[kArgmaxLoads];
#pragma unroll
    for (int u = 0; u < kArgmaxLoads; ++u) {
      const int i = base + u * stride;
      x[u] = i < vocab ? logits[i] : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kArgmaxLoads; ++u) {
      if (x[u] > best_value) {  // strict: keeps this thread's first of equal values, skips NaN
        best_value = x[u];
        best = base + u * stride;
      }
    }
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(0xffffffffu, best_value, offset);
    const int other = __shfl_xor_sync(0xffffffffu, best, offset);
    if (other_value > best_value || (other_value == best_value && other < best)) {
      best_value = other_value;
      best = other;
    }
  }
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) {
    s.values[warp] = best_value;
    s.indices[warp] = best;
  }
  __syncthreads();
  best_value = -INFINITY;
  best = INT32_MAX;
  for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) {
    if (s.values[w] > best_value || (s.values[w] == best_value && s.indices[w] < best)) {
      best_value = s.values[w];
      best = s.indices[w];
    }
  }
  __syncthreads();
  *max_value = best_value;
  return best_value > -INFINITY ? best : 0;
}

// Monotonic uint32 key of a float (larger float, larger key; -0 < +0).
__device__ inline uint32_t OrderedKey(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

__device__ inline float FromOrderedKey(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

// Writes the row's distribution into w[0, vocab) (probabilities, normalised as the CPU's
// floats are) for a non-greedy row whose maximum logit `max_logit` is > -inf.
__device__ inline void RowDistribution(const float* logits, int vocab, const SamplingRow& r,
                                       float max_logit, float* w, SamplingShared& s) {
  // z = (l - max) / T in [-inf, 0]; NaN and -inf -> -inf; +inf maximum: the +inf tokens share.
  const double inv_temperature = 1.0 / static_cast<double>(r.temperature);
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float l = logits[i];
    float z;
    if (max_logit == INFINITY) {
      z = l == INFINITY ? 0.0f : -INFINITY;
    } else {
      z = !(l > -INFINITY)
              ? -INFINITY
              : static_cast<float>((static_cast<double>(l) - max_logit) * inv_temperature);
    }
    w[i] = z;
  }
  __syncthreads();

  // Top-k on z: the largest key K with count(key(z) >= K) >= k is the k-th largest value; every
  // z >= it survives (ties included), -inf never does.
  float z_threshold = -INFINITY;
  const bool top_k = r.top_k > 0 && r.top_k < vocab;
  if (top_k) {
    uint32_t result = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t candidate = result | (1u << bit);
      int count = 0;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) count += OrderedKey(w[i]) >= candidate;
      if (BlockSum(count, s.ints) >= r.top_k) result = candidate;
    }
    z_threshold = FromOrderedKey(result);
  }
  // Weights exp(z); the maximum has weight exactly 1.
  double total = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float z = w[i];
    const float weight = (top_k && !(z >= z_threshold && z > -INFINITY)) ? 0.0f : expf(z);
    w[i] = weight;
    total += weight;
  }
  total = BlockSum(total, s.doubles);

  if (r.top_p < 1.0f) {
    const double needed = static_cast<double>(r.top_p) * total;
    // w* = the largest weight t with mass(w >= t) >= needed: the last kept weight.
    uint32_t result = 0;
    for (int bit = 30; bit >= 0; --bit) {
      const uint32_t candidate = result | (1u << bit);
      // No weight exceeds exp(0) = 1: larger candidates (and NaN patterns) keep nothing, and
      // capping here makes top_p <= 0 keep only the heaviest token, as on the CPU.
      if (candidate > 0x3f800000u) continue;
      const float t = __uint_as_float(candidate);
      double mass = 0.0;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) mass += w[i] >= t ? w[i] : 0.0f;
      if (BlockSum(mass, s.doubles) >= needed) result = candidate;
    }
    if (result != 0) {
      const float last = __uint_as_float(result);
      double above = 0.0;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) above += w[i] > last ? w[i] : 0.0f;
      above = BlockSum(above, s.doubles);
      // Ties at `last` are kept in index order while the mass before them is below `needed`;
      // the heaviest token (rank 0) always stays.
      int ties_before = 0;
      double kept = 0.0;
      for (int base = 0; base < vocab; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const bool tie = i < vocab && w[i] == last;
        int chunk_ties = 0;
        const int before = ties_before + BlockExclusiveScan(tie ? 1 : 0, s.ints, &chunk_ties);
        if (i < vocab) {
          if (tie) {
            const double mass_before = above + static_cast<double>(before) * last;
            if (!(mass_before < needed || (above == 0.0 && before == 0))) w[i] = 0.0f;
          } else if (w[i] < last) {
            w[i] = 0.0f;
          }
          kept += w[i];
        }
        ties_before += chunk_ties;
      }
      total = BlockSum(kept, s.doubles);
    }
  }
  if (r.min_p > 0.0f) {
    float max_weight = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) max_weight = fmaxf(max_weight, w[i]);
    const float threshold = fminf(r.min_p, 1.0f) * BlockMax(max_weight, s.floats);
    double kept = 0.0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (w[i] < threshold) {
        w[i] = 0.0f;
      } else {
        kept += w[i];
      }
    }
    total = BlockSum(kept, s.doubles);
  }
  const double inv_total = 1.0 / total;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    w[i] = static_cast<float>(w[i] * inv_total);
  }
  __syncthreads();
}

// Sum of the usable entries of probs (double).
__device__ inline double UsableSum(const float* probs, int vocab, SamplingShared& s) {
  double total = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (Usable(probs[i])) total += probs[i];
  }
  return BlockSum(total, s.doubles);
}

// worker/sampling SampleFromDistribution: the first index (in index order) whose cumulative
// usable mass exceeds u * total; the last usable entry if rounding runs off the end; -1 when
// nothing is usable.
__device__ inline int InverseCdf(const float* probs, int vocab, double u, SamplingShared& s) {
  const double total = UsableSum(probs, vocab, s);
  if (!(total > 0.0)) return -1;
  if (!(u > 0.0)) u = 0.0;
  if (u >= 1.0) u = 0x1.fffffffffffffp-1;
  const double target = u * total;
  if (threadIdx.x == 0) s.found = INT32_MAX;
  __syncthreads();
  int last_usable = -1;
  double carry = 0.0;
  for (int base = 0; base < vocab; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const float p = i < vocab && Usable(probs[i]) ? probs[i] : 0.0f;
    if (p > 0.0f) last_usable = i;
    double chunk = 0.0;
    const double before = carry + BlockExclusiveScan(static_cast<double>(p), s.doubles, &chunk);
    // The smallest such index: the scan's partial sums need not be monotone to the last bit.
    if (p > 0.0f && before + p > target) atomicMin(&s.found, i);
    __syncthreads();
    if (s.found != INT32_MAX) break;
    carry += chunk;
  }
  const int found = s.found;
  int last = last_usable;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    last = max(last, __shfl_xor_sync(0xffffffffu, last, offset));
  }
  if (threadIdx.x % kWarpSize == 0) s.ints[threadIdx.x / kWarpSize] = last;
  __syncthreads();
  for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) last = max(last, s.ints[w]);
  __syncthreads();
  return found != INT32_MAX ? found : last;
}

}  // namespace tandem::kernels::cuda::internal
