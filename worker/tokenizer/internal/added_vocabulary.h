// Added tokens (special and user-added) and their literal matching, ahead of the normaliser and
// pre-tokenizer. Semantics follow HF tokenizers: leftmost-longest, non-overlapping matches;
// single_word / lstrip / rstrip adjust or reject a match after it is found.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tokenizer_internal {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;  // only match when no word character touches either end
  bool lstrip = false;       // the match absorbs whitespace on its left
  bool rstrip = false;       // the match absorbs whitespace on its right
  bool normalized = false;   // matched on normalised text (else on the raw input)
};

// A piece of the input: either text for the next stage or one added token.
struct Segment {
  std::string_view text;
  int32_t token_id;  // -1 for plain text
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[i]` is the string matched for `tokens[i]` (its content, normalised when the
  // token is matched on normalised text).
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  // Splits `text` (valid UTF-8) into plain and added-token segments, appended to `out`. Empty
  // plain segments are dropped. When `parse_special` is false, matches of special tokens are
  // skipped (they stay plain text).
  void Split(std::string_view text, bool parse_special, std::vector<Segment>* out) const;

  bool empty() const { return tokens_.empty(); }

 private:
  // Index into tokens_ of the longest pattern starting at `pos`, or -1.
  int LongestAt(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;
  // Token indices by first byte of the pattern, longest pattern first.
  std::vector<int> by_first_byte_[256];
};

}  // namespace tandem::tokenizer_internal
