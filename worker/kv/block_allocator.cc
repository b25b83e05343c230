#include "worker/kv/block_allocator.h"

#include <cstdio>
#include <cstdlib>

namespace tandem {

BlockAllocator::BlockAllocator(int32_t num_blocks)
    : num_blocks_(num_blocks), allocated_(num_blocks, false) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockAllocator::Allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t block = free_.back();
  free_.pop_back();
  allocated_[block] = true;
  return block;
}

void BlockAllocator::Free(int32_t block) {
  if (block < 0 || block >= num_blocks_ || !allocated_[block]) {
    // A double free means two sequences share a block: the cache is corrupt, stop here.
    std::fprintf(stderr, "BlockAllocator: invalid free of block %d\n", block);
    std::abort();
  }
  allocated_[block] = false;
  free_.push_back(block);
}

}  // namespace tandem
