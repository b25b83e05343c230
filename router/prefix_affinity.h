// Which verifier last served a prompt that begins like this one: the router's guess of where a
// request's prefix sits in a verifier's prefix cache (docs/ARCHITECTURE.md, prefix caching). The
// router sees text, not tokens, so a prompt is cut into chunks of kChunkBytes bytes; key i
// hashes chunks 0..i as a chain, the way the KV cache keys its blocks. A request is sent to the
// verifier recorded for its longest known key, while that verifier's load allows
// (VerifierPool::Acquire's `prefer`), and its keys are then recorded for the verifier it went
// to. Bounded: the least recently used keys go first.
//
// Thread-safety: every method may be called from any thread; one mutex guards the map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tandem::router {

class PrefixAffinity {
 public:
  // About two KV blocks of text; a prompt shorter than one chunk has no key.
  static constexpr size_t kChunkBytes = 128;
  // Keys per prompt at most: its first 8 KiB decide.
  static constexpr size_t kMaxChunks = 64;

  explicit PrefixAffinity(size_t max_keys = size_t{1} << 16);

  // The keys of the leading whole chunks of `prompt` (shortest prefix first). `prompt` is the
  // request's text as the verifier will read it in order (the service layer flattens chat
  // messages and token ids into it).
  static std::vector<uint64_t> Keys(std::string_view prompt);

  // The verifier recorded for the longest of `keys` (shortest first); nullopt when none is.
  std::optional<size_t> Find(std::span<const uint64_t> keys);
  // `verifier` now holds every prefix in `keys`.
  void Record(std::span<const uint64_t> keys, size_t verifier);

  size_t size() const;

 private:
  using Lru = std::list<std::pair<uint64_t, size_t>>;  // (key, verifier), most recent first

  const size_t max_keys_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
