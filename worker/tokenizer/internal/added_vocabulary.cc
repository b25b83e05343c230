#include "worker/tokenizer/internal/added_vocabulary.h"

#include <algorithm>

#include "worker/tokenizer/internal/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// Start of the whitespace run that ends `text`.
size_t TrailingWhitespaceStart(std::string_view text) {
  size_t start = text.size();
  while (start > 0) {
    size_t char_start = start - 1;
    while (char_start > 0 && (static_cast<uint8_t>(text[char_start]) & 0xC0) == 0x80) {
      --char_start;
    }
    if (!IsUnicodeWhitespace(ScanUtf8Char(text, char_start).code_point)) break;
    start = char_start;
  }
  return start;
}

// Length of the whitespace run that starts `text`.
size_t LeadingWhitespaceLength(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char c = ScanUtf8Char(text, pos);
    if (!IsUnicodeWhitespace(c.code_point)) break;
    pos += c.length;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), patterns_(std::move(patterns)) {
  for (size_t i = 0; i < patterns_.size(); ++i) {
    if (patterns_[i].empty()) continue;  // an empty pattern would match everywhere
    by_first_byte_[static_cast<uint8_t>(patterns_[i][0])].push_back(static_cast<int>(i));
  }
  for (auto& candidates : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [this](int a, int b) { return patterns_[a].size() > patterns_[b].size(); });
  }
}

int AddedTokenMatcher::LongestAt(std::string_view text, size_t pos) const {
  const std::string_view rest = text.substr(pos);
  for (const int index : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    if (rest.starts_with(patterns_[index])) return index;
  }
  return -1;
}

void AddedTokenMatcher::Split(std::string_view text, bool parse_special,
                              std::vector<Segment>* out) const {
  size_t segment_start = 0;  // end of the last emitted token (including stripped whitespace)
  size_t pos = 0;
  while (pos < text.size()) {
    const int index =
        by_first_byte_[static_cast<uint8_t>(text[pos])].empty() ? -1 : LongestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + patterns_[index].size();
    // A rejected match is consumed all the same: the search resumes after it, as a
    // non-overlapping match iterator would.
    pos = stop;
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      const bool word_before = start > 0 && IsWordChar(LastCodePoint(text.substr(0, start)));
      const bool word_after = stop < text.size() && IsWordChar(ScanUtf8Char(text, stop).code_point);
      if (word_before || word_after) continue;
    }
    // A match overlapping whitespace already absorbed by the previous token's rstrip cannot be
    // represented as a separate segment; HF tokenizers would duplicate text there.
    if (start < segment_start) continue;
    if (token.lstrip) {
      start = std::max(TrailingWhitespaceStart(text.substr(0, start)), segment_start);
    }
    if (token.rstrip) stop += LeadingWhitespaceLength(text.substr(stop));
    if (start > segment_start) {
      out->push_back({text.substr(segment_start, start - segment_start), -1});
    }
    out->push_back({text.substr(start, stop - start), token.id});
    segment_start = stop;
    pos = std::max(pos, stop);
  }
  if (segment_start < text.size()) out->push_back({text.substr(segment_start), -1});
}

}  // namespace tandem::tokenizer_internal
