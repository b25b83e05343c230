// The skinny path of kernels/cuda/gemm.cuh: y[m, n] = alpha * x[m, k] · w[n, k]^T + beta * y
// (+ bias) for kGemvMaxRows < m <= kSkinnyMaxRows, the shape of a short verify step or of a
// decode step over a few sequences. Such a product still reads the whole weight matrix once for
// little arithmetic, so it is bound by memory bandwidth like the one-row product; gemv.cuh's
// kernel converts and multiplies each x row per weight vector and turns arithmetic-bound from 3
// rows, and cuBLAS ran such shapes at about 0.85 of the one-row product's speed.
//
// This kernel streams the weights the way gemv.cuh does (16-byte loads, several in flight per
// lane, read once) and multiplies on the tensor cores (mma.sync m16n8k16, bf16 in, fp32
// accumulation, the 8 tokens as the mma's N): a warp owns 16 weight rows and one slice of k, and
// each lane loads 8 consecutive k values of two of those rows and of one x row per step of 32 k
// values. The mma fragments take those registers as they are: within each step the k values are
// visited in a permuted order, the same for w and x, so the product is unchanged. The k slices
// of a CTA's warps meet in shared memory, added in slice order.
//
// Every output is computed the same way whatever m is (the tokens are the mma's independent
// columns), so a row of an 8-row product equals the same row of a 3-row product bit for bit.
//
// Measured on an H200 (docs/PERF.md, GPU): a version with two tiles of 8 tokens (16 rows) ran
// the 16-token verify step of the Qwen3-8B shape in 6.75 ms against cuBLAS's 6.29 (the down
// projection 43 us against the one-row kernel's 26), so more than 8 rows go to cuBLAS.
// Internal to the library (included by gemm.cu, and by its test for kSkinnyMaxRows).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.cuh"

namespace tandem::kernels::cuda::internal {

inline constexpr int kSkinnyMaxRows = 8;

// Whether `params` (already checked, and not taken by the gemv path) take the skinny path:
// m in [1, kSkinnyMaxRows], k and both input row strides multiples of 8, x and w 16-byte
// aligned, a device of compute capability 8.0+ (mma.sync with bf16), and the path not switched
// off (TANDEM_CUDA_SKINNY=0, read once per process; for comparing against cuBLAS). Launched as
// a programmatic dependent like gemv.cuh's kernel.
bool SkinnyApplies(const GemmParams& params);

absl::Status InvokeSkinny(const GemmParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda::internal
