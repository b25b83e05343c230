#include "common/huge_pages.h"

#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tandem {

namespace {

size_t Rounded(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

}  // namespace

void* AllocateHugeBlock(size_t bytes) {
  if (bytes < kHugePageBytes) return ::operator new(bytes);
  void* p = std::aligned_alloc(kHugePageBytes, Rounded(bytes));
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where transparent huge pages are off, the block keeps small pages.
  madvise(p, Rounded(bytes), MADV_HUGEPAGE);
#endif
  return p;
}

void FreeHugeBlock(void* p, size_t bytes) {
  if (bytes < kHugePageBytes) {
    ::operator delete(p);
  } else {
    std::free(p);
  }
}

}  // namespace tandem
