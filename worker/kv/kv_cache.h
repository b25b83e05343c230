// Paged KV cache: per-layer K and V pools of fixed-size blocks and one block table per sequence.
//
// A sequence holds `committed` tokens. A forward first Reserve()s room for its n new tokens; they
// are written to slots [committed, committed + n) ("tentative" slots). Commit(keep) then keeps
// the chosen new tokens, in order, compacting them to follow the committed ones, and drops the
// rest. Reserving again without a Commit drops the previous tentative tokens.
//
// Not thread-safe: owned by one worker actor.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "worker/kv/block_allocator.h"

namespace tandem {

using SeqId = int64_t;

struct KvCacheOptions {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;     // tokens per block
  int32_t num_blocks = 0;  // blocks per layer pool
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
  absl::Status Truncate(SeqId seq, int length);

  int CommittedLength(SeqId seq) const;
  int TentativeLength(SeqId seq) const;
  std::span<const int32_t> BlockTable(SeqId seq) const;

  // Pools of one layer: [num_blocks, block_size, num_kv_heads, head_dim].
  float* Keys(int layer) { return keys_[layer].data(); }
  float* Values(int layer) { return values_[layer].data(); }
  const float* Keys(int layer) const { return keys_[layer].data(); }
  const float* Values(int layer) const { return values_[layer].data(); }

  // Pointer to the K (or V) row of `slot` of `seq` in `layer`: [num_kv_heads, head_dim].
  float* KeyRow(SeqId seq, int layer, int slot);
  float* ValueRow(SeqId seq, int layer, int slot);

  int32_t num_blocks() const { return allocator_.num_blocks(); }
  int32_t free_blocks() const { return allocator_.num_free(); }
  double UsageRatio() const;
  // Tokens a new sequence could still hold.
  int64_t FreeTokenCapacity() const;
  size_t BytesPerToken() const;

 private:
  struct Sequence {
    int committed = 0;
    int tentative = 0;
    std::vector<int32_t> blocks;
  };
  size_t RowOffset(const Sequence& s, int slot) const;
  void ShrinkTo(Sequence& s, int tokens);

  KvCacheOptions options_;
  size_t row_floats_;  // num_kv_heads * head_dim
  BlockAllocator allocator_;
  std::vector<std::vector<float>> keys_;
  std::vector<std::vector<float>> values_;
  std::unordered_map<SeqId, Sequence> sequences_;
};

}  // namespace tandem
