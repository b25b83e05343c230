#include "worker/tokenizer/internal/bpe_tokenizer.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/tokenizer/internal/byte_level.h"
#include "worker/tokenizer/internal/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// Ids index a dense table; a file whose ids are far sparser than its entry count is rejected
// rather than allowed to allocate without bound.
constexpr int64_t kMaxIdSlack = 1 << 16;

// HF tokenizers ignores the ids written in added_tokens when it loads a file: a token takes
// its model vocabulary id when its content is in the vocabulary, otherwise the next id from the
// vocabulary's entry count on, in file order; a repeated content keeps its first id. Files it
// wrote are consistent with this, but a hand-edited one may not be, and the model was
// trained with HF tokenizers' numbering.
absl::StatusOr<std::vector<AddedToken>> AssignAddedTokenIds(
    std::vector<AddedToken> added, const absl::flat_hash_map<std::string, int32_t>& vocab) {
  int64_t next_id = static_cast<int64_t>(vocab.size());
  absl::flat_hash_map<std::string, int32_t> ids_by_content;
  absl::flat_hash_map<int32_t, size_t> index_by_id;  // into `assigned`
  std::vector<AddedToken> assigned;
  for (AddedToken& token : added) {
    if (token.content.empty()) continue;
    const absl::string_view content = token.content;
    int32_t id;
    if (auto it = ids_by_content.find(content); it != ids_by_content.end()) {
      id = it->second;
    } else if (auto vocab_it = vocab.find(content); vocab_it != vocab.end()) {
      id = vocab_it->second;
    } else {
      if (next_id > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError("added_tokens: too many tokens for 32-bit ids");
      }
      id = static_cast<int32_t>(next_id++);
    }
    token.id = id;
    ids_by_content.insert_or_assign(token.content, id);
    // A later token with the same id replaces the earlier one.
    if (auto it = index_by_id.find(id); it != index_by_id.end()) {
      assigned[it->second] = std::move(token);
    } else {
      index_by_id.emplace(id, assigned.size());
      assigned.push_back(std::move(token));
    }
  }
  return assigned;
}

}  // namespace

// Everything one Encode call mutates; never shared between threads.
struct BpeTokenizer::EncodeState {
  explicit EncodeState(const PipelineOptions& pipeline) {
    for (const auto& regex : pipeline.splits) {
      split_matchers.push_back(std::make_unique<Regex::Matcher>(*regex));
    }
    if (pipeline.byte_level_regex) {
      byte_level_matcher = std::make_unique<Regex::Matcher>(*pipeline.byte_level_regex);
    }
  }

  BpeScratch bpe;
  std::vector<std::unique_ptr<Regex::Matcher>> split_matchers;
  std::unique_ptr<Regex::Matcher> byte_level_matcher;
  std::vector<Segment> normalized_segments;
  std::vector<std::string_view> pieces;
  std::vector<std::string_view> next_pieces;
  std::vector<std::string_view> byte_level_pieces;
  std::string prefixed;  // a piece with the ByteLevel prefix space prepended
  // Words repeat heavily within one text; their BPE result is kept for the rest of the call.
  // Value: [offset, offset + length) in cached_ids.
  absl::flat_hash_map<std::string, std::pair<uint32_t, uint32_t>> word_cache;
  std::vector<int32_t> cached_ids;
};

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::Create(PipelineOptions pipeline,
                                                                   BpeSpec spec,
                                                                   std::vector<AddedToken> added) {
  int64_t max_id = -1;
  for (const auto& [spelling, id] : spec.vocab) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab['", spelling, "']: id ", id, " is negative"));
    }
    max_id = std::max<int64_t>(max_id, id);
  }
  const auto entries = static_cast<int64_t>(spec.vocab.size());
  if (max_id >= 4 * entries + kMaxIdSlack) {
    return absl::InvalidArgumentError(absl::StrCat("model.vocab: largest id ", max_id,
                                                   " is far beyond the ", entries,
                                                   " entries; ids must be (nearly) dense"));
  }

  std::vector<TokenInfo> tokens(static_cast<size_t>(max_id + 1));
  absl::flat_hash_map<std::string, int32_t> vocab;
  vocab.reserve(spec.vocab.size());
  for (auto& [spelling, id] : spec.vocab) {
    TokenInfo& info = tokens[id];
    if (info.present) {
      return absl::InvalidArgumentError(absl::StrCat("model.vocab: id ", id, " is used by both '",
                                                     info.spelling, "' and '", spelling, "'"));
    }
    info.present = true;
    info.bytes = DecodeByteLevelToken(spelling);
    info.spelling = spelling;
    vocab.emplace(std::move(spelling), id);
  }

  TANDEM_ASSIGN_OR_RETURN(added, AssignAddedTokenIds(std::move(added), vocab));
  for (const AddedToken& token : added) max_id = std::max<int64_t>(max_id, token.id);
  tokens.resize(static_cast<size_t>(max_id + 1));

  BpeModelData data;
  for (int byte = 0; byte < 256; ++byte) {
    const std::string_view spelling = ByteToChar(static_cast<unsigned char>(byte));
    auto it = vocab.find(absl::string_view(spelling.data(), spelling.size()));
    data.byte_ids[byte] = it == vocab.end() ? -1 : it->second;
  }
  data.merges.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const std::string merged = left + right;
    int32_t ids[3];
    const std::string* parts[3] = {&left, &right, &merged};
    for (int k = 0; k < 3; ++k) {
      auto it = vocab.find(*parts[k]);
      if (it == vocab.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.merges[", rank, "]: '", *parts[k], "' is not in model.vocab"));
      }
      ids[k] = it->second;
    }
    // A repeated pair keeps its last rank, as a map built from the list would.
    data.merges.insert_or_assign(MergeKey(ids[0], ids[1]),
                                 BpeMerge{static_cast<int32_t>(rank), ids[2]});
  }
  data.ignore_merges = spec.ignore_merges;
  if (spec.ignore_merges) {
    for (const auto& [spelling, id] : vocab) {
      if (auto bytes = ByteLevelToBytes(spelling)) data.raw_vocab.emplace(*std::move(bytes), id);
    }
  }
  if (spec.unk_token) {
    auto it = vocab.find(*spec.unk_token);
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.unk_token: '", *spec.unk_token, "' is not in model.vocab"));
    }
    data.unk_id = it->second;
    data.fuse_unk = spec.fuse_unk;
  }

  const bool nfc = pipeline.nfc;
  std::unique_ptr<BpeTokenizer> tokenizer(
      new BpeTokenizer(std::move(pipeline), BpeModel(std::move(data))));
  tokenizer->ids_by_spelling_ = std::move(vocab);

  std::vector<AddedToken> raw_tokens, normalized_tokens;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (auto& token : added) {
    TokenInfo& info = tokens[token.id];
    // A token matched on normalised text is spelled, and decoded, in its normalised form (as
    // HF tokenizers does since 0.23).
    const std::string normalized_content =
        token.normalized && nfc ? Nfc(token.content) : token.content;
    // An added token shadows a model entry with the same id, as in HF tokenizers.
    info.present = true;
    info.special = token.special;
    info.spelling = normalized_content;
    info.bytes = DecodeByteLevelToken(normalized_content);
    tokenizer->ids_by_spelling_.insert_or_assign(normalized_content, token.id);
    tokenizer->ids_by_spelling_.insert_or_assign(token.content, token.id);
    if (token.normalized) {
      normalized_patterns.push_back(normalized_content);
      normalized_tokens.push_back(std::move(token));
    } else {
      raw_patterns.push_back(token.content);
      raw_tokens.push_back(std::move(token));
    }
  }
  tokenizer->raw_matcher_ = AddedTokenMatcher(std::move(raw_tokens), std::move(raw_patterns));
  tokenizer->normalized_matcher_ =
      AddedTokenMatcher(std::move(normalized_tokens), std::move(normalized_patterns));
  tokenizer->tokens_ = std::move(tokens);
  return tokenizer;
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text,
                                                          bool parse_special) const {
  const size_t bad = FirstInvalidUtf8Offset(text);
  if (bad != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Encode: text is not valid UTF-8 (first bad byte at offset ", bad, ")"));
  }
  EncodeState state(pipeline_);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<Segment> raw_segments;
  raw_matcher_.Split(text, parse_special, &raw_segments);
  for (const Segment& raw : raw_segments) {
    if (raw.token_id >= 0) {
      ids.push_back(raw.token_id);
      continue;
    }
    std::string normalized_storage;
    std::string_view normalized = raw.text;
    if (pipeline_.nfc && MayNeedNfc(normalized)) {
      normalized_storage = Nfc(normalized);
      normalized = normalized_storage;
    }
    state.normalized_segments.clear();
    normalized_matcher_.Split(normalized, parse_special, &state.normalized_segments);
    for (const Segment& segment : state.normalized_segments) {
      if (segment.token_id >= 0) {
        ids.push_back(segment.token_id);
      } else {
        TANDEM_RETURN_IF_ERROR(EncodePlain(segment.text, &state, &ids));
      }
    }
  }
  return ids;
}

absl::Status BpeTokenizer::EncodePlain(std::string_view text, EncodeState* state,
                                       std::vector<int32_t>* ids) const {
  auto& pieces = state->pieces;
  pieces.assign(1, text);
  for (auto& matcher : state->split_matchers) {
    state->next_pieces.clear();
    for (const std::string_view piece : pieces) {
      TANDEM_RETURN_IF_ERROR(matcher->SplitIsolated(piece, &state->next_pieces));
    }
    pieces.swap(state->next_pieces);
  }
  for (const std::string_view piece : pieces) {
    TANDEM_RETURN_IF_ERROR(EncodeByteLevel(piece, state, ids));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::EncodeByteLevel(std::string_view piece, EncodeState* state,
                                           std::vector<int32_t>* ids) const {
  // The prefix space goes on every piece that reaches ByteLevel, not only the first one.
  if (pipeline_.add_prefix_space && !piece.starts_with(' ')) {
    state->prefixed.assign(1, ' ');
    state->prefixed.append(piece);
    piece = state->prefixed;
  }
  if (state->byte_level_matcher == nullptr) {
    TokenizeWord(piece, state, ids);
    return absl::OkStatus();
  }
  state->byte_level_pieces.clear();
  TANDEM_RETURN_IF_ERROR(
      state->byte_level_matcher->SplitIsolated(piece, &state->byte_level_pieces));
  for (const std::string_view word : state->byte_level_pieces) {
    TokenizeWord(word, state, ids);
  }
  return absl::OkStatus();
}

void BpeTokenizer::TokenizeWord(std::string_view word, EncodeState* state,
                                std::vector<int32_t>* ids) const {
  // Single bytes need no merging; very long words rarely repeat. Both skip the cache, and the
  // cache stops growing once it is large enough to have paid off.
  constexpr size_t kMaxCachedWordBytes = 64;
  constexpr size_t kMaxCachedWords = 1 << 16;
  if (word.size() < 2 || word.size() > kMaxCachedWordBytes) {
    model_.Tokenize(word, &state->bpe, ids);
    return;
  }
  const absl::string_view key(word.data(), word.size());
  if (auto it = state->word_cache.find(key); it != state->word_cache.end()) {
    const auto [offset, length] = it->second;
    ids->insert(ids->end(), state->cached_ids.begin() + offset,
                state->cached_ids.begin() + offset + length);
    return;
  }
  const size_t before = ids->size();
  model_.Tokenize(word, &state->bpe, ids);
  if (state->word_cache.size() >= kMaxCachedWords) return;
  const auto offset = static_cast<uint32_t>(state->cached_ids.size());
  state->cached_ids.insert(state->cached_ids.end(), ids->begin() + before, ids->end());
  state->word_cache.emplace(key,
                            std::make_pair(offset, static_cast<uint32_t>(ids->size() - before)));
}

absl::StatusOr<std::string> BpeTokenizer::Decode(std::span<const int32_t> ids,
                                                 bool skip_special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !tokens_[id].present) {
      return absl::InvalidArgumentError(absl::StrCat("Decode: token id ", id, " at position ", i,
                                                     " is not in the vocabulary (size ",
                                                     vocab_size(), ")"));
    }
    const TokenInfo& info = tokens_[id];
    if (skip_special && info.special) continue;
    out.append(info.bytes);
  }
  return out;
}

std::optional<int32_t> BpeTokenizer::TokenId(std::string_view token) const {
  auto it = ids_by_spelling_.find(absl::string_view(token.data(), token.size()));
  if (it == ids_by_spelling_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> BpeTokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !tokens_[id].present) return std::nullopt;
  return tokens_[id].spelling;
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && tokens_[id].special;
}

}  // namespace tandem::tokenizer_internal
