// RMSNorm, alone and fused with the residual add.
#pragma once

#include <vector>

namespace tandem::kernels::cpu {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight   for r < rows;  x, y: [rows, dim]
// y may alias x.
void RmsNorm(const float* x, const float* weight, float* y, int rows, int dim, float eps);

// residual[r, :] += delta[r, :]; y[r, :] = RmsNorm(residual[r, :])   (residual updated in place)
void AddRmsNorm(float* residual, const float* delta, const float* weight, float* y, int rows,
                int dim, float eps);

// Both are vectorised per instruction set, picked once per process; every version gives the same
// bits. For tests: every version this CPU can run ("avx512", "avx2", "portable"), and a call
// through one of them by name (a name not listed runs the portable one).
std::vector<const char*> NormKernelVersions();
void RmsNormWith(const char* version, const float* x, const float* weight, float* y, int rows,
                 int dim, float eps);
void AddRmsNormWith(const char* version, float* residual, const float* delta, const float* weight,
                    float* y, int rows, int dim, float eps);

}  // namespace tandem::kernels::cpu
