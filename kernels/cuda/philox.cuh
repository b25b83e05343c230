// Philox4x32-10 and the uniform draw of worker/sampling (UniformRandom), as host+device
// functions so the CUDA sampling ops draw exactly the numbers the CPU sampler draws for the same
// (seed, position, purpose, stream). The host side is tested against worker/sampling on any
// machine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::kernels::cuda {

// Values of worker/sampling RngPurpose (tested equal).
inline constexpr uint32_t kRngSample = 0;
inline constexpr uint32_t kRngAccept = 1;
inline constexpr uint32_t kRngResample = 2;

struct Philox4 {
  uint32_t v[4];
};

__host__ __device__ inline Philox4 Philox4x32_10(Philox4 counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter.v[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter.v[2];
    const Philox4 next = {{static_cast<uint32_t>(product1 >> 32) ^ counter.v[1] ^ key0,
                           static_cast<uint32_t>(product1),
                           static_cast<uint32_t>(product0 >> 32) ^ counter.v[3] ^ key1,
                           static_cast<uint32_t>(product0)}};
    counter = next;
  }
  return counter;
}

// Uniform in [0, 1) with 53 random bits: counter = (position, purpose, stream), key = seed.
__host__ __device__ inline double UniformRandom(uint64_t seed, uint64_t position, uint32_t purpose,
                                                uint32_t stream = 0) {
  const Philox4 counter = {
      {static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), purpose, stream}};
  const Philox4 bits =
      Philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t mantissa = ((static_cast<uint64_t>(bits.v[0]) << 32) | bits.v[1]) >> 11;
  return static_cast<double>(mantissa) * 0x1.0p-53;
}

}  // namespace tandem::kernels::cuda
