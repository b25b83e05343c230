#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::kernels::cpu {

namespace {

inline const float* Row(const float* cache, const AttentionParams& p, int slot, int kv_head) {
  const int block = p.block_table[slot / p.block_size];
  const size_t row = static_cast<size_t>(block) * p.block_size + slot % p.block_size;
  return cache + (row * p.kv_heads + kv_head) * p.head_dim;
}

inline bool Sees(const AttentionParams& p, int query, int new_token) {
  return (p.mask[static_cast<size_t>(query) * p.mask_words + new_token / 64] >> (new_token % 64)) &
         1u;
}

}  // namespace

const char* AttentionCheck(const AttentionParams& p) {
  if (!p.q || !p.k_cache || !p.v_cache || !p.block_table || !p.out) return "null pointer";
  if (p.block_size <= 0) return "block_size must be positive";
  if (p.context_len < 0 || p.new_tokens < 0) return "negative length";
  if (p.new_tokens > 0 && (!p.mask || p.mask_words < (p.new_tokens + 63) / 64)) {
    return "mask too small";
  }
  if (p.q_heads <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0) {
    return "q_heads must be a positive multiple of kv_heads";
  }
  if (p.head_dim <= 0) return "head_dim must be positive";
  if (p.window < 0) return "window must not be negative";
  if (p.q_stride < p.q_heads * p.head_dim || p.out_stride < p.q_heads * p.head_dim) {
    return "row stride smaller than q_heads * head_dim";
  }
  return "";
}

size_t AttentionWorkspaceFloats(const AttentionParams& p) {
  return static_cast<size_t>(p.context_len + p.new_tokens) * omp_get_max_threads();
}

void AttentionInvoke(const AttentionParams& p, float* workspace) {
  const int group = p.q_heads / p.kv_heads;
  const int total = p.context_len + p.new_tokens;
  const int work = p.new_tokens * p.q_heads;
  // Parallel over (query, head); each thread scores into its own slice of the workspace.
#pragma omp parallel for schedule(static) if (static_cast <long>(work) * total > 8192)
  for (int item = 0; item < work; ++item) {
    const int i = item / p.q_heads;
    const int h = item % p.q_heads;
    const int g = h / group;
    float* scores = workspace + static_cast<size_t>(omp_get_thread_num()) * total;
    const float* q =
        p.q + static_cast<size_t>(i) * p.q_stride + static_cast<size_t>(h) * p.head_dim;
    float max_score = -std::numeric_limits<float>::infinity();
    const int first = p.window > 0 ? std::max(0, p.context_len + i - p.window + 1) : 0;
    for (int s = 0; s < total; ++s) {
      if (s < first || (s >= p.context_len && !Sees(p, i, s - p.context_len))) {
        scores[s] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float* k = Row(p.k_cache, p, s, g);
      float dot = 0.0f;
      for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
      scores[s] = dot * p.scale;
      max_score = std::max(max_score, scores[s]);
    }
    float* out =
        p.out + static_cast<size_t>(i) * p.out_stride + static_cast<size_t>(h) * p.head_dim;
    std::fill(out, out + p.head_dim, 0.0f);
    if (max_score == -std::numeric_limits<float>::infinity()) continue;  // sees nothing
    float denom = 0.0f;
    for (int s = 0; s < total; ++s) {
      if (scores[s] == -std::numeric_limits<float>::infinity()) continue;
      const float w = std::exp(scores[s] - max_score);
      denom += w;
      const float* v = Row(p.v_cache, p, s, g);
      for (int d = 0; d < p.head_dim; ++d) out[d] += w * v[d];
    }
    const float inv = 1.0f / denom;
    for (int d = 0; d < p.head_dim; ++d) out[d] *= inv;
  }
}

}  // namespace tandem::kernels::cpu
