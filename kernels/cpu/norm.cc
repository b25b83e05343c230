#include "kernels/cpu/norm.h"

#include <cmath>
#include <cstring>

namespace tandem::kernels::cpu {

namespace {

using Quad = float __attribute__((vector_size(16)));  // four floats: every target's register

// The sum of squares in eight running sums (value i into sum i % 8), added pairwise at the end:
// eight independent chains of additions instead of one, each waiting on the last (a chain is
// latency-bound: with one, a 16-token step's norms took 1 ms on one thread). Each square of a
// float is exact in double; the order is fixed, so a row sums alike in every call.
double SumOfSquares(const float* x, int dim) {
  using Pair = double __attribute__((vector_size(16)));  // two sums in one register
  Pair s01 = {}, s23 = {}, s45 = {}, s67 = {};
  auto squares = [x](int i) {
    const Pair v = {static_cast<double>(x[i]), static_cast<double>(x[i + 1])};
    return v * v;
  };
  int i = 0;
  for (; i + 8 <= dim; i += 8) {
    s01 += squares(i);
    s23 += squares(i + 2);
    s45 += squares(i + 4);
    s67 += squares(i + 6);
  }
  double sums[8] = {s01[0], s01[1], s23[0], s23[1], s45[0], s45[1], s67[0], s67[1]};
  for (; i < dim; ++i) sums[i % 8] += static_cast<double>(x[i]) * x[i];
  return ((sums[0] + sums[4]) + (sums[2] + sums[6])) + ((sums[1] + sums[5]) + (sums[3] + sums[7]));
}

void NormRow(const float* x, const float* weight, float* y, int dim, float eps) {
  const double sum_sq = SumOfSquares(x, dim);
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
  // Four values at a time (y may be x itself: each is read before its output is written).
  int i = 0;
  for (; i + 4 <= dim; i += 4) {
    Quad v, w;
    std::memcpy(&v, x + i, sizeof(v));
    std::memcpy(&w, weight + i, sizeof(w));
    const Quad out = w * (v * inv);
    std::memcpy(y + i, &out, sizeof(out));
  }
  for (; i < dim; ++i) y[i] = weight[i] * (x[i] * inv);
}

}  // namespace

void RmsNorm(const float* x, const float* weight, float* y, int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * dim;
    NormRow(x + off, weight, y + off, dim, eps);
  }
}

void AddRmsNorm(float* residual, const float* delta, const float* weight, float* y, int rows,
                int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const size_t off = static_cast<size_t>(r) * dim;
    float* res = residual + off;
    int i = 0;
    for (; i + 4 <= dim; i += 4) {  // four at a time, as NormRow's scaling
      Quad a, b;
      std::memcpy(&a, res + i, sizeof(a));
      std::memcpy(&b, delta + off + i, sizeof(b));
      a += b;
      std::memcpy(res + i, &a, sizeof(a));
    }
    for (; i < dim; ++i) res[i] += delta[off + i];
    NormRow(res, weight, y + off, dim, eps);
  }
}

}  // namespace tandem::kernels::cpu
