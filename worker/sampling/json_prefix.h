// JSON mode (OpenAI's response_format {"type": "json_object"}): a byte-level recogniser of the
// prefixes of a JSON object (RFC 8259 syntax), fed one byte at a time. The sampler lets through
// only tokens whose bytes keep the text a prefix of an object, and the end of the sequence only
// once the object is complete. The object starts at once and whitespace between its tokens
// comes in runs of at most kMaxWhitespace bytes: a model cannot fill its budget with blanks,
// a known failure of unconstrained whitespace in JSON modes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class JsonPrefix {
 public:
  // Whether `c` extends the text to another prefix of a JSON object; when it does not, the
  // state is unspecified (callers scan tokens on a copy).
  bool Feed(char c);
  // Feed for every byte; false (and the state unspecified) at the first byte that does not fit.
  bool FeedAll(std::string_view bytes);
  // The top-level object is closed: only whitespace may follow.
  bool complete() const { return done_; }

  // Most containers open at once; deeper nesting is refused (a bound on the state's size).
  static constexpr size_t kMaxDepth = 128;
  // Longest run of whitespace between tokens (room for a newline and indentation).
  static constexpr int kMaxWhitespace = 32;

 private:
  enum class Expect : uint8_t {
    kValue,       // a value (after '[', ':' or ',' in an array)
    kValueOrEnd,  // a value or ']' (right after '[')
    kKey,         // a key string (after ',' in an object)
    kKeyOrEnd,    // a key or '}' (right after '{')
    kColon,       // ':' after a key
    kCommaOrEnd,  // ',' or the container's end, after a value
  };
  enum class Scalar : uint8_t {
    kNone,
    kString,   // inside a string
    kEscape,   // after '\' in a string
    kUnicode,  // inside \uXXXX (hex_ digits left)
    kNumber,   // inside a number; number_ says where
    kLiteral,  // inside true / false / null; literal_ and matched_ say where
  };
  enum class Number : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

  bool FeedScalar(char c);
  bool StartValue(char c);
  bool EndValue();
  static bool NumberMayEnd(Number n);

  std::vector<char> stack_;  // '{' or '['
  Expect expect_ = Expect::kValue;
  Scalar scalar_ = Scalar::kNone;
  Number number_ = Number::kInt;
  bool key_ = false;  // the string being read is a key
  int hex_ = 0;
  const char* literal_ = nullptr;
  int matched_ = 0;
  bool started_ = false;
  bool done_ = false;
  int whitespace_ = 0;  // the current run of whitespace between tokens
};

}  // namespace tandem
