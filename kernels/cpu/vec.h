// Internal to kernels/cpu: fixed-width float vectors for the kernels (rows_gemm.cc,
// packed_gemm.cc, attention.cc, activation.cc), inlined into functions compiled per instruction
// set.
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

template <int W>
struct IntOf {
  typedef int32_t type __attribute__((vector_size(sizeof(int32_t) * W)));
};

template <int W>
inline __attribute__((always_inline)) void Store(float* p, typename VecOf<W>::type v) {
  std::memcpy(p, &v, sizeof(v));
}

template <int W>
inline __attribute__((always_inline)) typename VecOf<W>::type Splat(float x) {
  typename VecOf<W>::type v;
  for (int i = 0; i < W; ++i) v[i] = x;
  return v;
}

// e^x for x <= 0, -inf included, W lanes at a time; within a few ulp of std::exp. Each lane
// takes the same operations in the same order whatever W, so every width gives the same bits
// where the caller is compiled without contraction (fp-contract=off: no multiply-add fused).
// x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two so n ln2 is exact), e^r by its Taylor
// series to r^7 (truncation < 1e-8 relative), 2^n built in the exponent field. Below -87 the
// result would leave the normal range: it is flushed to 0. NaN stays NaN.
template <int W>
inline __attribute__((always_inline)) typename VecOf<W>::type ExpNonPositive(
    typename VecOf<W>::type x) {
  using Vec = typename VecOf<W>::type;
  using Int = typename IntOf<W>::type;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // few significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Vec floor = Splat<W>(-87.0f);
  const Vec clamped = x < floor ? floor : x;
  const Vec n = (clamped * kLog2e + kRound) - kRound;
  const Vec r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  Vec e = Splat<W>(1.0f / 5040.0f);
  e = e * r + 1.0f / 720.0f;
  e = e * r + 1.0f / 120.0f;
  e = e * r + 1.0f / 24.0f;
  e = e * r + 1.0f / 6.0f;
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  const Int bits = (__builtin_convertvector(n, Int) + 127) << 23;
  Vec two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return x < floor ? Splat<W>(0.0f) : e * two_n;
}

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
