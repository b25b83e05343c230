#include "worker/tokenizer/internal/utf8.h"

#include <cstdlib>
#include <cstring>

#include "utf8proc.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {
namespace tokenizer_internal {

Utf8Char ScanUtf8Char(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data()) + pos;
  const size_t available = text.size() - pos;
  const uint8_t lead = p[0];
  if (lead < 0x80) return {Utf8Status::kValid, 1, lead};
  size_t trailing;
  char32_t code_point;
  // Allowed range of the second byte; it is what rules out overlongs, surrogates and > U+10FFFF.
  uint8_t low = 0x80;
  uint8_t high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    trailing = 1;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    trailing = 2;
    code_point = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    trailing = 3;
    code_point = lead & 0x07;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {Utf8Status::kInvalid, 1, 0};
  }
  for (size_t i = 1; i <= trailing; ++i) {
    if (i >= available) return {Utf8Status::kIncomplete, available, 0};
    const uint8_t byte = p[i];
    if (byte < low || byte > high) return {Utf8Status::kInvalid, i, 0};
    low = 0x80;
    high = 0xBF;
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  return {Utf8Status::kValid, trailing + 1, code_point};
}

size_t FirstInvalidUtf8Offset(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII runs dominate typical input: check 8 bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + pos, 8);
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    const Utf8Char c = ScanUtf8Char(text, pos);
    if (c.status != Utf8Status::kValid) return pos;
    pos += c.length;
  }
  return text.size();
}

void AppendUtf8(char32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool MayNeedNfc(std::string_view text) {
  // Lead bytes >= 0xCC start code points >= U+0300; continuation bytes are all < 0xC0.
  for (const char c : text) {
    if (static_cast<uint8_t>(c) >= 0xCC) return true;
  }
  return false;
}

namespace {

// Characters NFC leaves alone and that never combine with a preceding character: canonical
// combining class 0, no decomposition, never the second element of a composition. (They may
// still be the first element, so a region to normalise starts one character early.)
bool IsNfcInert(char32_t c) {
  // Everything below the first combining mark, and the CJK unified ideographs.
  return c < 0x300 || (c >= 0x4E00 && c <= 0x9FFF);
}

std::string NfcRegion(std::string_view text) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  // Only invalid UTF-8 or allocation failure make utf8proc fail; callers validate first, so
  // the input is returned unchanged rather than inventing an error path nobody can reach.
  if (length < 0) return std::string(text);
  std::string result(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  std::free(mapped);
  return result;
}

}  // namespace

std::string Nfc(std::string_view text) {
  // Only regions around non-inert characters go through utf8proc: each region runs from the
  // character before the first non-inert one to the next inert character that is not itself
  // followed by a non-inert one. Regions are independent, so the result equals NFC of the whole.
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;  // text[0, copied) is already in `out`
  size_t pos = 0;
  size_t previous_start = 0;  // start of the character before `pos`
  while (pos < text.size()) {
    Utf8Char c = ScanUtf8Char(text, pos);
    if (IsNfcInert(c.code_point)) {
      previous_start = pos;
      pos += c.length;
      continue;
    }
    const size_t region_start = pos > copied ? previous_start : pos;
    size_t end = pos;
    while (end < text.size()) {
      c = ScanUtf8Char(text, end);
      if (!IsNfcInert(c.code_point)) {
        end += c.length;
        continue;
      }
      // An inert character ends the region unless a non-inert one follows it.
      const size_t after = end + c.length;
      if (after < text.size() && !IsNfcInert(ScanUtf8Char(text, after).code_point)) {
        end = after;
        continue;
      }
      break;
    }
    out.append(text.substr(copied, region_start - copied));
    out.append(NfcRegion(text.substr(region_start, end - region_start)));
    copied = end;
    pos = end;
  }
  out.append(text.substr(copied));
  return out;
}

bool IsUnicodeWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

char32_t LastCodePoint(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return ScanUtf8Char(text, start).code_point;
}

}  // namespace tokenizer_internal

bool IsValidUtf8(std::string_view text) {
  return tokenizer_internal::FirstInvalidUtf8Offset(text) == text.size();
}

std::string ToValidUtf8(std::string_view bytes) {
  using tokenizer_internal::ScanUtf8Char;
  using tokenizer_internal::Utf8Status;
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const auto c = ScanUtf8Char(bytes, pos);
    if (c.status == Utf8Status::kValid) {
      out.append(bytes.substr(pos, c.length));
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for each maximal invalid subpart
    }
    pos += c.length;
  }
  return out;
}

}  // namespace tandem
