#pragma once

namespace tandem::kernels::cpu {

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i]   gate_up: [rows, 2 * inter],
// out: [rows, inter]  (gate and up projections fused into one matrix product)
void SiluMulFused(const float* gate_up, float* out, int rows, int inter);

}  // namespace tandem::kernels::cpu
