#include "worker/kv/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {

namespace {

// SplitMix64's finaliser.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The hash of a prefix: its last block's tokens chained onto the hash of what precedes them
// (for the first block, the salt).
uint64_t ChainHash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

}  // namespace

HostKvStorage::HostKvStorage(const KvCacheOptions& options)
    : block_size_(options.block_size),
      row_floats_(static_cast<size_t>(options.num_kv_heads) * options.head_dim) {
  const size_t pool = static_cast<size_t>(options.num_blocks) * options.block_size * row_floats_;
  keys_.resize(options.num_layers);
  values_.resize(options.num_layers);
  for (int l = 0; l < options.num_layers; ++l) {
    keys_[l].assign(pool, 0.0f);
    values_[l].assign(pool, 0.0f);
  }
}

absl::Status KvStorage::Randomize(uint64_t /*seed*/, float /*half_width*/) {
  return absl::UnimplementedError("this KV storage cannot fill its pools with random values");
}

absl::Status HostKvStorage::Randomize(uint64_t seed, float half_width) {
  // SplitMix64's finaliser over (seed, pool, index): 24 random bits -> [-1, 1).
  auto unit = [](uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return 2.0f * static_cast<float>(x >> 40) * 0x1.0p-24f - 1.0f;
  };
  uint64_t pool = 0;
  for (std::vector<Pool>* pools : {&keys_, &values_}) {
    for (Pool& rows : *pools) {
      const uint64_t key = seed ^ (++pool << 48);
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = half_width * unit(key + i);
    }
  }
  return absl::OkStatus();
}

void HostKvStorage::Commit(SeqId /*seq*/, std::span<const int32_t> blocks, int committed,
                           std::span<const int32_t> keep) {
  auto offset = [&](int slot) {
    return (static_cast<size_t>(blocks[slot / block_size_]) * block_size_ + slot % block_size_) *
           row_floats_;
  };
  // keep[j] >= j, so moving slot committed+keep[j] to committed+j in increasing j never
  // overwrites a row still to be read.
  for (size_t j = 0; j < keep.size(); ++j) {
    if (keep[j] == static_cast<int32_t>(j)) continue;
    const size_t from = offset(committed + keep[j]);
    const size_t to = offset(committed + static_cast<int>(j));
    for (size_t l = 0; l < keys_.size(); ++l) {
      std::memcpy(keys_[l].data() + to, keys_[l].data() + from, row_floats_ * sizeof(float));
      std::memcpy(values_[l].data() + to, values_[l].data() + from, row_floats_ * sizeof(float));
    }
  }
}

void HostKvStorage::CopyBlock(int32_t from, int32_t to) {
  const size_t rows = static_cast<size_t>(block_size_) * row_floats_;
  for (size_t l = 0; l < keys_.size(); ++l) {
    std::memcpy(keys_[l].data() + to * rows, keys_[l].data() + from * rows, rows * sizeof(float));
    std::memcpy(values_[l].data() + to * rows, values_[l].data() + from * rows,
                rows * sizeof(float));
  }
}

KvCache::KvCache(const KvCacheOptions& options)
    : options_(options),
      row_floats_(static_cast<size_t>(options.num_kv_heads) * options.head_dim),
      allocator_(options.num_blocks),
      block_state_(options.num_blocks) {
  if (options.make_storage) {
    storage_ = options.make_storage(options);
  } else {
    auto host = std::make_unique<HostKvStorage>(options);
    host_ = host.get();
    storage_ = std::move(host);
  }
}

absl::Status KvCache::AddSequence(SeqId seq) {
  if (!sequences_.emplace(seq, Sequence{}).second) {
    return absl::AlreadyExistsError(absl::StrCat("KV cache already holds sequence ", seq));
  }
  return absl::OkStatus();
}

void KvCache::RemoveSequence(SeqId seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  // Last block first: a prefix's later blocks then go idle (and are evicted) before its earlier
  // ones, which more sequences share.
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) DropBlock(*b);
  sequences_.erase(it);
}

std::optional<int32_t> KvCache::TakeBlock() {
  std::optional<int32_t> block = allocator_.Allocate();
  if (!block && !idle_.empty()) {
    block = idle_.front();
    Unindex(*block);
    ++stats_.evictions;
  }
  if (block) block_state_[*block].refs = 1;
  return block;
}

void KvCache::DropBlock(int32_t block) {
  BlockState& b = block_state_[block];
  if (--b.refs > 0) return;
  if (b.indexed) {
    b.idle = idle_.insert(idle_.end(), block);
  } else {
    allocator_.Free(block);
  }
}

void KvCache::Unindex(int32_t block) {
  BlockState& b = block_state_[block];
  if (!b.indexed) return;
  if (b.refs == 0) idle_.erase(b.idle);
  index_.erase(b.hash);
  b.indexed = false;
  b.tokens.clear();
}

bool KvCache::HasSequence(SeqId seq) const { return sequences_.contains(seq); }

std::optional<int> KvCache::Reserve(SeqId seq, int n) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end() || n < 0) return std::nullopt;
  Sequence& s = it->second;
  const int needed_tokens = s.committed + n;
  const size_t needed_blocks = (needed_tokens + options_.block_size - 1) / options_.block_size;
  if (needed_blocks > s.blocks.size() &&
      needed_blocks - s.blocks.size() > static_cast<size_t>(free_blocks())) {
    return std::nullopt;
  }
  while (s.blocks.size() < needed_blocks) s.blocks.push_back(*TakeBlock());
  // Blocks beyond what n needs (left from a larger earlier reservation) go back to the pool.
  ShrinkTo(s, needed_tokens);
  s.tentative = n;
  return s.committed;
}

void KvCache::ShrinkTo(Sequence& s, int tokens) {
  const size_t keep_blocks = (tokens + options_.block_size - 1) / options_.block_size;
  while (s.blocks.size() > keep_blocks) {
    DropBlock(s.blocks.back());
    s.blocks.pop_back();
  }
  if (s.prefix_hashes.size() > keep_blocks) s.prefix_hashes.resize(keep_blocks);
}

size_t KvCache::RowOffset(const Sequence& s, int slot) const {
  const size_t row =
      static_cast<size_t>(s.blocks[slot / options_.block_size]) * options_.block_size +
      slot % options_.block_size;
  return row * row_floats_;
}

absl::Status KvCache::Commit(SeqId seq, std::span<const int32_t> keep) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache has no sequence ", seq));
  }
  Sequence& s = it->second;
  for (size_t j = 0; j < keep.size(); ++j) {
    if (keep[j] < 0 || keep[j] >= s.tentative || (j > 0 && keep[j] <= keep[j - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("commit indices must be strictly increasing in [0, ", s.tentative, "); got ",
                       keep[j], " at ", j));
    }
  }
  bool moves = false;
  for (size_t j = 0; j < keep.size() && !moves; ++j) moves = keep[j] != static_cast<int32_t>(j);
  if (moves) storage_->Commit(seq, s.blocks, s.committed, keep);
  s.committed += static_cast<int>(keep.size());
  s.tentative = 0;
  ShrinkTo(s, s.committed);
  return absl::OkStatus();
}

absl::Status KvCache::Truncate(SeqId seq, int length) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache has no sequence ", seq));
  }
  Sequence& s = it->second;
  if (length < 0 || length > s.committed) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot truncate sequence of ", s.committed, " tokens to ", length));
  }
  const int bs = options_.block_size;
  if (length % bs != 0) {
    // The block that will take the next writes: the sequence's own, unindexed, or a copy.
    const size_t last = length / bs;
    const int32_t block = s.blocks[last];
    if (block_state_[block].refs > 1) {
      std::optional<int32_t> copy = TakeBlock();
      if (!copy) {
        return absl::ResourceExhaustedError(
            absl::StrCat("no free KV block to copy the shared block that truncating sequence ", seq,
                         " to ", length, " tokens would write into"));
      }
      storage_->CopyBlock(block, *copy);
      DropBlock(block);
      s.blocks[last] = *copy;
    } else {
      Unindex(block);
    }
    if (s.prefix_hashes.size() > last) s.prefix_hashes.resize(last);
  }
  s.committed = length;
  s.tentative = 0;
  ShrinkTo(s, length);
  return absl::OkStatus();
}

int KvCache::AttachPrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t salt) {
  auto it = sequences_.find(seq);
  if (!options_.prefix_cache || it == sequences_.end() || !it->second.blocks.empty()) return 0;
  Sequence& s = it->second;
  const int bs = options_.block_size;
  const int whole = static_cast<int>(tokens.size()) / bs;
  ++stats_.lookups;
  stats_.lookup_tokens += static_cast<int64_t>(whole) * bs;
  uint64_t parent = salt;
  for (int b = 0; b < whole; ++b) {
    const std::span<const int32_t> block_tokens = tokens.subspan(static_cast<size_t>(b) * bs, bs);
    const uint64_t hash = ChainHash(parent, block_tokens);
    auto found = index_.find(hash);
    if (found == index_.end()) break;
    BlockState& state = block_state_[found->second];
    if (!std::equal(block_tokens.begin(), block_tokens.end(), state.tokens.begin(),
                    state.tokens.end())) {
      break;
    }
    if (state.refs++ == 0) idle_.erase(state.idle);
    s.blocks.push_back(found->second);
    s.prefix_hashes.push_back(hash);
    parent = hash;
  }
  s.committed = static_cast<int>(s.blocks.size()) * bs;
  stats_.hit_tokens += s.committed;
  return s.committed;
}

void KvCache::PublishPrefix(SeqId seq, std::span<const int32_t> tokens, uint64_t salt) {
  auto it = sequences_.find(seq);
  if (!options_.prefix_cache || it == sequences_.end()) return;
  Sequence& s = it->second;
  const int bs = options_.block_size;
  const size_t full =
      static_cast<size_t>(std::min(s.committed, static_cast<int>(tokens.size())) / bs);
  while (s.prefix_hashes.size() < full) {
    const size_t b = s.prefix_hashes.size();
    const std::span<const int32_t> block_tokens = tokens.subspan(b * bs, bs);
    const uint64_t parent = b == 0 ? salt : s.prefix_hashes.back();
    const uint64_t hash = ChainHash(parent, block_tokens);
    s.prefix_hashes.push_back(hash);
    if (index_.contains(hash)) continue;  // another sequence's copy is indexed
    BlockState& state = block_state_[s.blocks[b]];
    if (state.indexed) continue;
    state.indexed = true;
    state.hash = hash;
    state.tokens.assign(block_tokens.begin(), block_tokens.end());
    index_.emplace(hash, s.blocks[b]);
  }
}

PrefixCacheStats KvCache::prefix_stats() const {
  PrefixCacheStats stats = stats_;
  stats.cached_blocks = static_cast<int32_t>(index_.size());
  stats.idle_blocks = static_cast<int32_t>(idle_.size());
  return stats;
}

int KvCache::CommittedLength(SeqId seq) const {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? 0 : it->second.committed;
}

int KvCache::TentativeLength(SeqId seq) const {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? 0 : it->second.tentative;
}

std::span<const int32_t> KvCache::BlockTable(SeqId seq) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return {};
  return it->second.blocks;
}

float* KvCache::KeyRow(SeqId seq, int layer, int slot) {
  return host_->Keys(layer) + RowOffset(sequences_.at(seq), slot);
}

float* KvCache::ValueRow(SeqId seq, int layer, int slot) {
  return host_->Values(layer) + RowOffset(sequences_.at(seq), slot);
}

double KvCache::UsageRatio() const {
  if (allocator_.num_blocks() == 0) return 0.0;
  return 1.0 - static_cast<double>(free_blocks()) / allocator_.num_blocks();
}

int64_t KvCache::FreeTokenCapacity() const {
  return static_cast<int64_t>(free_blocks()) * options_.block_size;
}

size_t KvCache::BytesPerToken() const {
  return 2 * row_floats_ * storage_->ElementBytes() * options_.num_layers;
}

}  // namespace tandem
