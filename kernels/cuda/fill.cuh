// Fills a bf16 buffer with pseudo-random values uniform on [-half_width, half_width]:
//   data[i] = bf16(half_width * (2 * u(i) - 1)),  u(i) = FillUniformUnit(seed, i)
// where FillUniformUnit takes 24 bits of Philox4x32-10 at counter (i / 4, ...) (philox.cuh), so
// the host computes exactly what the device writes. For benchmarks that give a model long
// contexts without computing them (KvStorage::Randomize): a step must not be timed over zeros.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/philox.cuh"

namespace tandem::kernels::cuda {

inline constexpr uint32_t kRngFill = 0x46494C4Cu;  // "FILL": the counter's purpose word

// Uniform in [0, 1) with 24 random bits: element i takes word i % 4 of the Philox block
// (i / 4, kRngFill); key = seed.
__host__ __device__ inline float FillUniformUnit(uint64_t seed, uint64_t i) {
  const uint64_t block = i / 4;
  const Philox4 counter = {
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), kRngFill, 0}};
  const Philox4 bits =
      Philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(bits.v[i % 4] >> 8) * 0x1.0p-24f;
}

struct FillUniformParams {
  __nv_bfloat16* data = nullptr;  // [count]
  size_t count = 0;               // 0 is a valid no-op
  uint64_t seed = 0;
  float half_width = 0.0f;    // finite, >= 0
  void* workspace = nullptr;  // unused (WorkspaceBytes is 0)
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

size_t WorkspaceBytes(const FillUniformParams& params);

absl::Status Invoke(const FillUniformParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
