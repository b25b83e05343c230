// The n-gram pool of rejection recycling (pcLLM §3.2): token runs seen after a token in earlier
// Jacobi iterations, offered again as whole candidate continuations when that token is the
// last accepted one.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

class NgramPool {
 public:
  // At most `capacity` entries (0 disables the pool: Add ignores, Lookup finds nothing).
  explicit NgramPool(int capacity) : capacity_(capacity) {}

  // Records that `continuation` (non-empty) followed `key`. An identical entry is refreshed
  // instead of duplicated; past capacity the least recently added or refreshed entry goes.
  void Add(int32_t key, std::span<const int32_t> continuation);

  // Up to `max` continuations recorded after `key`, most recently added first.
  std::vector<std::vector<int32_t>> Lookup(int32_t key, int max) const;

  int size() const { return static_cast<int>(entries_.size()); }
  int capacity() const { return capacity_; }
  void Clear() { entries_.clear(); }

 private:
  struct Entry {
    int32_t key = 0;
    std::vector<int32_t> tokens;
    uint64_t stamp = 0;  // larger = more recent
  };

  int capacity_;
  uint64_t clock_ = 0;
  // Unordered; pools are small (tens to a few thousand entries), so scans beat an index.
  std::vector<Entry> entries_;
};

}  // namespace tandem
