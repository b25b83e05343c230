#include "kernels/cpu/activation.h"

#include <cmath>
#include <cstddef>

namespace tandem::kernels::cpu {

void SiluMulFused(const float* gate_up, float* out, int rows, int inter) {
  for (int r = 0; r < rows; ++r) {
    const float* g = gate_up + static_cast<size_t>(r) * 2 * inter;
    const float* u = g + inter;
    float* o = out + static_cast<size_t>(r) * inter;
    for (int i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace tandem::kernels::cpu
