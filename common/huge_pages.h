// An allocator for large, long-lived buffers that a step streams (the CPU's packed weights, the
// host KV pools): blocks of kHugePageBytes or more start on a huge-page boundary, are rounded up
// to whole huge pages, and are marked for transparent huge pages (Linux madvise) before anything
// touches them, so the kernel can back them with 2 MB pages where the system allows it
// (transparent_hugepage set to "madvise" or "always"). A decode step that streams 500 MB of
// weights then walks 250 page translations instead of 128,000. Elsewhere, and for smaller
// blocks, it allocates as std::allocator does.
#pragma once

#include <cstddef>

namespace tandem {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// `bytes` of storage (huge-page aligned and marked from kHugePageBytes on); throws
// std::bad_alloc when there is none. Free it with FreeHugeBlock and the same size.
void* AllocateHugeBlock(size_t bytes);
void FreeHugeBlock(void* p, size_t bytes);

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(AllocateHugeBlock(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeHugeBlock(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace tandem
