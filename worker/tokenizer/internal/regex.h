// PCRE2 pattern for the Split / ByteLevel pre-tokenizers: compiled once in UTF + UCP mode (so
// \p{L}, \s and friends are Unicode-aware), JIT-compiled when the platform supports it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer_internal {

class Regex {
 public:
  // `literal`: the pattern is a plain string (the tokenizer.json `String` split pattern).
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Per-thread match state; one per Encode call. Keeps no pointer to the subject.
  class Matcher {
   public:
    explicit Matcher(const Regex& regex);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;

    // Appends to `pieces` the matches in valid UTF-8 `text` and the gaps between them, in order,
    // dropping empty ones (HF tokenizers' Isolated split behaviour). An empty match right
    // after the previous match is skipped by one character, as Oniguruma iteration does.
    absl::Status SplitIsolated(std::string_view text, std::vector<std::string_view>* pieces);

   private:
    const Regex& regex_;
    void* match_data_;  // pcre2_match_data_8*
  };

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*; immutable after Compile, shared by all threads
  bool jit_ = false;
};

// `pattern` with \s and \S (outside classes) spelled out as Oniguruma, HF tokenizers' regex
// engine, defines them, so that PCRE2 splits the same way. Exposed for tests.
std::string WithOnigurumaWhitespace(std::string_view pattern);

// The GPT-2 pattern ByteLevel applies when its `use_regex` is true.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace tandem::tokenizer_internal
