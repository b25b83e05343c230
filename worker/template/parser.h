// Parsing the Jinja subset chat templates use into a tree (worker/template/render.h runs it).
// The lexer follows Jinja2 with Hugging Face's settings for chat templates: trim_blocks (the
// newline after a block tag is dropped) and lstrip_blocks (spaces before a block tag on its own
// line are dropped), with `-` whitespace control on every tag and `+` to keep lstrip off.
//
// Statements: if / elif / else, for (one or two targets, `else`, loop.*), set (a name, or an
// attribute of a namespace), macro (with defaults) and its calls, break / continue, and
// generation / endgeneration (rendered through). Expressions: literals, lists, dicts, tuples,
// names, attributes, subscripts and slices, calls with keyword arguments, filters, tests
// (`is [not] name`), `not`, `and`, `or`, `in` / `not in`, comparisons, + - * / // % ** and ~,
// and `a if b else c`, with Jinja2's precedence.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/template/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items (tuples too)
    kDict,       // keys (literal strings in items[2i]) and values (items[2i+1])
    kAttribute,  // items[0].name
    kSubscript,  // items[0][items[1]]
    kSlice,      // items[0][items[1]:items[2]:items[3]] (null items are absent bounds)
    kCall,       // items[0](items[1..], keywords)
    kFilter,     // items[0] | name(items[1..], keywords)
    kTest,       // items[0] is [not] name(items[1..]); negated
    kUnary,      // op items[0]: "not", "-", "+"
    kBinary,     // items[0] op items[1]
    kCondition,  // items[1] if items[0] else items[2] (items[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test, operator
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // branches: (condition, body)...; else_body
    kFor,     // targets in expr [if condition]: body; else_body
    kSet,     // targets[0] (or targets[0].targets[1] on a namespace) = expr
    kMacro,   // name(targets with defaults): body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // macro parameter defaults, null where none
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
};

struct Template {
  NodeList nodes;
};

// InvalidArgument naming the line for a template outside the subset or malformed.
absl::StatusOr<std::shared_ptr<const Template>> Parse(absl::string_view source);

}  // namespace tandem::jinja
