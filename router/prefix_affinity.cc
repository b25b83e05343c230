#include "router/prefix_affinity.h"

#include <algorithm>

namespace tandem::router {

namespace {

// FNV-1a over the chunk, seeded with the previous key, then SplitMix64's finaliser.
uint64_t ChainHash(uint64_t parent, std::string_view chunk) {
  uint64_t h = 0xCBF29CE484222325ull ^ parent;
  for (unsigned char c : chunk) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  h += 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

}  // namespace

PrefixAffinity::PrefixAffinity(size_t max_keys) : max_keys_(std::max<size_t>(1, max_keys)) {}

std::vector<uint64_t> PrefixAffinity::Keys(std::string_view prompt) {
  const size_t chunks = std::min(prompt.size() / kChunkBytes, kMaxChunks);
  std::vector<uint64_t> keys;
  keys.reserve(chunks);
  uint64_t parent = 0;
  for (size_t i = 0; i < chunks; ++i) {
    parent = ChainHash(parent, prompt.substr(i * kChunkBytes, kChunkBytes));
    keys.push_back(parent);
  }
  return keys;
}

std::optional<size_t> PrefixAffinity::Find(std::span<const uint64_t> keys) {
  absl::MutexLock lock(&mu_);
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    auto it = index_.find(*key);
    if (it == index_.end()) continue;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  return std::nullopt;
}

void PrefixAffinity::Record(std::span<const uint64_t> keys, size_t verifier) {
  absl::MutexLock lock(&mu_);
  for (uint64_t key : keys) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      it->second->second = verifier;
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.emplace_front(key, verifier);
    index_.emplace(key, lru_.begin());
    if (lru_.size() > max_keys_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
}

size_t PrefixAffinity::size() const {
  absl::MutexLock lock(&mu_);
  return lru_.size();
}

}  // namespace tandem::router
