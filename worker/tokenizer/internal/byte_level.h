// GPT-2's reversible byte <-> character mapping used by ByteLevel pre-tokenizers and decoders:
// every byte gets a printable character so that BPE vocabularies can be stored as text.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::tokenizer_internal {

// UTF-8 spelling of the character that stands for `byte`.
std::string_view ByteToChar(unsigned char byte);

// Raw bytes of a byte-level spelling, or nullopt when some character of `spelling` (valid
// UTF-8) is not one of the 256 byte characters.
std::optional<std::string> ByteLevelToBytes(std::string_view spelling);

// What the ByteLevel decoder yields for one token: its raw bytes when the whole spelling is
// byte-level, otherwise the spelling's own UTF-8 (added tokens such as "<|im_end|>" are both).
std::string DecodeByteLevelToken(std::string_view spelling);

}  // namespace tandem::tokenizer_internal
