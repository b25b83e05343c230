#include "kernels/cpu/rows_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm.h"

// The helpers below take and return wide vectors; they are internal and inlined into callers
// compiled for the matching instruction set, so no call ever crosses the ABI GCC warns about.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::kernels::cpu {

namespace {

// Vectors of W floats (GCC/Clang vector extensions: SSE/NEON registers for 4, AVX for 8,
// AVX-512 for 16 when the function is compiled for that target).
template <int W>
struct VecOf;
template <>
struct VecOf<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct VecOf<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct VecOf<16> {
  typedef float type __attribute__((vector_size(64)));
};

template <int W>
inline __attribute__((always_inline)) typename VecOf<W>::type Load(const float* p) {
  typename VecOf<W>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The lanes' sum in a fixed pairwise order: halves added until one lane is left.
template <int W>
inline __attribute__((always_inline)) float Sum(typename VecOf<W>::type v) {
  float lanes[W];
  std::memcpy(lanes, &v, sizeof(lanes));
  for (int width = W / 2; width > 0; width /= 2) {
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  }
  return lanes[0];
}

// R weight rows (w, rows k apart) against G input rows (x, rows k apart): out[a * G + j] = the dot
// product of weight row a and input row j. Every product is summed in the same order whatever R
// and G are: W-lane partial sums over k in steps of W, the lanes' pairwise sum, then the tail of
// k in order. So a row of a many-row product equals the one-row product of that row bit for bit.
template <int W, int R, int G>
inline __attribute__((always_inline)) void Tile(const float* __restrict w,
                                                const float* __restrict x, int k,
                                                float* __restrict out) {
  using V = typename VecOf<W>::type;
  V acc[R][G];
#pragma GCC unroll 8
  for (int a = 0; a < R; ++a) {
#pragma GCC unroll 8
    for (int j = 0; j < G; ++j) acc[a][j] = V{};
  }
  int i = 0;
  for (; i + W <= k; i += W) {
    V wv[R];
#pragma GCC unroll 8
    for (int a = 0; a < R; ++a) wv[a] = Load<W>(w + static_cast<size_t>(a) * k + i);
#pragma GCC unroll 8
    for (int j = 0; j < G; ++j) {
      const V xv = Load<W>(x + static_cast<size_t>(j) * k + i);
#pragma GCC unroll 8
      for (int a = 0; a < R; ++a) acc[a][j] += wv[a] * xv;
    }
  }
  for (int a = 0; a < R; ++a) {
    for (int j = 0; j < G; ++j) {
      float sum = Sum<W>(acc[a][j]);
      for (int t = i; t < k; ++t) {
        sum += w[static_cast<size_t>(a) * k + t] * x[static_cast<size_t>(j) * k + t];
      }
      out[a * G + j] = sum;
    }
  }
}

// The G-row group of weight rows r..r+R-1 starting at input row j0.
template <int W, int R>
inline __attribute__((always_inline)) void Group(const float* w, const float* x, int k, int g,
                                                 float* sums) {
  switch (g) {
    case 1:
      Tile<W, R, 1>(w, x, k, sums);
      break;
    case 2:
      Tile<W, R, 2>(w, x, k, sums);
      break;
    case 3:
      Tile<W, R, 3>(w, x, k, sums);
      break;
    default:
      Tile<W, R, 4>(w, x, k, sums);
      break;
  }
}

constexpr int kGroupRows = 4;  // input rows per tile (G)

// y[j, r] = beta * y[j, r] + alpha * x[j] . w[r] for weight rows [r0, r1), every input row.
template <int W, int R>
inline __attribute__((always_inline)) void Rows(const RowsProduct& p, int r0, int r1) {
  float sums[R * kGroupRows];
  auto store = [&](int r, int rows, int j0, int g) {
    for (int a = 0; a < rows; ++a) {
      for (int j = 0; j < g; ++j) {
        float* out = p.y + static_cast<size_t>(j0 + j) * p.ldy + r + a;
        const float value = p.alpha * sums[a * g + j];
        // beta == 0 must not read y: it may hold garbage (0 * NaN is NaN).
        *out = p.beta == 0.0f ? value : p.beta * *out + value;
      }
    }
  };
  int r = r0;
  for (; r + R <= r1; r += R) {
    const float* w = p.w + static_cast<size_t>(r) * p.k;
    for (int j0 = 0; j0 < p.m; j0 += kGroupRows) {
      const int g = std::min(kGroupRows, p.m - j0);
      Group<W, R>(w, p.x + static_cast<size_t>(j0) * p.k, p.k, g, sums);
      store(r, R, j0, g);
    }
  }
  for (; r < r1; ++r) {  // the last rows of the range, one at a time
    const float* w = p.w + static_cast<size_t>(r) * p.k;
    for (int j0 = 0; j0 < p.m; j0 += kGroupRows) {
      const int g = std::min(kGroupRows, p.m - j0);
      Group<W, 1>(w, p.x + static_cast<size_t>(j0) * p.k, p.k, g, sums);
      store(r, 1, j0, g);
    }
  }
}

// Every weight row of [r0, r1) against every input row, R weight rows per tile; one input row (a
// decode step) streams the weights a row at a time: sharing a tile's weight loads pays only when
// several input rows use them (measured, n 4096 x k 768 on two Zen 4 cores: 42-56 GB/s a row
// at a time against 33 with 4-row tiles).
template <int W, int R>
inline __attribute__((always_inline)) void Product(const RowsProduct& p, int r0, int r1) {
  if (p.m == 1) {
    Rows<W, 1>(p, r0, r1);
  } else {
    Rows<W, R>(p, r0, r1);
  }
}

// One version per instruction set; a process uses one of them for every product, so decode and
// verify steps sum alike. Multiply-adds may fuse (FMA) inside them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TANDEM_ROWS_X86 1
__attribute__((target("avx512f"), optimize("fp-contract=fast"))) void RowsAvx512(
    const RowsProduct& p, int r0, int r1) {
  Product<16, 4>(p, r0, r1);
}
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) void RowsAvx2(
    const RowsProduct& p, int r0, int r1) {
  Product<8, 2>(p, r0, r1);
}
#endif
void RowsPortable(const RowsProduct& p, int r0, int r1) { Product<4, 2>(p, r0, r1); }

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

const char* RowsName() {
#ifdef TANDEM_ROWS_X86
  if (kRows == RowsAvx512) return "avx512";
  if (kRows == RowsAvx2) return "avx2";
#endif
  return "portable";
}

}  // namespace

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

}  // namespace tandem::kernels::cpu
