// bf16 <-> fp32 bit conversions, header-only so that the CPU kernels (bf16 weights) and the
// checkpoint reader share one rounding.
#pragma once

#include <bit>
#include <cstdint>

namespace tandem {

// bf16 is the upper half of an fp32's bits: widening is exact.
inline float BF16BitsToF32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Rounds to nearest, ties to even; overflow gives infinity, NaN stays NaN (quiet).
inline uint16_t F32ToBF16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace tandem
