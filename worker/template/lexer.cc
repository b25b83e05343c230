#include "worker/template/lexer.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace tandem::jinja {
namespace {

absl::Status Error(int line, absl::string_view message) { return TemplateError(line, message); }

bool IsSpaceOrTab(char c) { return c == ' ' || c == '\t'; }

class Lexer {
 public:
  explicit Lexer(absl::string_view source) : src_(source) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool strip_next = false;    // the previous tag ended with '-'
    bool line_starting = true;  // the previous token ended a line (lstrip_blocks)
    while (pos_ < src_.size()) {
      const size_t start = FindTag(pos_);
      std::string text(src_.substr(pos_, start - pos_));
      if (strip_next) text = std::string(absl::StripLeadingAsciiWhitespace(text));
      strip_next = false;
      if (start == src_.size()) {
        Emit(Tok::kText, std::move(text));
        break;
      }
      const char type = src_[start + 1];  // '{', '%' or '#'
      const char modifier = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (modifier == '-') {
        text = std::string(absl::StripTrailingAsciiWhitespace(text));
      } else if (modifier != '+' && type != '{') {
        // lstrip_blocks: spaces and tabs between the line's start and a block tag go.
        const size_t line_start = text.rfind('\n');
        const size_t from = line_start == std::string::npos ? 0 : line_start + 1;
        if ((line_start != std::string::npos || line_starting) &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(from), text.end(),
                        IsSpaceOrTab)) {
          text.resize(from);
        }
      }
      Emit(Tok::kText, std::move(text));
      line_ +=
          static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                      src_.begin() + static_cast<std::ptrdiff_t>(start), '\n'));
      pos_ = start + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      bool dash_end = false;
      bool plus_end = false;  // "+%}": the newline after the tag stays
      if (type == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == absl::string_view::npos) return Error(line_, "a comment is not closed");
        dash_end = end > pos_ && src_[end - 1] == '-';
        plus_end = end > pos_ && src_[end - 1] == '+';
        line_ +=
            static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                        src_.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
        pos_ = end + 2;
      } else {
        const bool block = type == '%';
        Emit(block ? Tok::kBlockBegin : Tok::kVarBegin, "");
        absl::StatusOr<char> closing = LexTag(block);
        if (!closing.ok()) return closing.status();
        dash_end = *closing == '-';
        plus_end = *closing == '+';
        Emit(block ? Tok::kBlockEnd : Tok::kVarEnd, "");
      }
      strip_next = dash_end;
      line_starting = false;
      // trim_blocks: the newline right after a block or comment tag goes.
      if (!dash_end && !plus_end && type != '{' && pos_ < src_.size() && src_[pos_] == '\n') {
        ++pos_;
        ++line_;
        line_starting = true;
      }
    }
    Emit(Tok::kEnd, "");
    return std::move(tokens_);
  }

 private:
  size_t FindTag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void Emit(Tok kind, std::string text) {
    if (kind == Tok::kText && text.empty()) return;
    tokens_.push_back(Token{.kind = kind, .text = std::move(text), .line = line_});
  }

  // The tokens of a tag's expression up to its end; returns the end's modifier: '-', '+' or 0.
  absl::StatusOr<char> LexTag(bool block) {
    const absl::string_view end = block ? "%}" : "}}";
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) return Error(line_, absl::StrCat("a tag is not closed by ", end));
      const absl::string_view rest = src_.substr(pos_);
      if (depth == 0) {
        if (absl::StartsWith(rest, end)) {
          pos_ += 2;
          return '\0';
        }
        if ((rest[0] == '-' || rest[0] == '+') && absl::StartsWith(rest.substr(1), end)) {
          pos_ += 3;
          return rest[0];
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
          ++n;
        }
        Emit(Tok::kName, std::string(rest.substr(0, n)));
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t n = 0;
        bool is_float = false;
        while (n < rest.size() &&
               (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_' ||
                (rest[n] == '.' && !is_float && n + 1 < rest.size() &&
                 std::isdigit(static_cast<unsigned char>(rest[n + 1]))))) {
          if (rest[n] == '.') is_float = true;
          ++n;
        }
        if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
          size_t m = n + 1;
          if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
          if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
            is_float = true;
            n = m;
            while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
          }
        }
        const std::string digits = absl::StrReplaceAll(rest.substr(0, n), {{"_", ""}});
        Token token{.kind = is_float ? Tok::kFloat : Tok::kInt, .text = digits, .line = line_};
        if (is_float) {
          token.d = std::strtod(digits.c_str(), nullptr);
        } else if (std::from_chars(digits.data(), digits.data() + digits.size(), token.i).ec !=
                   std::errc()) {
          return Error(line_, absl::StrCat("the number ", digits, " is out of range"));
        }
        tokens_.push_back(std::move(token));
        pos_ += n;
      } else if (c == '\'' || c == '"') {
        absl::StatusOr<std::string> s = LexString(c);
        if (!s.ok()) return s.status();
        Emit(Tok::kString, "");
        tokens_.back().text = *std::move(s);
      } else {
        static constexpr absl::string_view kTwo[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (absl::string_view two : kTwo) {
          if (absl::StartsWith(rest, two)) op = std::string(two);
        }
        if (op.size() == 1 &&
            absl::string_view("+-*/%~<>()[]{},.:|=").find(c) == absl::string_view::npos) {
          return Error(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        Emit(Tok::kOp, op);
        pos_ += op.size();
      }
    }
  }

  // A quoted string with Python's escapes; pos_ is at the opening quote.
  absl::StatusOr<std::string> LexString(char quote) {
    std::string out;
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) {
      char c = src_[i];
      if (c == '\n') ++line_;
      if (c == '\\' && i + 1 < src_.size()) {
        const char e = src_[++i];
        switch (e) {
          case 'n':
            out.push_back('\n');
            break;
          case 't':
            out.push_back('\t');
            break;
          case 'r':
            out.push_back('\r');
            break;
          case '\\':
          case '\'':
          case '"':
            out.push_back(e);
            break;
          case '\n':
            ++line_;
            break;
          default:
            out.push_back('\\');
            out.push_back(e);
        }
        ++i;
        continue;
      }
      out.push_back(c);
      ++i;
    }
    if (i >= src_.size()) return Error(line_, "a string is not closed");
    pos_ = i + 1;
    return out;
  }

  absl::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::Status TemplateError(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

absl::StatusOr<std::vector<Token>> Lex(absl::string_view source) { return Lexer(source).Run(); }

}  // namespace tandem::jinja
