// Internal to kernels/cpu: one kernel's versions per instruction set (AVX-512, AVX2, portable),
// the one this CPU runs best picked once, and the others by name for tests. The element-wise
// kernels (activation.cc, attention.cc's softmax, norm.cc) use it; the products pick their own
// (their AVX2 version also needs FMA).
#pragma once

#include <string_view>
#include <vector>

namespace tandem::kernels::cpu {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// Where the AVX-512 and AVX2 versions are compiled (GCC's target attribute on x86-64).
#define TANDEM_KERNELS_X86 1
#endif

template <typename Fn>
struct IsaVersions {
  Fn avx512 = nullptr;  // null where not compiled
  Fn avx2 = nullptr;
  Fn portable = nullptr;

  // The widest version this CPU can run.
  Fn Best() const {
#ifdef TANDEM_KERNELS_X86
    __builtin_cpu_init();
    if (avx512 != nullptr && __builtin_cpu_supports("avx512f")) return avx512;
    if (avx2 != nullptr && __builtin_cpu_supports("avx2")) return avx2;
#endif
    return portable;
  }
  // Every version this CPU can run: "avx512", "avx2", "portable".
  std::vector<const char*> Names() const {
    std::vector<const char*> names;
#ifdef TANDEM_KERNELS_X86
    __builtin_cpu_init();
    if (avx512 != nullptr && __builtin_cpu_supports("avx512f")) names.push_back("avx512");
    if (avx2 != nullptr && __builtin_cpu_supports("avx2")) names.push_back("avx2");
#endif
    names.push_back("portable");
    return names;
  }
  // The version of that name (a name not compiled runs the portable one).
  Fn Named(std::string_view name) const {
    if (name == "avx512" && avx512 != nullptr) return avx512;
    if (name == "avx2" && avx2 != nullptr) return avx2;
    return portable;
  }
};

}  // namespace tandem::kernels::cpu
