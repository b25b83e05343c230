// Fixed pool of KV blocks handed out by index. Not thread-safe: owned by the worker actor.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tandem {

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  // A free block, or nullopt when the pool is exhausted.
  std::optional<int32_t> Allocate();
  void Free(int32_t block);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

 private:
  int32_t num_blocks_;
  std::vector<int32_t> free_;    // LIFO: recently freed blocks are reused first (warm caches)
  std::vector<bool> allocated_;  // guards against double frees
};

}  // namespace tandem
