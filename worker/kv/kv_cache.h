// Paged KV cache: per-layer K and V pools of fixed-size blocks and one block table per sequence.
//
// A sequence holds `committed` tokens. A forward first Reserve()s room for its n new tokens; they
// are written to slots [committed, committed + n) ("tentative" slots). Commit(keep) then keeps
// the chosen new tokens, in order, compacting them to follow the committed ones, and drops the
// rest. Reserving again without a Commit drops the previous tentative tokens.
//
// The cache keeps the allocation metadata (block tables, committed and tentative lengths); the
// K/V rows live in a KvStorage. By default that is HostKvStorage (fp32 pools in host memory,
// what the CPU forward reads and writes); a model backend may supply its own storage (device
// pools with the same block indices) through KvCacheOptions::make_storage. Commit describes its
// row moves to the storage (KvStorage::Commit); a Truncate into a shared block copies that
// block (KvStorage::CopyBlock, below); Reserve and frees move no rows.
//
// Prefix caching (KvCacheOptions::prefix_cache): full blocks of committed tokens are indexed by
// a hash of their whole token prefix (PublishPrefix), and a new sequence takes the longest
// indexed run its tokens begin with by reference (AttachPrefix) instead of computing it. Blocks
// are reference counted; a block no sequence holds stays indexed, idle, until the pool needs
// it, and then the least recently released goes first. A shared block is never written: only
// full committed blocks are shared, writes go to slots past the committed ones, and a Truncate
// into a shared block first gives the sequence its own copy (KvStorage::CopyBlock).
//
// Not thread-safe: owned by one worker actor.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "common/huge_pages.h"
#include "worker/kv/block_allocator.h"

namespace tandem {

using SeqId = int64_t;

class KvStorage;
struct KvCacheOptions;

// Makes the storage of a new KvCache; null means HostKvStorage.
using KvStorageFactory = std::function<std::unique_ptr<KvStorage>(const KvCacheOptions&)>;

struct KvCacheOptions {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;     // tokens per block
  int32_t num_blocks = 0;  // blocks per layer pool
  KvStorageFactory make_storage;
  bool prefix_cache = false;  // AttachPrefix / PublishPrefix do something
};

// Counters of the prefix cache since the KvCache was made, and its blocks now.
struct PrefixCacheStats {
  int64_t lookups = 0;        // AttachPrefix calls
  int64_t lookup_tokens = 0;  // tokens those calls could have taken (whole blocks)
  int64_t hit_tokens = 0;     // tokens they took
  int64_t evictions = 0;      // idle indexed blocks handed out for other uses
  int32_t cached_blocks = 0;  // indexed blocks, held or idle
  int32_t idle_blocks = 0;    // indexed blocks no sequence holds
};

// Where a KvCache's K/V rows live: per layer, K and V pools of num_blocks * block_size rows of
// num_kv_heads * head_dim elements; row r of a sequence's slot s is
// blocks[s / block_size] * block_size + s % block_size.
class KvStorage {
 public:
  virtual ~KvStorage() = default;

  // One sequence's commit, called by KvCache::Commit after validating `keep` and only when some
  // row moves (keep[j] != j for some j): for j in increasing order, slot committed + keep[j]
  // moves to slot committed + j in every layer's K and V pool. `blocks` is the sequence's block
  // table before the commit frees any block. A storage may apply the moves later (batched) as
  // long as it does so before its rows are next read or written.
  virtual void Commit(SeqId seq, std::span<const int32_t> blocks, int committed,
                      std::span<const int32_t> keep) = 0;

  // Bytes of one K (or V) row element.
  virtual size_t ElementBytes() const = 0;

  // Copies every layer's K and V rows of block `from` to block `to` (a copy-on-write of a
  // shared block). Ordered with Commit's moves: a commit queued before applies first.
  virtual void CopyBlock(int32_t from, int32_t to) = 0;

  // Fills every row of every pool with pseudo-random values uniform on [-half_width,
  // half_width], a function of `seed` alone. For benchmarks that give sequences long contexts
  // without computing them (Reserve + Commit): attention must not be timed over zeros.
  // Unimplemented unless the storage overrides it.
  virtual absl::Status Randomize(uint64_t seed, float half_width);
};

// fp32 pools in host memory; commits move rows at once with memcpy.
class HostKvStorage final : public KvStorage {
 public:
  explicit HostKvStorage(const KvCacheOptions& options);

  void Commit(SeqId seq, std::span<const int32_t> blocks, int committed,
              std::span<const int32_t> keep) override;
  void CopyBlock(int32_t from, int32_t to) override;
  size_t ElementBytes() const override { return sizeof(float); }
  absl::Status Randomize(uint64_t seed, float half_width) override;

  float* Keys(int layer) { return keys_[layer].data(); }
  float* Values(int layer) { return values_[layer].data(); }

 private:
  int block_size_;
  size_t row_floats_;
  // Per layer, huge pages where the system grants them: attention reads a sequence's rows of
  // every layer each step.
  using Pool = std::vector<float, HugePageAllocator<float>>;
  std::vector<Pool> keys_;
  std::vector<Pool> values_;
};

class KvCache {
 public:
  explicit KvCache(const KvCacheOptions& options);

  const KvCacheOptions& options() const { return options_; }

  absl::Status AddSequence(SeqId seq);  // AlreadyExists if present
  void RemoveSequence(SeqId seq);       // frees its blocks; no-op if absent
  bool HasSequence(SeqId seq) const;

  // Makes room for `n` tentative tokens after the committed ones. Returns the first tentative
  // slot (== committed length), or nullopt when the pool has no room — then nothing changed.
  [[nodiscard]] std::optional<int> Reserve(SeqId seq, int n);

  // Keeps tentative tokens `keep` (strictly increasing indices in [0, n)) in that order; the
  // others are dropped and blocks past the new length are freed. InvalidArgument on bad indices.
  absl::Status Commit(SeqId seq, std::span<const int32_t> keep);

  // Drops committed tokens past `length` (rollback, preemption with partial recompute).
  // ResourceExhausted, changing nothing, when `length` ends inside a shared block and the pool
  // has no block for the sequence's own copy.
  absl::Status Truncate(SeqId seq, int length);

  // Prefix caching; both do nothing unless options().prefix_cache. `salt` stands for whatever
  // besides the tokens makes KV differ (blocks publish and match only under the same salt).
  //
  // A sequence with nothing in the cache yet takes the indexed blocks that hold the longest
  // prefix of `tokens` in whole blocks; they become its committed tokens. Returns how many.
  int AttachPrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t salt);
  // Indexes the sequence's full committed blocks not indexed yet; `tokens` are its tokens, at
  // least its committed ones. The caller publishes only KV that a causal forward of exactly
  // those tokens gives. A block whose prefix is indexed already stays the sequence's own.
  void PublishPrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t salt);
  PrefixCacheStats prefix_stats() const;

  int CommittedLength(SeqId seq) const;
  int TentativeLength(SeqId seq) const;
  std::span<const int32_t> BlockTable(SeqId seq) const;

  KvStorage& storage() { return *storage_; }
  const KvStorage& storage() const { return *storage_; }
  // The host pools, or null when the storage is another backend's.
  HostKvStorage* host_storage() { return host_; }
  const HostKvStorage* host_storage() const { return host_; }

  // Host pools of one layer: [num_blocks, block_size, num_kv_heads, head_dim]. Only for a cache
  // with HostKvStorage (host_storage() != null).
  float* Keys(int layer) { return host_->Keys(layer); }
  float* Values(int layer) { return host_->Values(layer); }
  const float* Keys(int layer) const { return host_->Keys(layer); }
  const float* Values(int layer) const { return host_->Values(layer); }

  // Pointer to the K (or V) row of `slot` of `seq` in `layer`: [num_kv_heads, head_dim]. Host
  // storage only.
  float* KeyRow(SeqId seq, int layer, int slot);
  float* ValueRow(SeqId seq, int layer, int slot);

  int32_t num_blocks() const { return allocator_.num_blocks(); }
  // Blocks a sequence can get: never allocated ones and idle indexed ones.
  int32_t free_blocks() const { return allocator_.num_free() + static_cast<int32_t>(idle_.size()); }
  double UsageRatio() const;
  // Tokens a new sequence could still hold.
  int64_t FreeTokenCapacity() const;
  size_t BytesPerToken() const;

 private:
  struct Sequence {
    int committed = 0;
    int tentative = 0;
    std::vector<int32_t> blocks;
    // Prefix hashes of the leading blocks published or attached (blocks.size() at most).
    std::vector<uint64_t> prefix_hashes;
  };
  // A block's prefix-cache state.
  struct BlockState {
    int32_t refs = 0;  // sequences holding it
    bool indexed = false;
    uint64_t hash = 0;                  // of the whole prefix up to and including this block
    std::vector<int32_t> tokens;        // this block's tokens, checked on a hash match
    std::list<int32_t>::iterator idle;  // position in idle_ when indexed and refs == 0
  };

  size_t RowOffset(const Sequence& s, int slot) const;
  void ShrinkTo(Sequence& s, int tokens);
  // A block for one sequence (refs 1): a never allocated one, else the longest idle indexed one
  // (evicted); nullopt when there is none.
  std::optional<int32_t> TakeBlock();
  // The holder of `block` lets it go: idle when indexed and nobody else holds it, else free.
  void DropBlock(int32_t block);
  void Unindex(int32_t block);

  KvCacheOptions options_;
  size_t row_floats_;  // num_kv_heads * head_dim
  BlockAllocator allocator_;
  std::unique_ptr<KvStorage> storage_;
  HostKvStorage* host_ = nullptr;  // storage_ when it is the host pools
  std::unordered_map<SeqId, Sequence> sequences_;
  std::vector<BlockState> block_state_;
  std::unordered_map<uint64_t, int32_t> index_;  // prefix hash -> block
  std::list<int32_t> idle_;                      // idle indexed blocks, least recent first
  PrefixCacheStats stats_;
};

}  // namespace tandem
