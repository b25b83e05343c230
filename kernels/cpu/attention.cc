#include "kernels/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/rows_gemm.h"
#include "kernels/cpu/vec.h"

namespace tandem::kernels::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows (query, q head) of one score tile on the GEMM path. A tile's scores, [rows, keys], stay
// in cache between the two products and the softmax; fewer rows also compute less of the causal
// triangle's far side. 64 to 256 measure alike; 128 is the middle.
constexpr int kTileRows = 128;
// Score multiply-adds up to which an extend's attention stays on one thread. An OpenMP team costs
// little on idle cores, but on busy ones its barrier waits a scheduler slice for a preempted
// thread. A decode step at 256 keys (0.2M on the bench engine's model) stays on one thread; one
// at 512 keys (0.4M) splits. Measured (bench engine --extend-cost, 2 threads, medians of six
// alternated runs): against 1M, the decode step at 512 keys took 12.5 ms instead of 13.8-14.4,
// a 2-token extend 15.3 instead of 17.4, a 4-token one 17.6 instead of 18.0; 4M had cost a
// 4-token verify 1.28-1.30 decode steps against 1.13-1.23 with 1M.
constexpr int64_t kParallelWork = int64_t{1} << 18;

// Four floats: the SSE/NEON register every target of ours has. Without -ffast-math the compiler
// does not reorder float reductions on its own, so the reductions below spell the vector
// accumulators out.
using Vec = float __attribute__((vector_size(16)));
constexpr int kVec = 4;

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }

inline float Sum(Vec v) { return (v[0] + v[2]) + (v[1] + v[3]); }

// y[0, n) = w * x[0, n)
void Scale(float w, const float* x, float* y, int n) {
  int d = 0;
  for (; d + kVec <= n; d += kVec) Store(y + d, w * Load(x + d));
  for (; d < n; ++d) y[d] = w * x[d];
}

inline Vec Splat(float x) { return Vec{x, x, x, x}; }

// Turns scores[0, n) into softmax weights exp(s - max) and returns 1 / their sum, then scales
// the weights by it when `normalise`; -inf scores become 0. Returns 0 (and zero weights) when
// every score is -inf. W lanes at a time (vec.h's exp; glibc's scalar expf would cost as much as
// both GEMMs), summed into four running sums in the same order whatever W, so every width gives
// the same bits where no multiply-add is fused.
template <int W>
inline __attribute__((always_inline)) float SoftmaxRowOf(float* s, int n, bool normalise) {
  using Wide = typename vec::VecOf<W>::type;
  Wide wmax = vec::Splat<W>(kNegInf);
  int k = 0;
  for (; k + W <= n; k += W) {
    const Wide x = vec::Load<W>(s + k);
    wmax = x > wmax ? x : wmax;
  }
  float max = kNegInf;
  for (int l = 0; l < W; ++l) max = std::max(max, wmax[l]);
  for (; k < n; ++k) max = std::max(max, s[k]);
  if (max == kNegInf) {
    std::fill(s, s + n, 0.0f);
    return 0.0f;
  }
  Vec sums = {};  // sums[l]: the weights at l, l + 4, l + 8, ... in order
  for (k = 0; k + W <= n; k += W) {
    const Wide e = vec::ExpNonPositive<W>(vec::Load<W>(s + k) - max);
    vec::Store<W>(s + k, e);
    for (int q = 0; q < W; q += kVec) {
      Vec part;
      std::memcpy(&part, reinterpret_cast<const char*>(&e) + q * sizeof(float), sizeof(part));
      sums += part;
    }
  }
  for (; k + kVec <= n; k += kVec) {
    const Vec e = vec::ExpNonPositive<kVec>(Load(s + k) - max);
    Store(s + k, e);
    sums += e;
  }
  if (k < n) {
    // The tail, padded with -inf (weight 0).
    float tail[kVec] = {kNegInf, kNegInf, kNegInf, kNegInf};
    std::memcpy(tail, s + k, sizeof(float) * (n - k));
    const Vec e = vec::ExpNonPositive<kVec>(Load(tail) - max);
    Store(tail, e);
    std::memcpy(s + k, tail, sizeof(float) * (n - k));
    sums += e;
  }
  const float norm = 1.0f / Sum(sums);
  if (normalise) {
    for (k = 0; k + W <= n; k += W) vec::Store<W>(s + k, vec::Load<W>(s + k) * norm);
    for (; k < n; ++k) s[k] *= norm;
  }
  return norm;
}

using SoftmaxFn = float (*)(float*, int, bool);

// Compiled per instruction set without fused multiply-adds (GCC fuses by default in C++ where
// the target has them): every version gives the same bits.
#ifdef TANDEM_KERNELS_X86
__attribute__((target("avx512f"), optimize("fp-contract=off"))) float SoftmaxAvx512(float* s, int n,
                                                                                    bool norm) {
  return SoftmaxRowOf<16>(s, n, norm);
}
__attribute__((target("avx2"), optimize("fp-contract=off"))) float SoftmaxAvx2(float* s, int n,
                                                                               bool norm) {
  return SoftmaxRowOf<8>(s, n, norm);
}
#endif
float SoftmaxPortable(float* s, int n, bool norm) { return SoftmaxRowOf<kVec>(s, n, norm); }

const IsaVersions<SoftmaxFn> kSoftmaxes = {
#ifdef TANDEM_KERNELS_X86
    .avx512 = SoftmaxAvx512,
    .avx2 = SoftmaxAvx2,
#endif
    .portable = SoftmaxPortable};
const SoftmaxFn kSoftmax = kSoftmaxes.Best();

const uint64_t* MaskRow(const AttentionParams& p, int query) {
  return p.mask + static_cast<size_t>(query) * p.mask_words;
}

// Slots [lo, hi) that bound what query i sees: the window's start, and one past its last
// visible new token (the context's end when it sees none). Inside, only new tokens whose mask
// bit is clear are hidden.
struct Span {
  int lo = 0;
  int hi = 0;
};

Span Visible(const AttentionParams& p, int query) {
  Span v;
  if (p.window > 0) v.lo = std::max(0, p.context_len + query - p.window + 1);
  const uint64_t* row = MaskRow(p, query);
  int last = -1;
  for (int w = (p.new_tokens - 1) / 64; w >= 0; --w) {
    uint64_t word = row[w];
    if (w == (p.new_tokens - 1) / 64 && p.new_tokens % 64 != 0) {
      word &= (uint64_t{1} << (p.new_tokens % 64)) - 1;  // bits past new_tokens mean nothing
    }
    if (word != 0) {
      last = w * 64 + 63 - __builtin_clzll(word);
      break;
    }
  }
  v.hi = p.context_len + last + 1;
  return v;
}

// Sets the scores of the new tokens in slots [from, to) that `row`'s query does not see to -inf;
// s[0] is slot `from`.
void HideMasked(const AttentionParams& p, const uint64_t* row, int from, int to, float* s) {
  for (int slot = std::max(from, p.context_len); slot < to;) {
    const int j = slot - p.context_len;
    const uint64_t word = row[j / 64];
    const int end = std::min(to, slot + 64 - j % 64);
    if (word != ~uint64_t{0}) {
      for (; slot < end; ++slot) {
        if (!((word >> ((slot - p.context_len) % 64)) & 1u)) s[slot - from] = kNegInf;
      }
    }
    slot = end;
  }
}

// Calls f(slot, rows, count) for each run of slots [slot, slot + count) of [from, to) inside one
// block, rows being the first one's kv_head row in `cache` (the next rows RowStride(p) floats
// apart). Blocks sit anywhere in the pool, so the hardware prefetcher loses the stream at each
// block edge; the next block's rows are prefetched when a block starts.
size_t RowStride(const AttentionParams& p) { return static_cast<size_t>(p.kv_heads) * p.head_dim; }

template <typename F>
void ForEachBlock(const AttentionParams& p, const float* cache, int kv_head, int from, int to,
                  F f) {
  const size_t row_stride = RowStride(p);
  auto first_row = [&](int block_index) {
    return cache + static_cast<size_t>(p.block_table[block_index]) * p.block_size * row_stride +
           static_cast<size_t>(kv_head) * p.head_dim;
  };
  constexpr int kLineFloats = 16;
  for (int slot = from; slot < to;) {
    const int block = slot / p.block_size;
    const int end = std::min(to, (block + 1) * p.block_size);
    if (end < to) {
      const float* next = first_row(block + 1);
      const int rows = std::min(p.block_size, to - end);
      for (int r = 0; r < rows; ++r, next += row_stride) {
        for (int c = 0; c < p.head_dim; c += kLineFloats) __builtin_prefetch(next + c);
      }
    }
    f(slot, first_row(block) + static_cast<size_t>(slot % p.block_size) * row_stride, end - slot);
    slot = end;
  }
}

// f(slot, row) for every slot in [from, to).
template <typename F>
void ForEachRow(const AttentionParams& p, const float* cache, int kv_head, int from, int to, F f) {
  const size_t row_stride = RowStride(p);
  ForEachBlock(p, cache, kv_head, from, to, [&](int slot, const float* row, int count) {
    for (int r = 0; r < count; ++r, row += row_stride) f(slot + r, row);
  });
}

// Decode and short extends: one work item per kv head. For each block of its cached key rows, in
// slot order, every query scores its `group` q heads against the rows it sees in that block,
// through the few-rows product (rows_gemm.h, the group's heads as its input rows), while the
// block is in cache; then the value rows weigh into the outputs the same way. So an extend reads
// K and V once for all its queries, and each query still makes exactly the calls, on exactly the
// slot runs, that a one-token extend of it makes: its sums do not depend on the other queries.
// Workspace: [new_tokens, group, total] scores per thread.
void InvokeDirect(const AttentionParams& p, SoftmaxFn softmax, float* workspace) {
  const int group = p.q_heads / p.kv_heads;
  const int total = p.context_len + p.new_tokens;
  const int d = p.head_dim;
  const size_t row_stride = RowStride(p);
  const size_t per_query = static_cast<size_t>(group) * total;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (!AttentionRunsSerial(p))
  for (int g = 0; g < p.kv_heads; ++g) {
    float* scores =
        workspace + static_cast<size_t>(omp_get_thread_num()) * p.new_tokens * per_query;
    Span spans[kAttentionDirectMaxTokens];
    int lo = total, hi = 0;  // what any query sees
    for (int i = 0; i < p.new_tokens; ++i) {
      spans[i] = Visible(p, i);
      if (spans[i].hi > spans[i].lo) {
        lo = std::min(lo, spans[i].lo);
        hi = std::max(hi, spans[i].hi);
      }
    }
    auto width = [&](int i) { return std::max(0, spans[i].hi - spans[i].lo); };
    auto query = [&](int i) {
      return p.q + static_cast<size_t>(i) * p.q_stride + static_cast<size_t>(g) * group * d;
    };
    auto output = [&](int i) {
      return p.out + static_cast<size_t>(i) * p.out_stride + static_cast<size_t>(g) * group * d;
    };
    // Query i's part of the run [slot, slot + count): [from, to), clipped to what it sees.
    auto clip = [&](int i, int slot, int count, int* from, int* to) {
      *from = std::max(slot, spans[i].lo);
      *to = std::min(slot + count, spans[i].hi);
      return *from < *to;
    };
    ForEachBlock(p, p.k_cache, g, lo, hi, [&](int slot, const float* keys, int count) {
      for (int i = 0; i < p.new_tokens; ++i) {
        int from = 0, to = 0;
        if (!clip(i, slot, count, &from, &to)) continue;
        const int n = width(i);
        float* s = scores + static_cast<size_t>(i) * per_query;
        for (int h0 = 0; h0 < group; h0 += kRowsMaxM) {
          InvokeRowsSerial({.x = query(i) + static_cast<size_t>(h0) * d,
                            .w = keys + static_cast<size_t>(from - slot) * row_stride,
                            .y = s + static_cast<size_t>(h0) * n + from - spans[i].lo,
                            .m = std::min(kRowsMaxM, group - h0),
                            .n = to - from,
                            .k = d,
                            .ldy = n,
                            .alpha = p.scale,
                            .ldw = static_cast<int>(row_stride),
                            .ldx = d});
        }
      }
    });
    for (int i = 0; i < p.new_tokens; ++i) {
      const int n = width(i);
      for (int h = 0; h < group; ++h) {
        float* s = scores + static_cast<size_t>(i) * per_query + static_cast<size_t>(h) * n;
        HideMasked(p, MaskRow(p, i), spans[i].lo, spans[i].hi, s);
        // Normalising the weights first keeps the output a convex combination of V rows.
        softmax(s, n, true);
      }
      std::fill(output(i), output(i) + group * d, 0.0f);
    }
    ForEachBlock(p, p.v_cache, g, lo, hi, [&](int slot, const float* values, int count) {
      for (int i = 0; i < p.new_tokens; ++i) {
        int from = 0, to = 0;
        if (!clip(i, slot, count, &from, &to)) continue;
        InvokeWeightedRowsSerial(
            {.weights = scores + static_cast<size_t>(i) * per_query + from - spans[i].lo,
             .ldwt = width(i),
             .v = values + static_cast<size_t>(from - slot) * row_stride,
             .ldv = row_stride,
             .rows = to - from,
             .heads = group,
             .d = d,
             .out = output(i)});
      }
    });
  }
}

size_t DirectWorkspace(const AttentionParams& p) {
  return static_cast<size_t>(p.q_heads / p.kv_heads) * (p.context_len + p.new_tokens) *
         p.new_tokens * CpuThreads();
}

// Query rows per tile: whole groups, about kTileRows rows.
int TileQueries(const AttentionParams& p) {
  return std::max(1, kTileRows / (p.q_heads / p.kv_heads));
}

// keys/values[slot] = kv head g's K/V row of slot, for slots [lo, hi); [total, head_dim] each.
void GatherHead(const AttentionParams& p, int g, int lo, int hi, float* keys, float* values) {
  const int d = p.head_dim;
  ForEachRow(p, p.k_cache, g, lo, hi, [&](int slot, const float* row) {
    std::memcpy(keys + static_cast<size_t>(slot) * d, row, sizeof(float) * d);
  });
  ForEachRow(p, p.v_cache, g, lo, hi, [&](int slot, const float* row) {
    std::memcpy(values + static_cast<size_t>(slot) * d, row, sizeof(float) * d);
  });
}

// One tile's scratch; rows = TileQueries * group, ordered query-major with the group's q heads
// adjacent, so a query's rows copy to and from q/out in one piece.
struct TileBuffers {
  float* q;      // [rows, head_dim]
  float* o;      // [rows, head_dim]  P V before normalisation
  float* s;      // [rows, k_hi - k_lo]  scores, then unnormalised weights
  float* norms;  // [rows]  1 / sum of a row's weights (0: sees nothing)
};

size_t TileFloats(const AttentionParams& p) {
  const size_t total = static_cast<size_t>(p.context_len) + p.new_tokens;
  const size_t rows = static_cast<size_t>(TileQueries(p)) * (p.q_heads / p.kv_heads);
  return rows * (2 * p.head_dim + total + 1);
}

TileBuffers Carve(const AttentionParams& p, float* at) {
  const size_t total = static_cast<size_t>(p.context_len) + p.new_tokens;
  const size_t rows = static_cast<size_t>(TileQueries(p)) * (p.q_heads / p.kv_heads);
  TileBuffers b;
  b.q = at;
  b.o = b.q + rows * p.head_dim;
  b.s = b.o + rows * p.head_dim;
  b.norms = b.s + rows * total;
  return b;
}

// One thread's share of the GEMM path's workspace: K and V of one head, and the tile buffers.
size_t GemmWorkspaceOneThread(const AttentionParams& p) {
  return 2 * (static_cast<size_t>(p.context_len) + p.new_tokens) * p.head_dim + TileFloats(p);
}

// One kv head's K and V rows: slot s's at keys/values + (s - base) * ld.
struct HeadRows {
  const float* keys;
  const float* values;
  size_t ld;
  int base;
  const float* Key(int slot) const { return keys + static_cast<size_t>(slot - base) * ld; }
  const float* Value(int slot) const { return values + static_cast<size_t>(slot - base) * ld; }
};

// Queries [i0, i0 + queries) against kv head g, whose K/V rows are `kv`.
void Tile(const AttentionParams& p, SoftmaxFn softmax, int g, int i0, int queries,
          const HeadRows& kv, const TileBuffers& b) {
  const int group = p.q_heads / p.kv_heads;
  const int total = p.context_len + p.new_tokens;
  const int d = p.head_dim;
  const int rows = queries * group;
  int k_lo = total, k_hi = 0;
  for (int i = i0; i < i0 + queries; ++i) {
    const Span v = Visible(p, i);
    if (v.hi <= v.lo) continue;
    k_lo = std::min(k_lo, v.lo);
    k_hi = std::max(k_hi, v.hi);
  }
  const int n = k_hi - k_lo;
  if (n <= 0) {
    for (int i = i0; i < i0 + queries; ++i) {
      float* out =
          p.out + static_cast<size_t>(i) * p.out_stride + static_cast<size_t>(g) * group * d;
      std::fill(out, out + group * d, 0.0f);
    }
    return;
  }
  for (int i = i0; i < i0 + queries; ++i) {
    std::memcpy(b.q + static_cast<size_t>(i - i0) * group * d,
                p.q + static_cast<size_t>(i) * p.q_stride + static_cast<size_t>(g) * group * d,
                sizeof(float) * group * d);
  }
  const int ld = static_cast<int>(kv.ld);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, d, p.scale, b.q, d, kv.Key(k_lo),
              ld, 0.0f, b.s, n);
  for (int r = 0; r < rows; ++r) {
    const int i = i0 + r / group;
    const Span v = Visible(p, i);
    float* s = b.s + static_cast<size_t>(r) * n;
    const int lo = std::max(v.lo, k_lo) - k_lo;
    const int hi = std::max(std::min(v.hi, k_hi) - k_lo, lo);
    std::fill(s, s + lo, 0.0f);
    std::fill(s + hi, s + n, 0.0f);
    HideMasked(p, MaskRow(p, i), lo + k_lo, hi + k_lo, s + lo);
    b.norms[r] = softmax(s + lo, hi - lo, false);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, n, 1.0f, b.s, n, kv.Value(k_lo),
              ld, 0.0f, b.o, d);
  for (int r = 0; r < rows; ++r) {
    const int i = i0 + r / group;
    const int h = g * group + r % group;
    Scale(b.norms[r], b.o + static_cast<size_t>(r) * d,
          p.out + static_cast<size_t>(i) * p.out_stride + static_cast<size_t>(h) * d, d);
  }
}

// Whether slots [lo, hi) sit in consecutive blocks of the pool, so that a kv head's rows are
// evenly strided there (what a sequence's blocks usually are when it runs alone: allocated as it
// grows).
bool Consecutive(const AttentionParams& p, int lo, int hi) {
  const int first = lo / p.block_size, last = (hi - 1) / p.block_size;
  for (int b = first; b < last; ++b) {
    if (p.block_table[b + 1] != p.block_table[b] + 1) return false;
  }
  return true;
}

// Many new tokens (prefill): per kv head, the sequence's K and V rows that any query sees are
// gathered into contiguous [total, head_dim] buffers once (or, when they sit in consecutive
// blocks, read where they are, strided: OpenBLAS packs its operands either way, so the sums are
// the same); then per tile of queries,
// S = scale · Q K^T and O = P V are two SGEMMs over the keys [k_lo, k_hi) some row of the tile
// sees. The kv heads split across the ops' OpenMP pool, each calling single-threaded OpenBLAS
// (gemm.cc: one pool for every op).
//
// Workspace per thread: K and V [total, head_dim] each, then the tile buffers (TileFloats).
void InvokeGemm(const AttentionParams& p, SoftmaxFn softmax, float* workspace) {
  const int total = p.context_len + p.new_tokens;
  const int tile_queries = TileQueries(p);
  int gather_lo = total, gather_hi = 0;
  for (int i = 0; i < p.new_tokens; ++i) {
    const Span v = Visible(p, i);
    if (v.hi <= v.lo) continue;
    gather_lo = std::min(gather_lo, v.lo);
    gather_hi = std::max(gather_hi, v.hi);
  }
  const bool in_place = gather_lo < gather_hi && Consecutive(p, gather_lo, gather_hi);
  const size_t per_thread = GemmWorkspaceOneThread(p);
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (!AttentionRunsSerial(p))
  for (int g = 0; g < p.kv_heads; ++g) {
    float* keys = workspace + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    float* values = keys + static_cast<size_t>(total) * p.head_dim;
    const TileBuffers b = Carve(p, values + static_cast<size_t>(total) * p.head_dim);
    HeadRows kv{.keys = keys, .values = values, .ld = static_cast<size_t>(p.head_dim), .base = 0};
    if (in_place) {
      const size_t at =
          static_cast<size_t>(g) * p.head_dim +
          (static_cast<size_t>(p.block_table[gather_lo / p.block_size]) * p.block_size +
           gather_lo % p.block_size) *
              RowStride(p);
      kv = {
          .keys = p.k_cache + at, .values = p.v_cache + at, .ld = RowStride(p), .base = gather_lo};
    } else {
      GatherHead(p, g, gather_lo, gather_hi, keys, values);
    }
    for (int i0 = 0; i0 < p.new_tokens; i0 += tile_queries) {
      Tile(p, softmax, g, i0, std::min(tile_queries, p.new_tokens - i0), kv, b);
    }
  }
}

size_t GemmWorkspace(const AttentionParams& p) { return GemmWorkspaceOneThread(p) * CpuThreads(); }

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

bool AttentionRunsSerial(const AttentionParams& p) {
  // Multiply-adds of the scores (the weighted sum of values is as many again).
  const int64_t work =
      static_cast<int64_t>(p.q_heads) * p.new_tokens * (p.context_len + p.new_tokens) * p.head_dim;
  return work <= kParallelWork;
}

size_t AttentionWorkspaceFloats(const AttentionParams& p) {
  return p.new_tokens <= kAttentionDirectMaxTokens ? DirectWorkspace(p) : GemmWorkspace(p);
}

namespace {

void Invoke(const AttentionParams& p, SoftmaxFn softmax, float* workspace) {
  if (p.new_tokens <= 0) return;
  if (p.new_tokens <= kAttentionDirectMaxTokens) {
    InvokeDirect(p, softmax, workspace);
  } else {
    InvokeGemm(p, softmax, workspace);
  }
}

}  // namespace

void AttentionInvoke(const AttentionParams& p, float* workspace) { Invoke(p, kSoftmax, workspace); }

std::vector<const char*> AttentionKernelVersions() { return kSoftmaxes.Names(); }

void AttentionInvokeWith(const char* version, const AttentionParams& p, float* workspace) {
  Invoke(p, kSoftmaxes.Named(version), workspace);
}

}  // namespace tandem::kernels::cpu
