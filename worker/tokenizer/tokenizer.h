// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (GPT-2 / Qwen2 / Llama-3
// style: optional NFC normaliser, regex Split pre-tokenizer, ByteLevel pre-tokenizer/decoder).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// Immutable once loaded: all const methods may be called concurrently from any thread.
// Encode applies no post-processor (no BOS/EOS is added), like `add_special_tokens=False`.
class Tokenizer {
 public:
  // Parses tokenizer.json text / reads it from `path`. Unsupported model or pre-tokenizer kinds
  // are InvalidArgument naming the field.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);

  virtual ~Tokenizer() = default;

  // Encodes UTF-8 text. Added/special tokens that appear literally are matched first (when
  // `parse_special` is true), the rest goes through normaliser, pre-tokenizer and BPE. Invalid
  // UTF-8 is InvalidArgument.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool parse_special = true) const = 0;

  // Concatenated bytes of the tokens (may end in an incomplete UTF-8 sequence). Special tokens
  // are skipped when `skip_special` is true. Out-of-range ids are InvalidArgument.
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                             bool skip_special = false) const = 0;

  virtual int32_t vocab_size() const = 0;  // including added tokens: one past the largest id
  virtual std::optional<int32_t> TokenId(std::string_view token) const = 0;
  virtual std::optional<std::string> TokenText(int32_t id) const = 0;  // vocabulary spelling
  virtual bool IsSpecial(int32_t id) const = 0;
};

// Turns a stream of token ids into text deltas that never split a UTF-8 character: bytes of an
// incomplete character are held back until the character completes; bytes that can never form
// a character become U+FFFD. Not thread-safe (one per stream).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = true);

  // Appends tokens; returns the newly completed text (possibly empty).
  absl::StatusOr<std::string> Push(std::span<const int32_t> ids);
  // Text still held back at the end of a stream (invalid bytes replaced by U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete trailing UTF-8 sequence
};

struct ChatTurn {
  std::string role;
  std::string content;
  std::string tool_calls;    // an assistant turn's calls: a JSON array in OpenAI's shape, or ""
  std::string tool_call_id;  // a tool turn's: the call it answers
};

// Each token id in [0, vocab_size)'s bytes, for structured output's grammar (GrammarCompiler):
// ids past the tokenizer's vocabulary (a padded head) and special tokens (their text is no part
// of a completion's text) have none.
std::vector<std::string> GrammarTokenBytes(const Tokenizer& tokenizer, int vocab_size);

// ChatML as used by the Qwen family:
// "<|im_start|>{role}\n{content}<|im_end|>\n" per turn, then "<|im_start|>assistant\n" when
// `add_generation_prompt`. A default system turn is not added.
std::string ApplyChatMl(std::span<const ChatTurn> turns, bool add_generation_prompt = true);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool IsValidUtf8(std::string_view text);

// `bytes` with each maximal invalid or truncated subsequence replaced by one U+FFFD (the
// replacement Python's errors="replace" and the HF tokenizers decoder's lossy conversion make).
std::string ToValidUtf8(std::string_view bytes);

}  // namespace tandem
