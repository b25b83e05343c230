#include "worker/kv/kv_cache.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {

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
  for (std::vector<std::vector<float>>* pools : {&keys_, &values_}) {
    for (std::vector<float>& rows : *pools) {
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

KvCache::KvCache(const KvCacheOptions& options)
    : options_(options),
      row_floats_(static_cast<size_t>(options.num_kv_heads) * options.head_dim),
      allocator_(options.num_blocks) {
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
  for (int32_t b : it->second.blocks) allocator_.Free(b);
  sequences_.erase(it);
}

bool KvCache::HasSequence(SeqId seq) const { return sequences_.contains(seq); }

std::optional<int> KvCache::Reserve(SeqId seq, int n) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end() || n < 0) return std::nullopt;
  Sequence& s = it->second;
  const int needed_tokens = s.committed + n;
  const size_t needed_blocks = (needed_tokens + options_.block_size - 1) / options_.block_size;
  if (needed_blocks > s.blocks.size() &&
      needed_blocks - s.blocks.size() > static_cast<size_t>(allocator_.num_free())) {
    return std::nullopt;
  }
  while (s.blocks.size() < needed_blocks) s.blocks.push_back(*allocator_.Allocate());
  // Blocks beyond what n needs (left from a larger earlier reservation) go back to the pool.
  ShrinkTo(s, needed_tokens);
  s.tentative = n;
  return s.committed;
}

void KvCache::ShrinkTo(Sequence& s, int tokens) {
  const size_t keep_blocks = (tokens + options_.block_size - 1) / options_.block_size;
  while (s.blocks.size() > keep_blocks) {
    allocator_.Free(s.blocks.back());
    s.blocks.pop_back();
  }
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
  s.committed = length;
  s.tentative = 0;
  ShrinkTo(s, length);
  return absl::OkStatus();
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
  return 1.0 - static_cast<double>(allocator_.num_free()) / allocator_.num_blocks();
}

int64_t KvCache::FreeTokenCapacity() const {
  return static_cast<int64_t>(allocator_.num_free()) * options_.block_size;
}

size_t KvCache::BytesPerToken() const {
  return 2 * row_floats_ * storage_->ElementBytes() * options_.num_layers;
}

}  // namespace tandem
