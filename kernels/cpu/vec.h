// Internal to kernels/cpu: fixed-width float vectors for the products' kernels (rows_gemm.cc,
// packed_gemm.cc), inlined into functions compiled per instruction set.
#pragma once

#include <cstdint>
#include <cstring>

// These helpers take and return wide vectors; they are inlined into callers compiled for the
// matching instruction set, so no call ever crosses the ABI GCC warns about.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::kernels::cpu::vec {

// Vectors of W floats (GCC/Clang vector extensions: SSE/NEON registers for 4, AVX for 8,
// AVX-512 for 16 when the function is compiled for that target; 1 and 2 for the last steps of a
// lane sum).
template <int W>
struct VecOf {
  typedef float type __attribute__((vector_size(sizeof(float) * W)));
};

template <int W>
inline __attribute__((always_inline)) typename VecOf<W>::type Load(const float* p) {
  typename VecOf<W>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int W>
struct HalfOf {
  typedef uint16_t type __attribute__((vector_size(sizeof(uint16_t) * W)));
};
template <int W>
struct BitsOf {
  typedef uint32_t type __attribute__((vector_size(sizeof(uint32_t) * W)));
};

// W bf16 values widened to fp32 (each the upper half of its float's bits: exact).
template <int W>
inline __attribute__((always_inline)) typename VecOf<W>::type Load(const uint16_t* p) {
  typename HalfOf<W>::type half;
  std::memcpy(&half, p, sizeof(half));
  const typename BitsOf<W>::type bits = __builtin_convertvector(half, typename BitsOf<W>::type)
                                        << 16;
  typename VecOf<W>::type v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

}  // namespace tandem::kernels::cpu::vec
