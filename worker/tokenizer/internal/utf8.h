// UTF-8 scanning and the Unicode predicates the tokenizer needs (strict decoding, lossy repair,
// NFC, whitespace / word-character classes matching HF tokenizers').
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

enum class Utf8Status { kValid, kIncomplete, kInvalid };

struct Utf8Char {
  Utf8Status status;
  // kValid: bytes of the character. kInvalid: bytes of the maximal invalid subpart (>= 1), to be
  // replaced by one U+FFFD. kIncomplete: bytes left in the input, all a valid prefix of a char.
  size_t length;
  char32_t code_point;  // meaningful for kValid only
};

// Scans the character starting at `pos` (< text.size()). Strict: no overlongs, no surrogates,
// nothing above U+10FFFF.
Utf8Char ScanUtf8Char(std::string_view text, size_t pos);

// Offset of the first byte that starts an invalid or truncated sequence; text.size() if valid.
size_t FirstInvalidUtf8Offset(std::string_view text);

// Appends `code_point` encoded as UTF-8.
void AppendUtf8(char32_t code_point, std::string* out);

// True when NFC could change `text` (valid UTF-8). Everything below U+0300 is NFC-stable and
// cannot combine with a neighbour, so text made only of such characters is skipped cheaply.
bool MayNeedNfc(std::string_view text);

// NFC of valid UTF-8 `text`.
std::string Nfc(std::string_view text);

// Unicode White_Space property.
bool IsUnicodeWhitespace(char32_t code_point);

// Word character as Unicode regex engines define \w: letters, marks, decimal digits, letter
// numbers, connector punctuation and the joiners.
bool IsWordChar(char32_t code_point);

// Code point of the last character of valid UTF-8 `text` (non-empty).
char32_t LastCodePoint(std::string_view text);

}  // namespace tandem::tokenizer_internal
