#include "worker/tokenizer/tokenizer.h"

#include <algorithm>

#include "common/status_macros.h"
#include "worker/tokenizer/internal/utf8.h"

namespace tandem {

using tokenizer_internal::ScanUtf8Char;
using tokenizer_internal::Utf8Status;

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

absl::StatusOr<std::string> IncrementalDetokenizer::Push(std::span<const int32_t> ids) {
  TANDEM_ASSIGN_OR_RETURN(const std::string bytes, tokenizer_.Decode(ids, skip_special_));
  pending_.append(bytes);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const auto c = ScanUtf8Char(pending_, pos);
    // A truncated character at the end may still complete with the next token.
    if (c.status == Utf8Status::kIncomplete) break;
    if (c.status == Utf8Status::kValid) {
      out.append(pending_, pos, c.length);
    } else {
      out.append("\xEF\xBF\xBD");  // bytes no continuation can repair
    }
    pos += c.length;
  }
  pending_.erase(0, pos);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = ToValidUtf8(pending_);
  pending_.clear();
  return out;
}

std::vector<std::string> GrammarTokenBytes(const Tokenizer& tokenizer, int vocab_size) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max(0, vocab_size)));
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    absl::StatusOr<std::string> decoded = tokenizer.Decode({&id, 1});
    if (decoded.ok()) bytes[static_cast<size_t>(id)] = *std::move(decoded);
  }
  return bytes;
}

std::string ApplyChatMl(std::span<const ChatTurn> turns, bool add_generation_prompt) {
  std::string out;
  for (const ChatTurn& turn : turns) {
    out.append("<|im_start|>").append(turn.role).append("\n");
    out.append(turn.content).append("<|im_end|>\n");
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

}  // namespace tandem
