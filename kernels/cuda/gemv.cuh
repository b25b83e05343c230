// The small-m path of kernels/cuda/gemm.cuh: y[m, n] = alpha * x[m, k] · w[n, k]^T + beta * y
// (+ bias) for m <= kGemvMaxRows, the shape of a batch-1 decode step. Such a product reads the
// whole weight matrix once and does little arithmetic on it, so it is bound by memory bandwidth.
// One to eight warps own one output column (one weight row): each streams its slice of the row
// in 16-byte loads, four in flight per lane, and keeps the m accumulators in registers; x is
// read through the cache (every warp reads it). A product with few columns (n * warps per
// column under 16384) splits k over more warps per column, so that it has as many loads in
// flight as a wide one; the slices' sums meet in shared memory.
//
// Measured on an H200 (docs/PERF.md, GPU): at m = 1 the Qwen3-8B-shaped decode step ran 7%
// faster than with cuBLAS, and at m = 2 a little faster still; from m = 3 cuBLAS won (each x
// vector is converted and multiplied per weight vector, so the kernel turns arithmetic-bound),
// hence kGemvMaxRows = 2. Eight loads in flight per lane instead of four ran slower (the q
// projection 11.3 -> 14.6 us, the down projection 26.6 -> 36.8 us). Split-k made the decode
// step 1.02x as fast (the down projection 28.6 -> 27 us; the 4096- and 6144-row products kept
// their fixed 3-4 us of ramp and tail).
// Internal to the library (included by gemm.cu only).
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.cuh"

namespace tandem::kernels::cuda::internal {

inline constexpr int kGemvMaxRows = 2;

// Whether `params` (already checked) take the small-m path: m in [1, kGemvMaxRows], k and both
// input row strides multiples of 8 and x and w 16-byte aligned (16-byte loads), and the path
// not switched off (TANDEM_CUDA_GEMV=0, read once per process; for comparisons).
// On sm_90+ the kernel is a programmatic dependent launch (README.md): its first weight loads
// overlap the kernel before it (TANDEM_CUDA_PDL=0 switches that off).
bool GemvApplies(const GemmParams& params);

absl::Status InvokeGemv(const GemmParams& params, cudaStream_t stream);

// Whether the bandwidth-bound products (this kernel and gemm_skinny.cuh's) are launched as
// programmatic dependents (common.cuh): on devices of compute capability 9.0+, unless switched
// off with TANDEM_CUDA_PDL=0 (read once per process; for side-by-side timings).
bool ProgrammaticLaunch();

// The current device's compute capability major version (cached per device), 0 when it cannot
// be read.
int ComputeCapabilityMajor();

}  // namespace tandem::kernels::cuda::internal
