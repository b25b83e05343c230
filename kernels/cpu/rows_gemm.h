// Products with few input rows, y[m, n] = alpha * x[m, k] · w[n, k]^T + beta * y, that read each
// weight row once for all m input rows: the weights stream from memory as for a matrix-vector
// product, the m dot products accumulate in registers (register tiles of weight rows x input
// rows), and the rows split across the OpenMP pool. A decode step (m = 1) and a k-token verify
// step (m = k) then read the weights once alike, instead of through a BLAS GEMM's packing.
// Linear (gemm.h) runs every product through it, in slabs of up to kRowsMaxM input rows.
//
// Batch invariant: each output is summed in one fixed order whatever m is, so row j of a
// many-row product equals the one-row product of input row j bit for bit (with attention's direct
// path for short extends, a short verify step's logits are the decode step's). The order depends
// on the instruction set the process picked once (AVX-512, AVX2 + FMA, or portable 4-lane
// vectors; RowsKernelName()).
#pragma once

#include <cstddef>

namespace tandem::kernels::cpu {

// Input rows of one product (Linear splits more into slabs of this many). A tile's partial sums
// for every group of input rows wait on the stack: kRowsMaxM / 4 x 16 vectors.
inline constexpr int kRowsMaxM = 64;

struct RowsProduct {
  const float* x = nullptr;  // [m, k], rows ldx apart
  const float* w = nullptr;  // [n, k], rows ldw apart
  float* y = nullptr;        // [m, ldy]; read only when beta != 0
  int m = 0, n = 0, k = 0;
  int ldy = 0;  // >= n
  float alpha = 1.0f;
  float beta = 0.0f;
  int ldw = 0, ldx = 0;  // row strides (>= k); 0 = k
};

// The rows split across the ops' OpenMP pool (gemm.h) past a little work.
void InvokeRows(const RowsProduct& product);
// On the calling thread: for small products inside a caller's own parallel loop (attention's
// scores over a block of keys). The same sums as InvokeRows; on AVX-512 with beta 0 and k a
// multiple of 16, tiles of 16 weight rows per input row whose lane sums are taken together.
void InvokeRowsSerial(const RowsProduct& product);

// out[h, c] += sum over r of weights[h * ldwt + r] * v[r * ldv + c], for h < heads, c < d: the
// rows weighted per head and added up (attention's P V over a block of value rows). Each output
// sums its rows in order (multiply-adds fused where the version has FMA), so the result does not
// depend on how many heads share the call. out is [heads, d] contiguous; a row whose weights are
// all 0 is not read.
struct WeightedRows {
  const float* weights = nullptr;
  int ldwt = 0;
  const float* v = nullptr;
  size_t ldv = 0;
  int rows = 0, heads = 0, d = 0;
  float* out = nullptr;
};
void InvokeWeightedRowsSerial(const WeightedRows& product);

// "avx512", "avx2" or "portable": the version this process runs.
const char* RowsKernelName();

// The fp32 multiply-add peak of the CpuThreads() threads in that version's instruction set,
// FLOP/s, measured (independent register-resident chains, the best of three rounds of a few
// milliseconds): the compute floor benchmarks set products against.
double RowsPeakFlops();

}  // namespace tandem::kernels::cpu
