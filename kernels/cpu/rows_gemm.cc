#include "kernels/cpu/rows_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec.h"

// The helpers below take and return wide vectors; they are internal and inlined into callers
// compiled for the matching instruction set, so no call ever crosses the ABI GCC warns about.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::kernels::cpu {

namespace {

using vec::Load;
using vec::VecOf;

// The lanes' sum in a fixed pairwise order: the upper half added to the lower half until one lane
// is left (lane i += lane i + W/2, then the same on the W/2 lanes left). Done on vectors, in
// registers: the same additions in the same order as on scalars, so the same bits.
template <int W>
inline __attribute__((always_inline)) float Sum(typename VecOf<W>::type v) {
  if constexpr (W == 1) {
    return v[0];
  } else {
    using Half = typename VecOf<W / 2>::type;
    Half lo, hi;
    std::memcpy(&lo, &v, sizeof(Half));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(Half), sizeof(Half));
    return Sum<W / 2>(lo + hi);
  }
}

// A tile: R weight rows (w, rows ldw apart) against G input rows (x, rows ldx apart). Every product
// is summed in the same order whatever R and G are: W-lane partial sums over k in steps of W, the
// lanes' pairwise sum, then the tail of k (k % W) in order. So a row of a many-row product equals
// the one-row product of that row bit for bit.
//
// A tile's input rows pass over its weight rows in groups of G; each group's partial sums wait in
// memory (stored and reloaded, so the same bits) until the last step of k. With a long k (past
// kChunk floats) every group passes over one chunk of k before the next chunk, so that the tile's
// chunk stays in cache for all groups. (Measured, two threads, bench models of 400 MB and 1.5 GB:
// chunks of 256 floats cost 4-19% at 2-16 rows, chunks of 2048 are within noise of none at k <=
// 2048 and 2-5% faster at 8-16 rows with k = 12288.)
constexpr int kChunk = 2048;

// The steps of k in [i0, i1) for one tile, its partial sums acc[a * G + j] (zero when `first`).
// With a prefetch address `pf` (the next tile's R rows, contiguous from there), each step also
// asks for the next R * W floats from it, so the next tile arrives while this one computes: a
// tile's rows are R short streams, too short for the hardware prefetcher to run ahead of.
template <int W, int R, int G>
inline __attribute__((always_inline)) void Steps(const float* __restrict w, size_t ldw,
                                                 const float* __restrict x, size_t ldx, int i0,
                                                 int i1, const float* pf, bool first,
                                                 typename VecOf<W>::type* __restrict acc_mem) {
  using V = typename VecOf<W>::type;
  V acc[R][G];
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a) {
#pragma GCC unroll 8
    for (int j = 0; j < G; ++j) acc[a][j] = first ? V{} : acc_mem[a * G + j];
  }
#pragma GCC unroll 4  // fewer loop branches between steps: 7% on an in-cache 16-row product
  for (int i = i0; i < i1; i += W) {
    if (pf != nullptr) {
#pragma GCC unroll 8
      for (int line = 0; line < R * W; line += 16) __builtin_prefetch(pf + R * i + line);
    }
    V wv[R];
#pragma GCC unroll 8
    for (int a = 0; a < R; ++a) wv[a] = Load<W>(w + a * ldw + i);
#pragma GCC unroll 8
    for (int j = 0; j < G; ++j) {
      const V xv = Load<W>(x + j * ldx + i);
#pragma GCC unroll 8
      for (int a = 0; a < R; ++a) acc[a][j] += wv[a] * xv;
    }
  }
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a) {
#pragma GCC unroll 8
    for (int j = 0; j < G; ++j) acc_mem[a * G + j] = acc[a][j];
  }
}

// The tile's dot products from its partial sums (steps over [0, kv)): out[a * g + j].
template <int W, int R>
inline __attribute__((always_inline)) void Finish(const float* w, size_t ldw, const float* x,
                                                  size_t ldx, int k, int kv, int g,
                                                  const typename VecOf<W>::type* acc_mem,
                                                  float* out) {
  for (int a = 0; a < R; ++a) {
    for (int j = 0; j < g; ++j) {
      float sum = kv > 0 ? Sum<W>(acc_mem[a * g + j]) : 0.0f;
      for (int t = kv; t < k; ++t) {
        sum += w[a * ldw + t] * x[j * ldx + t];
      }
      out[a * g + j] = sum;
    }
  }
}

// Steps for the g-row group of input rows at x (1 <= g <= G).
template <int W, int R, int G>
inline __attribute__((always_inline)) void GroupSteps(const float* w, size_t ldw, const float* x,
                                                      size_t ldx, int g, int i0, int i1,
                                                      const float* pf, bool first,
                                                      typename VecOf<W>::type* acc_mem) {
  if constexpr (G > 1) {
    if (g < G) return GroupSteps<W, R, G - 1>(w, ldw, x, ldx, g, i0, i1, pf, first, acc_mem);
  }
  Steps<W, R, G>(w, ldw, x, ldx, i0, i1, pf, first, acc_mem);
}

// Weight rows r..r+R-1 against every input row: y[j, r + a] = beta * y + alpha * x[j] . w[r + a].
// `pf`: the next tile's rows, asked for during the first group's steps (or null).
template <int W, int R, int G>
inline __attribute__((always_inline)) void Tile(const RowsProduct& p, int r, const float* pf) {
  using V = typename VecOf<W>::type;
  constexpr int kMaxGroups = (kRowsMaxM + G - 1) / G;
  V acc[kMaxGroups][R * G];
  float sums[R * G];
  const size_t ldw = p.ldw > 0 ? p.ldw : p.k, ldx = p.ldx > 0 ? p.ldx : p.k;
  const float* w = p.w + r * ldw;
  const int kv = p.k - p.k % W;  // the steps' part of k
  for (int i0 = 0; i0 < kv; i0 += kChunk) {
    const int i1 = std::min(kv, i0 + kChunk);
    for (int j0 = 0, group = 0; j0 < p.m; j0 += G, ++group) {
      GroupSteps<W, R, G>(w, ldw, p.x + j0 * ldx, ldx, std::min(G, p.m - j0), i0, i1,
                          group == 0 ? pf : nullptr, i0 == 0, acc[group]);
    }
  }
  for (int j0 = 0, group = 0; j0 < p.m; j0 += G, ++group) {
    const int g = std::min(G, p.m - j0);
    Finish<W, R>(w, ldw, p.x + j0 * ldx, ldx, p.k, kv, g, acc[group], sums);
    for (int a = 0; a < R; ++a) {
      for (int j = 0; j < g; ++j) {
        float* out = p.y + static_cast<size_t>(j0 + j) * p.ldy + r + a;
        const float value = p.alpha * sums[a * g + j];
        // beta == 0 must not read y: it may hold garbage (0 * NaN is NaN).
        *out = p.beta == 0.0f ? value : p.beta * *out + value;
      }
    }
  }
}

// y[j, r] = beta * y[j, r] + alpha * x[j] . w[r] for weight rows [r0, r1), every input row.
template <int W, int R, int G>
inline __attribute__((always_inline)) void Rows(const RowsProduct& p, int r0, int r1) {
  int r = r0;
  for (; r + R <= r1; r += R) {
    // The next tile is asked for when tiles have several rows (several input rows) and sit
    // contiguous in memory.
    const bool contiguous = p.ldw == 0 || p.ldw == p.k;
    const float* next =
        R > 1 && contiguous && r + 2 * R <= p.n ? p.w + static_cast<size_t>(r + R) * p.k : nullptr;
    Tile<W, R, G>(p, r, next);
  }
  for (; r < r1; ++r) Tile<W, 1, G>(p, r, nullptr);  // the last rows of the range, one at a time
}

// Every weight row of [r0, r1) against every input row, tiles of R weight rows x G input rows;
// one input row (a decode step) streams the weights a row at a time: sharing a tile's weight loads
// pays only when several input rows use them (measured with the prefetch, two threads: 4-row
// tiles for one row cost 0-6% more).
template <int W, int R, int G>
inline __attribute__((always_inline)) void Product(const RowsProduct& p, int r0, int r1) {
  if (p.m == 1) {
    Rows<W, 1, 1>(p, r0, r1);
  } else {
    Rows<W, R, G>(p, r0, r1);
  }
}

// Sixteen rows' 16-lane partial sums to their sixteen lane sums in one vector (lane a: row a),
// each summed in Sum<16>'s order (lane i plus lane i + 8, then i + 4, i + 2, i + 1): the vectors
// are transposed as they are added, 15 vector additions for the 16 sums instead of 4 each.
inline __attribute__((always_inline)) VecOf<16>::type Sums16(const VecOf<16>::type* v) {
  using V = VecOf<16>::type;
  V c[8], e[4], g[2];
  // Halves: c[i] is [row 2i's 8 sums | row 2i + 1's 8 sums].
  for (int i = 0; i < 8; ++i) {
    c[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                   20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                   27, 28, 29, 30, 31);
  }
  // Quarters: e[i] holds rows 4i .. 4i + 3, 4 sums each.
  for (int i = 0; i < 4; ++i) {
    e[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19,
                                   24, 25, 26, 27) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                   23, 28, 29, 30, 31);
  }
  // Pairs: g[i] holds rows 8i .. 8i + 7, 2 sums each.
  for (int i = 0; i < 2; ++i) {
    g[i] = __builtin_shufflevector(e[2 * i], e[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21,
                                   24, 25, 28, 29) +
           __builtin_shufflevector(e[2 * i], e[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22,
                                   23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(g[0], g[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                 30) +
         __builtin_shufflevector(g[0], g[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                 31);
}

// AVX-512, beta == 0 and k a multiple of 16: weight rows [r0, r1) in tiles of 16 rows x one input
// row, their sums taken together by Sums16; the rows left over (fewer than 16) through Product.
// Each output has Steps' multiply-add chain and Sum<16>'s lane sum, so the same bits as Product.
// For attention's scores over a block of cached keys (the tile's rows stay in L1 for each query
// head); Linear's products keep Product, whose tiles stream fewer weight rows at a time.
inline __attribute__((always_inline)) void Rows16(const RowsProduct& p, int r0, int r1) {
  using V = VecOf<16>::type;
  const size_t ldw = p.ldw > 0 ? p.ldw : p.k, ldx = p.ldx > 0 ? p.ldx : p.k;
  int r = r0;
  for (; r + 16 <= r1; r += 16) {
    const float* w = p.w + r * ldw;
    for (int j = 0; j < p.m; ++j) {
      const float* x = p.x + j * ldx;
      V acc[16];
#pragma GCC unroll 16
      for (int a = 0; a < 16; ++a) acc[a] = V{};
      for (int i = 0; i < p.k; i += 16) {
        const V xv = Load<16>(x + i);
#pragma GCC unroll 16
        for (int a = 0; a < 16; ++a) acc[a] += Load<16>(w + a * ldw + i) * xv;
      }
      const V out = p.alpha * Sums16(acc);
      std::memcpy(p.y + static_cast<size_t>(j) * p.ldy + r, &out, sizeof(out));
    }
  }
  if (r < r1) Product<16, 4, 4>(p, r, r1);
}

// Weighted rows into T vectors of the flattened [heads, d] output starting at float f0 (d a
// multiple of W): the outputs stay in registers across the rows.
template <int W, int T>
inline __attribute__((always_inline)) void WeightedTile(const WeightedRows& p, int f0) {
  using V = typename VecOf<W>::type;
  V acc[T];
  const float* weights[T];
  int column[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const int f = f0 + t * W;
    acc[t] = Load<W>(p.out + f);
    weights[t] = p.weights + static_cast<size_t>(f / p.d) * p.ldwt;
    column[t] = f % p.d;
  }
  const int first_head = f0 / p.d, last_head = (f0 + T * W - 1) / p.d;
  for (int r = 0; r < p.rows; ++r) {
    bool any = false;
    for (int h = first_head; h <= last_head; ++h) any |= p.weights[h * p.ldwt + r] != 0.0f;
    if (!any) continue;
    const float* row = p.v + r * p.ldv;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] += weights[t][r] * Load<W>(row + column[t]);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) std::memcpy(p.out + f0 + t * W, &acc[t], sizeof(V));
}

// The last `count` (1 <= count <= T) output vectors in one tile of their size.
template <int W, int T>
inline __attribute__((always_inline)) void WeightedTail(const WeightedRows& p, int f0, int count) {
  if constexpr (T > 1) {
    if (count < T) return WeightedTail<W, T - 1>(p, f0, count);
  }
  WeightedTile<W, T>(p, f0);
}

// Every head's outputs in registers at once (HEADS heads of PER vectors): each value row is loaded
// once for all heads, each weight once, and a row is skipped when every head's weight is 0. The
// same multiply-adds in the same order as WeightedTile's: a row WeightedTile skips for some heads
// only adds 0 * v here, which leaves a sum that started at +0 unchanged (it is never -0).
template <int W, int PER, int HEADS>
inline __attribute__((always_inline)) void WeightedHeads(const WeightedRows& p) {
  using V = typename VecOf<W>::type;
  constexpr int kD = PER * W;
  V acc[HEADS][PER];
#pragma GCC unroll 16
  for (int h = 0; h < HEADS; ++h) {
#pragma GCC unroll 16
    for (int c = 0; c < PER; ++c) acc[h][c] = Load<W>(p.out + h * kD + c * W);
  }
  for (int r = 0; r < p.rows; ++r) {
    float weight[HEADS];
    bool any = false;
#pragma GCC unroll 16
    for (int h = 0; h < HEADS; ++h) {
      weight[h] = p.weights[h * p.ldwt + r];
      any |= weight[h] != 0.0f;
    }
    if (!any) continue;
    const float* row = p.v + r * p.ldv;
    V values[PER];
#pragma GCC unroll 16
    for (int c = 0; c < PER; ++c) values[c] = Load<W>(row + c * W);
#pragma GCC unroll 16
    for (int h = 0; h < HEADS; ++h) {
#pragma GCC unroll 16
      for (int c = 0; c < PER; ++c) acc[h][c] += weight[h] * values[c];
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < HEADS; ++h) {
#pragma GCC unroll 16
    for (int c = 0; c < PER; ++c) std::memcpy(p.out + h * kD + c * W, &acc[h][c], sizeof(V));
  }
}

// WeightedHeads for 1 .. HEADS heads.
template <int W, int PER, int HEADS>
inline __attribute__((always_inline)) void WeightedHeadsUpTo(const WeightedRows& p) {
  if constexpr (HEADS > 1) {
    if (p.heads < HEADS) return WeightedHeadsUpTo<W, PER, HEADS - 1>(p);
  }
  WeightedHeads<W, PER, HEADS>(p);
}

template <int W>
inline __attribute__((always_inline)) void Weighted(const WeightedRows& p) {
  // AVX-512 (32 registers): up to 16 output vectors at once for heads of 64 or 128.
  if constexpr (W == 16) {
    if (p.d == 64 && p.heads <= 4) return WeightedHeadsUpTo<W, 4, 4>(p);
    if (p.d == 128 && p.heads <= 2) return WeightedHeadsUpTo<W, 8, 2>(p);
  }
  constexpr int kTile = 8;  // output vectors held in registers
  const int total = p.heads * p.d;
  if (p.d % W != 0) {  // odd head sizes: one output at a time, rows in order all the same
    for (int f = 0; f < total; ++f) {
      const float* weights = p.weights + static_cast<size_t>(f / p.d) * p.ldwt;
      float sum = p.out[f];
      for (int r = 0; r < p.rows; ++r) {
        if (weights[r] != 0.0f) sum += weights[r] * p.v[r * p.ldv + f % p.d];
      }
      p.out[f] = sum;
    }
    return;
  }
  int f0 = 0;
  for (; f0 + kTile * W <= total; f0 += kTile * W) WeightedTile<W, kTile>(p, f0);
  const int left = (total - f0) / W;  // fewer than kTile vectors
  if (left > 0) WeightedTail<W, kTile - 1>(p, f0, left);
}

// One version per instruction set; a process uses one of them for every product, so decode and
// verify steps sum alike. Multiply-adds may fuse (FMA) inside them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TANDEM_ROWS_X86 1
__attribute__((target("avx512f"), optimize("fp-contract=fast"))) void RowsAvx512(
    const RowsProduct& p, int r0, int r1) {
  Product<16, 4, 4>(p, r0, r1);
}
// InvokeRowsSerial's AVX-512 version: the same sums, 16-row tiles where they apply.
__attribute__((target("avx512f"), optimize("fp-contract=fast"))) void RowsSerialAvx512(
    const RowsProduct& p, int r0, int r1) {
  if (p.beta == 0.0f && p.k % 16 == 0 && r1 - r0 >= 16) return Rows16(p, r0, r1);
  Product<16, 4, 4>(p, r0, r1);
}
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) void RowsAvx2(
    const RowsProduct& p, int r0, int r1) {
  Product<8, 2, 4>(p, r0, r1);
}
#endif
void RowsPortable(const RowsProduct& p, int r0, int r1) { Product<4, 2, 4>(p, r0, r1); }
#ifdef TANDEM_ROWS_X86
__attribute__((target("avx512f"), optimize("fp-contract=fast"))) void WeightedAvx512(
    const WeightedRows& p) {
  Weighted<16>(p);
}
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) void WeightedAvx2(
    const WeightedRows& p) {
  Weighted<8>(p);
}
#endif
void WeightedPortable(const WeightedRows& p) { Weighted<4>(p); }

// The FMA peak of one thread in the same instruction set: kChains independent multiply-add
// chains of W lanes in registers, `steps` rounds. Returns the chains' sum (kept observable).
template <int W>
inline __attribute__((always_inline)) float FmaChains(long steps, float a, float b) {
  using V = typename VecOf<W>::type;
  constexpr int kChains = 12;  // more than FMA latency x issue width on current cores
  V acc[kChains];
#pragma GCC unroll 12
  for (int c = 0; c < kChains; ++c) acc[c] = V{} + static_cast<float>(c);
  for (long s = 0; s < steps; ++s) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
  }
  float sum = 0.0f;
  for (int c = 0; c < kChains; ++c) sum += Sum<W>(acc[c]);
  return sum;
}
constexpr long kPeakChainFlops = 12L * 2;  // per step and lane

#ifdef TANDEM_ROWS_X86
__attribute__((target("avx512f"), optimize("fp-contract=fast"))) float PeakAvx512(long steps,
                                                                                  float a,
                                                                                  float b) {
  return FmaChains<16>(steps, a, b);
}
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) float PeakAvx2(long steps,
                                                                                 float a, float b) {
  return FmaChains<8>(steps, a, b);
}
#endif
float PeakPortable(long steps, float a, float b) { return FmaChains<4>(steps, a, b); }

using RowsFn = void (*)(const RowsProduct&, int, int);

RowsFn PickRows() {
#ifdef TANDEM_ROWS_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return RowsAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return RowsAvx2;
#endif
  return RowsPortable;
}

const RowsFn kRows = PickRows();

// The version of the same instruction set for InvokeRowsSerial.
RowsFn PickRowsSerial() {
#ifdef TANDEM_ROWS_X86
  if (kRows == RowsAvx512) return RowsSerialAvx512;
#endif
  return kRows;
}

const RowsFn kRowsSerial = PickRowsSerial();

using WeightedFn = void (*)(const WeightedRows&);

// The version of the same instruction set as kRows.
WeightedFn PickWeighted() {
#ifdef TANDEM_ROWS_X86
  if (kRows == RowsAvx512) return WeightedAvx512;
  if (kRows == RowsAvx2) return WeightedAvx2;
#endif
  return WeightedPortable;
}

const WeightedFn kWeighted = PickWeighted();

const char* RowsName() {
#ifdef TANDEM_ROWS_X86
  if (kRows == RowsAvx512) return "avx512";
  if (kRows == RowsAvx2) return "avx2";
#endif
  return "portable";
}

}  // namespace

void InvokeRowsSerial(const RowsProduct& p) {
  if (p.m > 0 && p.n > 0) kRowsSerial(p, 0, p.n);
}

void InvokeWeightedRowsSerial(const WeightedRows& p) {
  if (p.rows > 0 && p.heads > 0 && p.d > 0) kWeighted(p);
}

void InvokeRows(const RowsProduct& p) {
  if (p.m <= 0 || p.n <= 0) return;
  // Row blocks of 16 (a multiple of every version's R) split across the pool, so that threads
  // never share an output cache line and every tile but the range's last is full.
  constexpr int kBlock = 16;
  const int blocks = (p.n + kBlock - 1) / kBlock;
  const long work = static_cast<long>(p.n) * p.k * p.m;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (work > (1 << 16))
  for (int b = 0; b < blocks; ++b) {
    kRows(p, b * kBlock, std::min(p.n, (b + 1) * kBlock));
  }
}

const char* RowsKernelName() { return RowsName(); }

double RowsPeakFlops() {
  float (*peak)(long, float, float) = PeakPortable;
  int lanes = 4;
#ifdef TANDEM_ROWS_X86
  if (kRows == RowsAvx512) peak = PeakAvx512, lanes = 16;
  if (kRows == RowsAvx2) peak = PeakAvx2, lanes = 8;
#endif
  const int threads = CpuThreads();
  constexpr long kSteps = 1L << 21;  // a few milliseconds a thread
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int round = 0; round < 4; ++round) {  // the first warms the cores up
    const double start = omp_get_wtime();
    float sum = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    sum += peak(kSteps, 0.999999f, 1e-7f);
    const double seconds = omp_get_wtime() - start;
    sink = sink + sum;
    if (round > 0) {
      best =
          std::max(best, static_cast<double>(threads) * kSteps * lanes * kPeakChainFlops / seconds);
    }
  }
  return best;
}

}  // namespace tandem::kernels::cpu
