// Helpers shared by the kernels/cuda ops: block-wide reductions and host-side parameter checks.
// Internal to the library (included by .cu files only); every function here is header-inline so
// each op's translation unit gets its own copy without relocatable device code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace tandem::kernels::cuda::internal {

inline constexpr int kWarpSize = 32;
inline constexpr int kMaxWarps = 1024 / kWarpSize;

template <typename T>
__device__ __forceinline__ T WarpSum(T value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

__device__ __forceinline__ float WarpMax(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sum of `value` over the CTA, returned to every thread. blockDim.x must be a multiple of 32;
// `shared` holds kMaxWarps partials. Ends with a barrier, so `shared` may be reused at once.
template <typename T>
__device__ T BlockSum(T value, T* shared) {
  value = WarpSum(value);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += shared[w];
  __syncthreads();
  return total;
}

// Maximum of `value` over the CTA (fmaxf: a NaN loses to any number), returned to every thread.
__device__ inline float BlockMax(float value, float* shared) {
  value = WarpMax(value);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  float total = shared[0];
  for (int w = 1; w < warps; ++w) total = fmaxf(total, shared[w]);
  __syncthreads();
  return total;
}

// Exclusive prefix sum of `value` over the CTA in thread order; `*total` gets the CTA's sum.
// `shared` holds kMaxWarps partials. Ends with a barrier.
template <typename T>
__device__ T BlockExclusiveScan(T value, T* shared, T* total) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  T inclusive = value;
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const T other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarpSize - 1) shared[warp] = inclusive;
  __syncthreads();
  const int warps = blockDim.x / kWarpSize;
  T before = T(0);
  T sum = T(0);
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += shared[w];
    sum += shared[w];
  }
  __syncthreads();
  *total = sum;
  // The lane below's inclusive sum, not inclusive - value: exact for floating-point T too.
  const T lane_before = __shfl_up_sync(0xffffffffu, inclusive, 1);
  return before + (lane == 0 ? T(0) : lane_before);
}

// Programmatic dependent launch (sm_90+; no-ops below). A kernel launched with the programmatic
// stream-serialization attribute may start while the kernel before it still runs; it must call
// WaitForPrecedingKernel() before it reads anything that kernel wrote (the wait returns once the
// preceding kernel has finished and its writes are visible). A kernel that calls
// LetDependentsStart() lets such a successor be scheduled from then on, so that the successor's
// launch and its independent loads (weights) overlap this kernel's work.
__device__ __forceinline__ void WaitForPrecedingKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void LetDependentsStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether the side-by-side switch `name` (an environment variable) is on: unset, or anything but
// "0". Callers keep the answer in a function-local static, so it is read once per process.
inline bool SwitchOn(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Host-side helpers for Check().
inline bool Aligned(const void* pointer, size_t alignment) {
  return reinterpret_cast<uintptr_t>(pointer) % alignment == 0;
}

// True when [a, a + a_bytes) and [b, b + b_bytes) share at least one byte.
inline bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto begin_a = reinterpret_cast<uintptr_t>(a);
  const auto begin_b = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && begin_a < begin_b + b_bytes && begin_b < begin_a + a_bytes;
}

inline int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace tandem::kernels::cuda::internal
