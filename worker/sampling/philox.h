// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel Random Numbers: As Easy
// as 1, 2, 3" (SC 2011). A pure function of (counter, key): any draw can be recomputed from its
// coordinates alone, which is what makes seeded sampling independent of batching and migration.
#pragma once

#include <array>
#include <cstdint>

namespace tandem {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

namespace philox_internal {

inline constexpr uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
// Weyl sequence increments for the key schedule (golden ratio and sqrt(3) - 1, in 32 bits).
inline constexpr uint32_t kWeyl0 = 0x9E3779B9u;
inline constexpr uint32_t kWeyl1 = 0xBB67AE85u;

constexpr PhiloxCounter Round(const PhiloxCounter& x, const PhiloxKey& key) {
  const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * x[0];
  const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * x[2];
  const auto hi0 = static_cast<uint32_t>(product0 >> 32);
  const auto lo0 = static_cast<uint32_t>(product0);
  const auto hi1 = static_cast<uint32_t>(product1 >> 32);
  const auto lo1 = static_cast<uint32_t>(product1);
  return {hi1 ^ x[1] ^ key[0], lo1, hi0 ^ x[3] ^ key[1], lo0};
}

}  // namespace philox_internal

// Ten rounds; the key is bumped by the Weyl increments between rounds (nine bumps in all).
constexpr PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  counter = philox_internal::Round(counter, key);
  for (int round = 1; round < 10; ++round) {
    key[0] += philox_internal::kWeyl0;
    key[1] += philox_internal::kWeyl1;
    counter = philox_internal::Round(counter, key);
  }
  return counter;
}

}  // namespace tandem
