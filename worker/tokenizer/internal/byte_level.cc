#include "worker/tokenizer/internal/byte_level.h"

#include <cstdint>

#include "worker/tokenizer/internal/utf8.h"

namespace tandem::tokenizer_internal {
namespace {

// The mapped characters all lie below U+0144: 188 printable bytes map to themselves, the other
// 68 bytes to U+0100.. in increasing byte order.
constexpr char32_t kMaxByteChar = 0x144;

struct ByteLevelTable {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, kMaxByteChar> char_to_byte;  // -1: not a byte character
};

bool IsSelfMapped(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

const ByteLevelTable& Table() {
  static const ByteLevelTable* const table = [] {
    auto* t = new ByteLevelTable();
    t->char_to_byte.fill(-1);
    char32_t next_extra = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      const char32_t c = IsSelfMapped(byte) ? static_cast<char32_t>(byte) : next_extra++;
      AppendUtf8(c, &t->byte_to_char[byte]);
      t->char_to_byte[c] = static_cast<int16_t>(byte);
    }
    return t;
  }();
  return *table;
}

}  // namespace

std::string_view ByteToChar(unsigned char byte) { return Table().byte_to_char[byte]; }

std::optional<std::string> ByteLevelToBytes(std::string_view spelling) {
  const ByteLevelTable& table = Table();
  std::string bytes;
  bytes.reserve(spelling.size());
  size_t pos = 0;
  while (pos < spelling.size()) {
    const Utf8Char c = ScanUtf8Char(spelling, pos);
    if (c.status != Utf8Status::kValid || c.code_point >= kMaxByteChar ||
        table.char_to_byte[c.code_point] < 0) {
      return std::nullopt;
    }
    bytes.push_back(static_cast<char>(table.char_to_byte[c.code_point]));
    pos += c.length;
  }
  return bytes;
}

std::string DecodeByteLevelToken(std::string_view spelling) {
  std::optional<std::string> bytes = ByteLevelToBytes(spelling);
  return bytes ? *std::move(bytes) : std::string(spelling);
}

}  // namespace tandem::tokenizer_internal
