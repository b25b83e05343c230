// Paged attention for a batch of extends (kernels/cpu/attention.h per extend, many extends in
// one launch): each extend's new tokens' queries attend to the sequence's committed KV and to
// the extend's own new K/V, both read from the paged cache (the new tokens' K/V are written to
// slots [context_len, context_len + new_tokens) before the call, as the CPU engine does).
//
// Visibility, as worker/model/extend.h defines it, for query i (0-based among the extend's new
// tokens) and slot s of the sequence:
//   - s < context_len: visible (committed KV);
//   - s = context_len + j: visible iff Sees(i, j) for the extend's kind: causal j <= i, full,
//     block j / visibility_block <= i / visibility_block, or bit j of explicit row i. A new
//     token does not see itself unless its kind says so.
//   - sliding window (window > 0): additionally s >= context_len + i - window + 1.
// RoPE positions play no part here (they may repeat; only the indices above matter). A query
// that sees no slot gets a zero output, like the CPU op.
//
// bf16 q, K, V and output; scores, softmax (online, running max) and P·V in fp32. GQA: q head h
// reads kv head h / (q_heads / kv_heads).
//
// Paths: one CTA per (token, q head) walks the visible slots with an online softmax. With few
// CTAs and long contexts (AttentionSplits) the slots are split into chunks processed by
// separate CTAs (split-KV, "flash decoding"); each writes an unnormalised partial (max, sum,
// P·V) to the workspace and a second kernel merges them. Inside a CTA, head_dim 8, 16, ..., 256
// with 16-byte-aligned caches (every model we load) take the vector path: groups of
// head_dim / 8 threads each own a slot, one 16-byte load of its K and of its V per thread, four
// slots per group in flight, each group its own running softmax, merged at the end; other head
// sizes take a tile loop (64 slots scored by warps, then folded into P·V slot by slot).
// TANDEM_CUDA_ATTENTION_VECTOR=0 sends every head size to the tile loop (for comparisons). On
// an H200 the vector path made a Qwen3-8B-shaped decode step 2.9x faster (docs/PERF.md, GPU):
// the tile loop waited on one V row load at a time.
//
// Device-side contract the host cannot check (the data are on the device): extends are ordered
// by token_offset and tile [0, total_tokens) without gaps; block table entries are in
// [0, num_blocks) and cover context_len + new_tokens slots; explicit masks have
// [new_tokens, ceil(new_tokens / 64)] words at mask_offset.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

enum class AttentionVisibility : int32_t { kCausal = 0, kFull = 1, kBlock = 2, kExplicit = 3 };

// One extend of the batch; an array of these lives in device memory.
struct AttentionExtend {
  int32_t token_offset = 0;  // its first row in q / out
  int32_t new_tokens = 0;    // rows [token_offset, token_offset + new_tokens)
  int32_t context_len = 0;   // committed slots, all visible
  AttentionVisibility visibility = AttentionVisibility::kCausal;
  int32_t visibility_block = 0;    // kBlock: block size (> 0)
  int32_t block_table_offset = 0;  // first entry of the sequence's table in block_tables
  int64_t mask_offset = 0;         // kExplicit: first word of its bit rows in masks
};

struct PagedAttentionParams {
  const __nv_bfloat16* q = nullptr;  // [total_tokens, q_heads, head_dim], row stride q_stride
  int q_stride = 0;
  const __nv_bfloat16* k_cache = nullptr;    // [num_blocks, block_size, kv_heads, head_dim]
  const __nv_bfloat16* v_cache = nullptr;    // [num_blocks, block_size, kv_heads, head_dim]
  const int32_t* block_tables = nullptr;     // flat; extend e's table at its block_table_offset
  int block_size = 0;                        // slots per block, > 0
  const AttentionExtend* extends = nullptr;  // [num_extends] device
  int num_extends = 0;
  const uint64_t* masks = nullptr;  // explicit visibility bit rows (null when no extend uses it)
  int total_tokens = 0;             // sum of new_tokens; 0 is a valid no-op
  int q_heads = 0;
  int kv_heads = 0;    // q_heads % kv_heads == 0
  int head_dim = 0;    // 1 .. 256
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
  int window = 0;      // sliding window, 0 = none
  // Host-known bound on context_len + new_tokens over the extends; only steers the split-KV
  // heuristic (a wrong bound costs speed, never correctness).
  int max_kv_len = 0;
  int num_splits = 0;            // 0: AttentionSplits' heuristic; > 0: forced (<= 64)
  __nv_bfloat16* out = nullptr;  // [total_tokens, q_heads, head_dim], row stride out_stride
  int out_stride = 0;
  void* workspace = nullptr;  // split-KV partials; >= WorkspaceBytes
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

// KV splits Invoke will use: 1 unless the launch has too few (token, head) CTAs to fill the GPU
// and the longest sequence is long enough to split (then a power of two up to 16, chunks of
// >= 64 slots).
int AttentionSplits(const PagedAttentionParams& params);

// Split-KV partials: splits * total_tokens * q_heads * (head_dim + 2) floats; 0 with one split.
size_t WorkspaceBytes(const PagedAttentionParams& params);

absl::Status Invoke(const PagedAttentionParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
