#include "worker/decoding/ngram_pool.h"

#include <algorithm>

namespace tandem {

void NgramPool::Add(int32_t key, std::span<const int32_t> continuation) {
  if (capacity_ <= 0 || continuation.empty()) return;
  ++clock_;
  for (Entry& e : entries_) {
    if (e.key == key && std::ranges::equal(e.tokens, continuation)) {
      e.stamp = clock_;
      return;
    }
  }
  if (static_cast<int>(entries_.size()) < capacity_) {
    entries_.push_back({key, {continuation.begin(), continuation.end()}, clock_});
    return;
  }
  auto oldest = std::ranges::min_element(entries_, {}, &Entry::stamp);
  *oldest = {key, {continuation.begin(), continuation.end()}, clock_};
}

std::vector<std::vector<int32_t>> NgramPool::Lookup(int32_t key, int max) const {
  std::vector<const Entry*> hits;
  for (const Entry& e : entries_) {
    if (e.key == key) hits.push_back(&e);
  }
  std::ranges::sort(hits, [](const Entry* a, const Entry* b) { return a->stamp > b->stamp; });
  std::vector<std::vector<int32_t>> out;
  for (const Entry* e : hits) {
    if (static_cast<int>(out.size()) >= max) break;
    out.push_back(e->tokens);
  }
  return out;
}

}  // namespace tandem
