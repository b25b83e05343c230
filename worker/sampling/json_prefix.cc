#include "worker/sampling/json_prefix.h"

#include <cctype>

namespace tandem {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool JsonPrefix::NumberMayEnd(Number n) {
  return n == Number::kZero || n == Number::kInt || n == Number::kFrac || n == Number::kExp;
}

bool JsonPrefix::FeedAll(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(c)) return false;
  }
  return true;
}

bool JsonPrefix::EndValue() {
  expect_ = Expect::kCommaOrEnd;
  return true;
}

bool JsonPrefix::StartValue(char c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return false;
      stack_.push_back(c);
      expect_ = c == '{' ? Expect::kKeyOrEnd : Expect::kValueOrEnd;
      return true;
    case '"':
      scalar_ = Scalar::kString;
      key_ = false;
      return true;
    case '-':
      scalar_ = Scalar::kNumber;
      number_ = Number::kMinus;
      return true;
    case 't':
    case 'f':
    case 'n':
      scalar_ = Scalar::kLiteral;
      literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      matched_ = 1;
      return true;
    default:
      if (!IsDigit(c)) return false;
      scalar_ = Scalar::kNumber;
      number_ = c == '0' ? Number::kZero : Number::kInt;
      return true;
  }
}

bool JsonPrefix::FeedScalar(char c) {
  switch (scalar_) {
    case Scalar::kString:
      if (c == '"') {
        scalar_ = Scalar::kNone;
        if (key_) {
          expect_ = Expect::kColon;
          return true;
        }
        return EndValue();
      }
      if (c == '\\') {
        scalar_ = Scalar::kEscape;
        return true;
      }
      return static_cast<unsigned char>(c) >= 0x20;
    case Scalar::kEscape:
      if (c == 'u') {
        scalar_ = Scalar::kUnicode;
        hex_ = 4;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        scalar_ = Scalar::kString;
        return true;
      }
      return false;
    case Scalar::kUnicode:
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
      if (--hex_ == 0) scalar_ = Scalar::kString;
      return true;
    case Scalar::kLiteral:
      if (literal_[matched_] != c) return false;
      if (literal_[++matched_] == '\0') {
        scalar_ = Scalar::kNone;
        return EndValue();
      }
      return true;
    case Scalar::kNumber: {
      const bool digit = IsDigit(c);
      switch (number_) {
        case Number::kMinus:
          if (!digit) return false;
          number_ = c == '0' ? Number::kZero : Number::kInt;
          return true;
        case Number::kDot:
          if (!digit) return false;
          number_ = Number::kFrac;
          return true;
        case Number::kE:
          if (c == '+' || c == '-') {
            number_ = Number::kESign;
            return true;
          }
          if (!digit) return false;
          number_ = Number::kExp;
          return true;
        case Number::kESign:
          if (!digit) return false;
          number_ = Number::kExp;
          return true;
        case Number::kInt:
        case Number::kFrac:
        case Number::kExp:
          if (digit) return true;
          break;
        case Number::kZero:
          break;
      }
      if (c == '.' && (number_ == Number::kZero || number_ == Number::kInt)) {
        number_ = Number::kDot;
        return true;
      }
      if ((c == 'e' || c == 'E') && number_ != Number::kExp) {
        number_ = Number::kE;
        return true;
      }
      // The number ends here; `c` is what follows it.
      scalar_ = Scalar::kNone;
      EndValue();
      return Feed(c);
    }
    case Scalar::kNone:
      break;
  }
  return false;
}

bool JsonPrefix::Feed(char c) {
  if (scalar_ != Scalar::kNone) return FeedScalar(c);
  if (IsSpace(c)) return started_ && ++whitespace_ <= kMaxWhitespace;
  whitespace_ = 0;
  if (done_) return false;
  if (!started_) {
    if (c != '{') return false;
    started_ = true;
    stack_.push_back('{');
    expect_ = Expect::kKeyOrEnd;
    return true;
  }
  const auto close = [this]() {
    stack_.pop_back();
    if (stack_.empty()) {
      done_ = true;
    } else {
      expect_ = Expect::kCommaOrEnd;
    }
    return true;
  };
  switch (expect_) {
    case Expect::kKeyOrEnd:
      if (c == '}') return close();
      [[fallthrough]];
    case Expect::kKey:
      if (c != '"') return false;
      scalar_ = Scalar::kString;
      key_ = true;
      return true;
    case Expect::kColon:
      if (c != ':') return false;
      expect_ = Expect::kValue;
      return true;
    case Expect::kValueOrEnd:
      if (c == ']') return close();
      [[fallthrough]];
    case Expect::kValue:
      return StartValue(c);
    case Expect::kCommaOrEnd:
      if (c == ',') {
        expect_ = stack_.back() == '{' ? Expect::kKey : Expect::kValue;
        return true;
      }
      if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
        return close();
      }
      return false;
  }
  return false;
}

}  // namespace tandem
