#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/vec.h"

namespace tandem::kernels::cpu {

namespace {

using vec::VecOf;

// Outputs per piece of the split, and the outputs from which the split pays for the threads'
// wake-up: an output costs about a nanosecond on one thread, a fork and join a few microseconds.
constexpr int kPiece = 512;
constexpr long kParallelOutputs = 4096;

// silu(g) * u, W lanes at a time. silu(g) = g / (1 + e^-g) = g e^g / (1 + e^g): with
// t = e^-|g| <= 1 both forms take an exponent that cannot overflow.
template <int W>
inline __attribute__((always_inline)) typename VecOf<W>::type SiluMul(typename VecOf<W>::type g,
                                                                      typename VecOf<W>::type u) {
  using Vec = typename VecOf<W>::type;
  const Vec zero = vec::Splat<W>(0.0f);
  const Vec t = vec::ExpNonPositive<W>(g < zero ? g : -g);
  const Vec top = g < zero ? g * t : g;
  return top / (vec::Splat<W>(1.0f) + t) * u;
}

// o[0, n) = silu(g[0, n)) * u[0, n); the tail through a zero-padded vector.
template <int W>
inline __attribute__((always_inline)) void SiluMulSpan(const float* g, const float* u, float* o,
                                                       int n) {
  using Vec = typename VecOf<W>::type;
  int i = 0;
  for (; i + W <= n; i += W)
    vec::Store<W>(o + i, SiluMul<W>(vec::Load<W>(g + i), vec::Load<W>(u + i)));
  if (i < n) {
    float gt[W] = {}, ut[W] = {};
    std::memcpy(gt, g + i, sizeof(float) * (n - i));
    std::memcpy(ut, u + i, sizeof(float) * (n - i));
    const Vec out = SiluMul<W>(vec::Load<W>(gt), vec::Load<W>(ut));
    std::memcpy(o + i, &out, sizeof(float) * (n - i));
  }
}

using SpanFn = void (*)(const float*, const float*, float*, int);

// The versions fuse no multiply-add (AVX-512 has them, and GCC fuses by default in C++), so they
// all give the same bits.
#ifdef TANDEM_KERNELS_X86
__attribute__((target("avx512f"), optimize("fp-contract=off"))) void SpanAvx512(const float* g,
                                                                                const float* u,
                                                                                float* o, int n) {
  SiluMulSpan<16>(g, u, o, n);
}
__attribute__((target("avx2"), optimize("fp-contract=off"))) void SpanAvx2(const float* g,
                                                                           const float* u, float* o,
                                                                           int n) {
  SiluMulSpan<8>(g, u, o, n);
}
#endif
void SpanPortable(const float* g, const float* u, float* o, int n) { SiluMulSpan<4>(g, u, o, n); }

const IsaVersions<SpanFn> kSpans = {
#ifdef TANDEM_KERNELS_X86
    .avx512 = SpanAvx512,
    .avx2 = SpanAvx2,
#endif
    .portable = SpanPortable};
const SpanFn kSpan = kSpans.Best();

void Run(SpanFn span, const float* gate_up, float* out, int rows, int inter) {
  if (rows <= 0 || inter <= 0) return;
  // Every output is computed on its own, so the split over threads leaves the values as they are.
  const int per_row = (inter + kPiece - 1) / kPiece;
  const long pieces = static_cast<long>(rows) * per_row;
  const bool parallel = static_cast<long>(rows) * inter >= kParallelOutputs;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (parallel)
  for (long piece = 0; piece < pieces; ++piece) {
    const int r = static_cast<int>(piece / per_row);
    const int i0 = static_cast<int>(piece % per_row) * kPiece, i1 = std::min(inter, i0 + kPiece);
    const float* g = gate_up + static_cast<size_t>(r) * 2 * inter;
    span(g + i0, g + inter + i0, out + static_cast<size_t>(r) * inter + i0, i1 - i0);
  }
}

}  // namespace

void SiluMulFused(const float* gate_up, float* out, int rows, int inter) {
  Run(kSpan, gate_up, out, rows, inter);
}

std::vector<const char*> ActivationKernelVersions() { return kSpans.Names(); }

void SiluMulFusedWith(const char* version, const float* gate_up, float* out, int rows, int inter) {
  Run(kSpans.Named(version), gate_up, out, rows, inter);
}

}  // namespace tandem::kernels::cpu
