// The BPE model of a byte-level tokenizer: turns one pre-token (raw bytes) into token ids by
// applying merges in rank order, exactly as HF tokenizers orders them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem::tokenizer_internal {

struct BpeMerge {
  int32_t rank;    // position in the merges list; lower merges first
  int32_t new_id;  // id of the concatenated token
};

struct BpeModelData {
  // Id of the one-character token standing for each byte; -1 when absent from the vocabulary.
  std::array<int32_t, 256> byte_ids;
  // Key: (left id << 32) | right id.
  absl::flat_hash_map<uint64_t, BpeMerge> merges;
  // Raw bytes -> id for every vocabulary entry whose spelling is byte-level; used when
  // `ignore_merges` lets a whole pre-token that is in the vocabulary skip merging.
  absl::flat_hash_map<std::string, int32_t> raw_vocab;
  bool ignore_merges = false;
  int32_t unk_id = -1;  // -1: bytes without a token are dropped, as HF tokenizers does
  bool fuse_unk = false;
};

inline uint64_t MergeKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Reusable buffers for Tokenize; one per thread (an Encode call owns one).
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the left symbol
    int32_t new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

class BpeModel {
 public:
  explicit BpeModel(BpeModelData data) : data_(std::move(data)) {}

  // Appends the ids for one pre-token given as raw bytes (one initial symbol per byte).
  void Tokenize(std::string_view piece, BpeScratch* scratch, std::vector<int32_t>* out) const;

 private:
  const BpeMerge* FindMerge(int32_t left, int32_t right) const {
    auto it = data_.merges.find(MergeKey(left, right));
    return it == data_.merges.end() ? nullptr : &it->second;
  }

  BpeModelData data_;
};

}  // namespace tandem::tokenizer_internal
