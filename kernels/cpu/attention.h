// Attention of one extend's new tokens over a paged KV cache.
//
// The sequence's keys/values live in fixed-size blocks: slot s of the sequence is row
// (s % block_size) of block block_table[s / block_size]. Slots [0, context_len) hold committed
// tokens, visible to every query; slots [context_len, context_len + new_tokens) hold the new
// tokens of this extend, and query i sees new token j only when the visibility mask says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::kernels::cpu {

// Extends with at most this many new tokens (decode and short verify steps) take the direct
// path: dot products straight from the paged cache, nothing gathered, each query computed exactly
// as a one-token extend computes it, so such an extend's attention equals that of one-token
// extends bit for bit (with kernels/cpu/rows_gemm.h the whole step is then batch invariant).
// Longer extends take the GEMM path, faster from about 8 new tokens on (bench engine
// --extend-cost, 12/4 heads of 64 at 512 keys, 2 threads: with the direct path up to 16 tokens,
// an 8-token extend cost 1.84 decode steps against 1.55, a 16-token one 2.5 against 2.1).
inline constexpr int kAttentionDirectMaxTokens = 4;

struct AttentionParams {
  const float* q = nullptr;  // [new_tokens, q_heads, head_dim], row stride q_stride
  int q_stride = 0;
  const float* k_cache = nullptr;        // [num_blocks, block_size, kv_heads, head_dim]
  const float* v_cache = nullptr;        // [num_blocks, block_size, kv_heads, head_dim]
  const int32_t* block_table = nullptr;  // [ceil((context_len + new_tokens) / block_size)]
  int block_size = 0;
  int context_len = 0;  // committed tokens, all visible
  int new_tokens = 0;
  // [new_tokens, mask_words] bit-packed rows: bit j of row i set = query i sees new token j.
  const uint64_t* mask = nullptr;
  int mask_words = 0;  // ceil(new_tokens / 64)
  int q_heads = 0;
  int kv_heads = 0;  // q_heads % kv_heads == 0 (GQA)
  int head_dim = 0;
  float scale = 0.0f;  // usually 1 / sqrt(head_dim)
  // Sliding window (Mistral): query i, at slot context_len + i, sees slot s only when
  // context_len + i - s < window. 0 = no window.
  int window = 0;
  float* out = nullptr;  // [new_tokens, q_heads, head_dim], row stride out_stride
  int out_stride = 0;
};

// Empty string when the parameters are consistent, else what is wrong.
const char* AttentionCheck(const AttentionParams& p);
// Floats of scratch memory Invoke needs, for CpuThreads() threads (gemm.h). About
// (2 * head_dim + 128) * (context_len + new_tokens) for an extend past kAttentionDirectMaxTokens,
// new_tokens * group * (context_len + new_tokens) per thread up to it (a decode, a short verify).
size_t AttentionWorkspaceFloats(const AttentionParams& p);
// True when Invoke runs `p` on the calling thread alone (too little work for a parallel loop):
// callers with several such calls (a batch of decode steps) may run them in parallel themselves.
bool AttentionRunsSerial(const AttentionParams& p);
// A query that sees no key at all (possible with context_len == 0 and an empty mask row, or a
// window that excludes every slot it may see) gets a zero output.
//
// Up to kAttentionDirectMaxTokens new tokens read the cache in place. More gather each kv head's
// K/V rows once and run, per tile of queries, S = Q K^T and O = P V as SGEMMs (single-threaded
// OpenBLAS inside the kv heads' split), skipping keys no query of the tile sees (a causal tile's
// far side, slots before a window). Results match a double-precision softmax to about 1e-6 of
// the rows' |V|; the float sums run in a different order than a naive loop, so they are not
// bitwise equal to one. The softmax is vectorised per instruction set, picked once per process;
// every version gives the same bits.
void AttentionInvoke(const AttentionParams& p, float* workspace);

// For tests: every version this CPU can run ("avx512", "avx2", "portable"), and an Invoke
// through one of them by name (a name not listed runs the portable one).
std::vector<const char*> AttentionKernelVersions();
void AttentionInvokeWith(const char* version, const AttentionParams& p, float* workspace);

}  // namespace tandem::kernels::cpu
