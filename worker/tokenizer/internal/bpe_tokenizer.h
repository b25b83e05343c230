// The concrete byte-level BPE tokenizer behind tandem::Tokenizer. Built from plain data by
// tokenizer_json.cc; immutable afterwards, so every const method is safe to call concurrently
// (per-call state lives on the caller's stack).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/tokenizer/internal/added_vocabulary.h"
#include "worker/tokenizer/internal/bpe_model.h"
#include "worker/tokenizer/internal/regex.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem::tokenizer_internal {

struct PipelineOptions {
  bool nfc = false;                            // normaliser: NFC (else none)
  std::vector<std::unique_ptr<Regex>> splits;  // Split pre-tokenizers, Isolated, in order
  bool add_prefix_space = false;               // ByteLevel.add_prefix_space
  std::unique_ptr<Regex> byte_level_regex;     // ByteLevel.use_regex; null when false
};

struct BpeSpec {
  std::vector<std::pair<std::string, int32_t>> vocab;       // spelling -> id
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  bool ignore_merges = false;
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Errors name the offending tokenizer.json field (model.merges[i], added_tokens[i], ...).
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> Create(PipelineOptions pipeline,
                                                              BpeSpec spec,
                                                              std::vector<AddedToken> added);

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool parse_special) const override;
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }
  std::optional<int32_t> TokenId(std::string_view token) const override;
  std::optional<std::string> TokenText(int32_t id) const override;
  bool IsSpecial(int32_t id) const override;

 private:
  struct TokenInfo {
    bool present = false;  // ids may have holes
    bool special = false;
    std::string spelling;  // vocabulary spelling (byte-level for model tokens)
    std::string bytes;     // what the ByteLevel decoder yields for it
  };
  struct EncodeState;

  BpeTokenizer(PipelineOptions pipeline, BpeModel model)
      : pipeline_(std::move(pipeline)), model_(std::move(model)) {}

  // Normalised text without added tokens -> pre-tokenizers -> BPE.
  absl::Status EncodePlain(std::string_view text, EncodeState* state,
                           std::vector<int32_t>* ids) const;
  absl::Status EncodeByteLevel(std::string_view piece, EncodeState* state,
                               std::vector<int32_t>* ids) const;
  // BPE of one pre-token, through the per-call word cache.
  void TokenizeWord(std::string_view word, EncodeState* state, std::vector<int32_t>* ids) const;

  PipelineOptions pipeline_;
  BpeModel model_;
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher_;  // added tokens with normalized=true
  std::vector<TokenInfo> tokens_;         // by id
  absl::flat_hash_map<std::string, int32_t> ids_by_spelling_;
};

}  // namespace tandem::tokenizer_internal
