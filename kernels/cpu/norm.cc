#include "kernels/cpu/norm.h"

#include <cmath>

namespace tandem::kernels::cpu {

namespace {

void NormRow(const float* x, const float* weight, float* y, int dim, float eps) {
  double sum_sq = 0.0;
  for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
  for (int i = 0; i < dim; ++i) y[i] = weight[i] * (x[i] * inv);
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
    for (int i = 0; i < dim; ++i) res[i] += delta[off + i];
    NormRow(res, weight, y + off, dim, eps);
  }
}

}  // namespace tandem::kernels::cpu
