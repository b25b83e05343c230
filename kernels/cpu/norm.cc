#include "kernels/cpu/norm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec.h"

namespace tandem::kernels::cpu {

namespace {

template <int W>
struct DoublesOf {
  typedef double type __attribute__((vector_size(sizeof(double) * W)));
};

// The sum of squares in eight running sums (value i into sum i % 8), added pairwise at the end:
// eight independent chains of additions instead of one, each waiting on the last (a chain is
// latency-bound: with one, a 16-token step's norms took 1 ms on one thread). Each square of a
// float is exact in double, so fusing it with the addition leaves the sum as it is; the order is
// fixed, so a row sums alike in every call and every version. The eight sums are held as
// vectors of D doubles (8 / D of them), eight floats widened per step.
template <int D>
inline __attribute__((always_inline)) double SumOfSquares(const float* x, int dim) {
  using Doubles = typename DoublesOf<D>::type;
  constexpr int kParts = 8 / D;
  Doubles sums[kParts] = {};
  int i = 0;
  for (; i + 8 <= dim; i += 8) {
    for (int q = 0; q < kParts; ++q) {
      const Doubles v = __builtin_convertvector(vec::Load<D>(x + i + q * D), Doubles);
      sums[q] += v * v;
    }
  }
  double s[8];
  std::memcpy(s, sums, sizeof(s));
  for (; i < dim; ++i) s[i % 8] += static_cast<double>(x[i]) * x[i];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// y[0, dim) = weight * (x * inv), W values at a time (y may be x itself: each is read before
// its output is written).
template <int W>
inline __attribute__((always_inline)) void Scale(const float* x, const float* weight, float inv,
                                                 float* y, int dim) {
  int i = 0;
  for (; i + W <= dim; i += W) {
    vec::Store<W>(y + i, vec::Load<W>(weight + i) * (vec::Load<W>(x + i) * inv));
  }
  for (; i < dim; ++i) y[i] = weight[i] * (x[i] * inv);
}

template <int W, int D>
inline __attribute__((always_inline)) void NormRow(const float* x, const float* weight, float* y,
                                                   int dim, float eps) {
  const double sum_sq = SumOfSquares<D>(x, dim);
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
  Scale<W>(x, weight, inv, y, dim);
}

// RmsNorm over rows, after residual += delta when delta is not null.
template <int W, int D>
inline __attribute__((always_inline)) void Rows(float* residual, const float* delta, const float* x,
                                                const float* weight, float* y, int rows, int dim,
                                                float eps) {
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * dim;
    if (delta != nullptr) {
      float* res = residual + off;
      int i = 0;
      for (; i + W <= dim; i += W) {
        vec::Store<W>(res + i, vec::Load<W>(res + i) + vec::Load<W>(delta + off + i));
      }
      for (; i < dim; ++i) res[i] += delta[off + i];
      NormRow<W, D>(res, weight, y + off, dim, eps);
    } else {
      NormRow<W, D>(x + off, weight, y + off, dim, eps);
    }
  }
}

using RowsFn = void (*)(float*, const float*, const float*, const float*, float*, int, int, float);

// Compiled per instruction set without fused multiply-adds, like the other element-wise
// kernels (here fusing would not change the sums, see SumOfSquares).
#ifdef TANDEM_KERNELS_X86
__attribute__((target("avx512f"), optimize("fp-contract=off"))) void RowsAvx512(
    float* residual, const float* delta, const float* x, const float* weight, float* y, int rows,
    int dim, float eps) {
  Rows<16, 8>(residual, delta, x, weight, y, rows, dim, eps);
}
__attribute__((target("avx2"), optimize("fp-contract=off"))) void RowsAvx2(
    float* residual, const float* delta, const float* x, const float* weight, float* y, int rows,
    int dim, float eps) {
  Rows<8, 4>(residual, delta, x, weight, y, rows, dim, eps);
}
#endif
void RowsPortable(float* residual, const float* delta, const float* x, const float* weight,
                  float* y, int rows, int dim, float eps) {
  Rows<4, 2>(residual, delta, x, weight, y, rows, dim, eps);
}

const IsaVersions<RowsFn> kVersions = {
#ifdef TANDEM_KERNELS_X86
    .avx512 = RowsAvx512,
    .avx2 = RowsAvx2,
#endif
    .portable = RowsPortable};
const RowsFn kRows = kVersions.Best();

// Values from which the rows split over the threads. Past the arithmetic, a norm's cost is
// moving its rows between the cores' caches: the products before it wrote half of each row on
// each core, and the products after it read all of its output on both. Split, each core moves
// half; on one, that core moved everything while the other waited. (A 16-token step of the
// bench engine's model: 25 norms of 16 x 768.)
constexpr long kParallelValues = 4096;

// The rows split over the threads past a little work; each row is computed alone, so the split
// leaves the values as they are.
void Split(RowsFn fn, float* residual, const float* delta, const float* x, const float* weight,
           float* y, int rows, int dim, float eps) {
  const int threads = rows >= 2 && static_cast<long>(rows) * dim >= kParallelValues
                          ? std::min(rows, CpuThreads())
                          : 1;
  if (threads == 1) return fn(residual, delta, x, weight, y, rows, dim, eps);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const int r0 = rows * t / n, r1 = rows * (t + 1) / n;
    const size_t off = static_cast<size_t>(r0) * dim;
    fn(residual == nullptr ? nullptr : residual + off, delta == nullptr ? nullptr : delta + off,
       x == nullptr ? nullptr : x + off, weight, y + off, r1 - r0, dim, eps);
  }
}

}  // namespace

void RmsNorm(const float* x, const float* weight, float* y, int rows, int dim, float eps) {
  Split(kRows, nullptr, nullptr, x, weight, y, rows, dim, eps);
}

void AddRmsNorm(float* residual, const float* delta, const float* weight, float* y, int rows,
                int dim, float eps) {
  Split(kRows, residual, delta, nullptr, weight, y, rows, dim, eps);
}

std::vector<const char*> NormKernelVersions() { return kVersions.Names(); }

void RmsNormWith(const char* version, const float* x, const float* weight, float* y, int rows,
                 int dim, float eps) {
  Split(kVersions.Named(version), nullptr, nullptr, x, weight, y, rows, dim, eps);
}

void AddRmsNormWith(const char* version, float* residual, const float* delta, const float* weight,
                    float* y, int rows, int dim, float eps) {
  Split(kVersions.Named(version), residual, delta, nullptr, weight, y, rows, dim, eps);
}

}  // namespace tandem::kernels::cpu
