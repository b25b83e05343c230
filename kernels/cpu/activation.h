#pragma once

#include <vector>

namespace tandem::kernels::cpu {

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]   gate_up: [rows, 2 * inter],
// out: [rows, inter]  (gate and up projections fused into one matrix product). Vectorised per
// instruction set, picked once per process; every version gives the same bits.
void SiluMulFused(const float* gate_up, float* out, int rows, int inter);

// For tests: every version this CPU can run ("avx512", "avx2", "portable"), and the product
// through one of them by name (a name not listed runs the portable one).
std::vector<const char*> ActivationKernelVersions();
void SiluMulFusedWith(const char* version, const float* gate_up, float* out, int rows, int inter);

}  // namespace tandem::kernels::cpu
