// RMSNorm, alone and fused with the residual add.
#pragma once

namespace tandem::kernels::cpu {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight   for r < rows;  x, y: [rows, dim]
// y may alias x.
void RmsNorm(const float* x, const float* weight, float* y, int rows, int dim, float eps);

// residual[r, :] += delta[r, :]; y[r, :] = RmsNorm(residual[r, :])   (residual updated in place)
void AddRmsNorm(float* residual, const float* delta, const float* weight, float* y, int rows,
                int dim, float eps);

}  // namespace tandem::kernels::cpu
