// Products with few input rows, y[m, n] = alpha * x[m, k] · w[n, k]^T + beta * y, that read each
// weight row once for all m input rows: the weights stream from memory as for a matrix-vector
// product, the m dot products accumulate in registers (register tiles of weight rows x input
// rows), and the rows split across the OpenMP pool. A decode step (m = 1) and a k-token verify
// step (m = k) then read the weights once alike, instead of through a BLAS GEMM's packing.
//
// Batch invariant: each output is summed in one fixed order whatever m is, so row j of a
// many-row product equals the one-row product of input row j bit for bit (with attention's direct
// path for short extends, a short verify step's logits are the decode step's). The order depends
// on the instruction set the process picked once (AVX-512, AVX2 + FMA, or portable 4-lane
// vectors; RowsKernelName()).
#pragma once

namespace tandem::kernels::cpu {

// Input rows up to which Linear takes this path; more rows are a BLAS GEMM.
inline constexpr int kRowsMaxM = 16;

struct RowsProduct {
  const float* x = nullptr;  // [m, k]
  const float* w = nullptr;  // [n, k]
  float* y = nullptr;        // [m, ldy]; read only when beta != 0
  int m = 0, n = 0, k = 0;
  int ldy = 0;  // >= n
  float alpha = 1.0f;
  float beta = 0.0f;
};

void InvokeRows(const RowsProduct& product);

// "avx512", "avx2" or "portable": the version this process runs.
const char* RowsKernelName();

}  // namespace tandem::kernels::cpu
