// Rotary position embedding with explicit (possibly repeated) per-token positions, "rotate
// half" layout (pairs (i, i + head_dim / 2)) as kernels/cpu/rope.h, applied in place to the q
// heads and the k heads of the same tokens in one launch (they may differ in count: GQA).
// bf16 in memory; angles, cos/sin and the rotation in fp32 (angle = float(position) *
// inv_freq[i], the CPU reference's order). Dynamic NTK scaling, whose table depends on the
// sequence, takes one launch per extend with that extend's table.
//
// With q_norm and k_norm set (Qwen3's per-head RMSNorm before the rotation), each head is first
// RMS-normalised over head_dim and scaled by its weight, rounded to bf16 as a separate norm
// kernel would store it, then rotated: one launch instead of two norms and a rotation.
//
// With k_cache set, the same launch also writes the KV cache, as the CPU engine's copy into
// KvCache::KeyRow / ValueRow before attention: each token's rotated k heads and its v heads are
// stored, bit for bit, at the token's pool row. Slots are pool rows (block * block_size +
// offset, from the sequence's block table on the host); a negative slot skips the token (the
// padding rows of a captured decode graph); a slot past the pool is clamped into it instead of
// writing outside it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

struct RopeParams {
  __nv_bfloat16* q = nullptr;             // [tokens, q_heads, head_dim], row stride q_stride
  int q_stride = 0;                       // elements between tokens, >= q_heads * head_dim
  int q_heads = 0;                        // >= 0
  __nv_bfloat16* k = nullptr;             // [tokens, k_heads, head_dim], row stride k_stride
  int k_stride = 0;                       // (null with k_heads == 0: q only)
  int k_heads = 0;                        // >= 0
  const int32_t* positions = nullptr;     // [tokens] device
  const float* inv_freq = nullptr;        // [head_dim / 2] device, fp32
  float attention_scaling = 1.0f;         // multiplies cos and sin (YaRN / LongRoPE)
  const __nv_bfloat16* q_norm = nullptr;  // [head_dim] device, or null: no norm (with k_norm)
  const __nv_bfloat16* k_norm = nullptr;  // [head_dim] device; set together with q_norm
  float norm_eps = 0.0f;                  // the norms' epsilon, finite, >= 0
  // The fused KV write (all null: none). Rows of k_heads * head_dim values.
  const __nv_bfloat16* v = nullptr;  // [tokens, k_heads, head_dim], row stride v_stride
  int v_stride = 0;
  const int64_t* slots = nullptr;    // [tokens] device: pool row per token, < 0 = skip
  __nv_bfloat16* k_cache = nullptr;  // [pool_rows, k_heads * head_dim] one layer's K pool
  __nv_bfloat16* v_cache = nullptr;  // [pool_rows, k_heads * head_dim] one layer's V pool
  int64_t pool_rows = 0;             // > 0 with k_cache
  int tokens = 0;                    // 0 is a valid no-op
  int head_dim = 0;                  // even, > 0
  void* workspace = nullptr;         // unused (WorkspaceBytes is 0)
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only. q and k may share one row (the fused qkv
  // projection output) but their head ranges must not overlap.
  absl::Status Check() const;
};

size_t WorkspaceBytes(const RopeParams& params);

absl::Status Invoke(const RopeParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
