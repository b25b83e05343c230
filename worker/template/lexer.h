// The tokens of a chat template (worker/template/parser.h): text between tags, the tags'
// delimiters, and the names, literals and operators inside tags. Whitespace control follows
// Jinja2 with Hugging Face's settings for chat templates: trim_blocks (the newline after a
// block or comment tag is dropped), lstrip_blocks (spaces and tabs before a block or comment tag
// on its own line are dropped), `-` on any tag strips the whitespace beside it, and `+` keeps
// what lstrip_blocks or trim_blocks would drop. Internal to the parser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::jinja {

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEnd
};

struct Token {
  Tok kind;
  std::string text;  // text, name, string value or operator
  int line = 0;
  int64_t i = 0;
  double d = 0;
};

// The tokens of `source` (newlines already normalised), ending with kEnd. InvalidArgument
// naming the line for an unclosed tag, comment or string, or a character outside the syntax.
absl::StatusOr<std::vector<Token>> Lex(absl::string_view source);

// "chat template line N: message".
absl::Status TemplateError(int line, absl::string_view message);

}  // namespace tandem::jinja
