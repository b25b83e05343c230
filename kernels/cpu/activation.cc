#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/gemm.h"

namespace tandem::kernels::cpu {

namespace {

// Outputs per piece of the split, and the outputs from which the split pays for the threads'
// wake-up: an exp per output costs about 10 ns, a fork and join a few microseconds.
constexpr int kPiece = 512;
constexpr long kParallelOutputs = 1024;

}  // namespace

void SiluMulFused(const float* gate_up, float* out, int rows, int inter) {
  if (rows <= 0 || inter <= 0) return;
  // Every output is computed on its own, so the split over threads leaves the values as they are.
  const int per_row = (inter + kPiece - 1) / kPiece;
  const long pieces = static_cast<long>(rows) * per_row;
  const bool parallel = static_cast<long>(rows) * inter >= kParallelOutputs;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (parallel)
  for (long piece = 0; piece < pieces; ++piece) {
    const int r = static_cast<int>(piece / per_row);
    const int i0 = static_cast<int>(piece % per_row) * kPiece, i1 = std::min(inter, i0 + kPiece);
    const float* g = gate_up + static_cast<size_t>(r) * 2 * inter;
    const float* u = g + inter;
    float* o = out + static_cast<size_t>(r) * inter;
    for (int i = i0; i < i1; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace tandem::kernels::cpu
