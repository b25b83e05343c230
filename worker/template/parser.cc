#include "worker/template/parser.h"

#include <algorithm>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "worker/template/lexer.h"

namespace tandem::jinja {
namespace {

absl::Status Error(int line, absl::string_view message) { return TemplateError(line, message); }

// Nesting of blocks and of expressions: past this a template is refused rather than recursed
// into (real templates nest a few levels).
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<NodeList> Run() {
    std::string end;
    NodeList nodes;
    if (absl::Status s = ParseBody({}, &nodes, &end); !s.ok()) return s;
    return nodes;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Tok::kName && Peek(ahead).text == name;
  }
  bool Accept(absl::string_view op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  absl::Status Expect(absl::string_view op) {
    if (Accept(op)) return absl::OkStatus();
    return Error(Peek().line, absl::StrCat("expected '", op, "', got '", Describe(Peek()), "'"));
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().kind == Tok::kBlockEnd) {
      ++pos_;
      return absl::OkStatus();
    }
    return Error(Peek().line,
                 absl::StrCat("expected the end of the tag, got '", Describe(Peek()), "'"));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Tok::kName) {
      return Error(Peek().line, absl::StrCat("expected a name, got '", Describe(Peek()), "'"));
    }
    return Next().text;
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEnd:
        return "end of template";
      case Tok::kBlockEnd:
        return "%}";
      case Tok::kVarEnd:
        return "}}";
      default:
        return t.text;
    }
  }

  // Nodes up to a block tag named in `ends` (its name goes to *end, the cursor stays after the
  // name); the whole template when `ends` is empty.
  absl::Status ParseBody(std::initializer_list<absl::string_view> ends, NodeList* out,
                         std::string* end) {
    while (true) {
      const Token& t = Peek();
      if (t.kind == Tok::kEnd) {
        if (ends.size() == 0) return absl::OkStatus();
        return Error(t.line, absl::StrCat("the template ends inside a block; expected {% ",
                                          *ends.begin(), " %}"));
      }
      if (t.kind == Tok::kText) {
        auto node = std::make_unique<Node>(Node{.kind = Node::Kind::kText, .line = t.line});
        node->text = Next().text;
        out->push_back(std::move(node));
        continue;
      }
      if (t.kind == Tok::kVarBegin) {
        ++pos_;
        auto node = std::make_unique<Node>(Node{.kind = Node::Kind::kOutput, .line = t.line});
        absl::StatusOr<ExprPtr> e = ParseExpression();
        if (!e.ok()) return e.status();
        node->expr = *std::move(e);
        if (Peek().kind != Tok::kVarEnd) {
          return Error(Peek().line, absl::StrCat("expected '}}', got '", Describe(Peek()), "'"));
        }
        ++pos_;
        out->push_back(std::move(node));
        continue;
      }
      if (t.kind != Tok::kBlockBegin) return Error(t.line, "unexpected token");
      ++pos_;
      absl::StatusOr<std::string> name = ExpectName();
      if (!name.ok()) return name.status();
      for (absl::string_view e : ends) {
        if (*name == e) {
          *end = *name;
          return absl::OkStatus();
        }
      }
      if (absl::Status s = ParseStatement(*name, t.line, out); !s.ok()) return s;
    }
  }

  absl::Status ParseStatement(const std::string& name, int line, NodeList* out) {
    const Nesting nesting(&depth_);
    if (!nesting.ok()) return TooDeep();
    if (name == "if") return ParseIf(line, out);
    if (name == "for") return ParseFor(line, out);
    if (name == "set") return ParseSet(line, out);
    if (name == "macro") return ParseMacro(line, out);
    if (name == "break" || name == "continue") {
      out->push_back(std::make_unique<Node>(Node{
          .kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, .line = line}));
      return ExpectBlockEnd();
    }
    if (name == "generation") {  // Hugging Face's marker of assistant text: rendered through
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      std::string end;
      if (absl::Status s = ParseBody({"endgeneration"}, out, &end); !s.ok()) return s;
      return ExpectBlockEnd();
    }
    return Error(line, absl::StrCat("the statement '", name, "' is not supported"));
  }

  absl::Status ParseIf(int line, NodeList* out) {
    auto node = std::make_unique<Node>(Node{.kind = Node::Kind::kIf, .line = line});
    std::string end = "if";
    while (end == "if" || end == "elif") {
      absl::StatusOr<ExprPtr> condition = ParseExpression();
      if (!condition.ok()) return condition.status();
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      NodeList body;
      if (absl::Status s = ParseBody({"elif", "else", "endif"}, &body, &end); !s.ok()) return s;
      node->branches.emplace_back(*std::move(condition), std::move(body));
    }
    if (end == "else") {
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      if (absl::Status s = ParseBody({"endif"}, &node->else_body, &end); !s.ok()) return s;
    }
    out->push_back(std::move(node));
    return ExpectBlockEnd();
  }

  absl::Status ParseFor(int line, NodeList* out) {
    auto node = std::make_unique<Node>(Node{.kind = Node::Kind::kFor, .line = line});
    do {
      absl::StatusOr<std::string> target = ExpectName();
      if (!target.ok()) return target.status();
      node->targets.push_back(*std::move(target));
    } while (Accept(","));
    if (!IsName("in")) return Error(Peek().line, "expected 'in' in a for loop");
    ++pos_;
    absl::StatusOr<ExprPtr> iter = ParseOr();
    if (!iter.ok()) return iter.status();
    node->expr = *std::move(iter);
    if (IsName("if")) {
      ++pos_;
      absl::StatusOr<ExprPtr> condition = ParseExpression();
      if (!condition.ok()) return condition.status();
      node->condition = *std::move(condition);
    }
    if (IsName("recursive")) return Error(line, "recursive loops are not supported");
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    std::string end;
    if (absl::Status s = ParseBody({"else", "endfor"}, &node->body, &end); !s.ok()) return s;
    if (end == "else") {
      if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
      if (absl::Status s = ParseBody({"endfor"}, &node->else_body, &end); !s.ok()) return s;
    }
    out->push_back(std::move(node));
    return ExpectBlockEnd();
  }

  absl::Status ParseSet(int line, NodeList* out) {
    auto node = std::make_unique<Node>(Node{.kind = Node::Kind::kSet, .line = line});
    absl::StatusOr<std::string> target = ExpectName();
    if (!target.ok()) return target.status();
    node->targets.push_back(*std::move(target));
    if (Accept(".")) {
      absl::StatusOr<std::string> attribute = ExpectName();
      if (!attribute.ok()) return attribute.status();
      node->targets.push_back(*std::move(attribute));
    }
    if (Accept("=")) {
      absl::StatusOr<ExprPtr> value = ParseExpression();
      if (!value.ok()) return value.status();
      node->expr = *std::move(value);
      out->push_back(std::move(node));
      return ExpectBlockEnd();
    }
    // {% set name %}...{% endset %}: the rendered body.
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    std::string end;
    if (absl::Status s = ParseBody({"endset"}, &node->body, &end); !s.ok()) return s;
    out->push_back(std::move(node));
    return ExpectBlockEnd();
  }

  absl::Status ParseMacro(int line, NodeList* out) {
    auto node = std::make_unique<Node>(Node{.kind = Node::Kind::kMacro, .line = line});
    absl::StatusOr<std::string> name = ExpectName();
    if (!name.ok()) return name.status();
    node->text = *std::move(name);
    if (absl::Status s = Expect("("); !s.ok()) return s;
    while (!Accept(")")) {
      absl::StatusOr<std::string> param = ExpectName();
      if (!param.ok()) return param.status();
      node->targets.push_back(*std::move(param));
      ExprPtr default_value;
      if (Accept("=")) {
        absl::StatusOr<ExprPtr> d = ParseExpression();
        if (!d.ok()) return d.status();
        default_value = *std::move(d);
      }
      node->defaults.push_back(std::move(default_value));
      if (!IsOp(")") && !Accept(",")) return Expect(",");
    }
    if (absl::Status s = ExpectBlockEnd(); !s.ok()) return s;
    std::string end;
    if (absl::Status s = ParseBody({"endmacro"}, &node->body, &end); !s.ok()) return s;
    out->push_back(std::move(node));
    return ExpectBlockEnd();
  }

  // Expressions, from the loosest binding to the tightest.

  ExprPtr Make(Expr::Kind kind, int line) {
    return std::make_unique<Expr>(Expr{.kind = kind, .line = line});
  }
  ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right) {
    ExprPtr e = Make(Expr::Kind::kBinary, left->line);
    e->name = std::move(op);
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    const Nesting nesting(&depth_);
    if (!nesting.ok()) return TooDeep();
    absl::StatusOr<ExprPtr> body = ParseOr();
    if (!body.ok()) return body;
    while (IsName("if")) {
      ++pos_;
      absl::StatusOr<ExprPtr> condition = ParseOr();
      if (!condition.ok()) return condition;
      ExprPtr e = Make(Expr::Kind::kCondition, (*body)->line);
      e->items.push_back(*std::move(condition));
      e->items.push_back(*std::move(body));
      if (IsName("else")) {
        ++pos_;
        absl::StatusOr<ExprPtr> otherwise = ParseExpression();
        if (!otherwise.ok()) return otherwise;
        e->items.push_back(*std::move(otherwise));
      } else {
        e->items.push_back(nullptr);
      }
      body = std::move(e);
    }
    return body;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    absl::StatusOr<ExprPtr> left = ParseAnd();
    while (left.ok() && IsName("or")) {
      ++pos_;
      absl::StatusOr<ExprPtr> right = ParseAnd();
      if (!right.ok()) return right;
      left = Binary("or", *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    absl::StatusOr<ExprPtr> left = ParseNot();
    while (left.ok() && IsName("and")) {
      ++pos_;
      absl::StatusOr<ExprPtr> right = ParseNot();
      if (!right.ok()) return right;
      left = Binary("and", *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    const Nesting nesting(&depth_);
    if (!nesting.ok()) return TooDeep();
    if (IsName("not")) {
      const int line = Next().line;
      absl::StatusOr<ExprPtr> operand = ParseNot();
      if (!operand.ok()) return operand;
      ExprPtr e = Make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->items.push_back(*std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    absl::StatusOr<ExprPtr> left = ParseMath1();
    while (left.ok()) {
      std::string op;
      if (Peek().kind == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        ++pos_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      absl::StatusOr<ExprPtr> right = ParseMath1();
      if (!right.ok()) return right;
      left = Binary(op, *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    absl::StatusOr<ExprPtr> left = ParseConcat();
    while (left.ok() && (IsOp("+") || IsOp("-"))) {
      const std::string op = Next().text;
      absl::StatusOr<ExprPtr> right = ParseConcat();
      if (!right.ok()) return right;
      left = Binary(op, *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    absl::StatusOr<ExprPtr> left = ParseMath2();
    while (left.ok() && IsOp("~")) {
      ++pos_;
      absl::StatusOr<ExprPtr> right = ParseMath2();
      if (!right.ok()) return right;
      left = Binary("~", *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    absl::StatusOr<ExprPtr> left = ParsePow();
    while (left.ok() && (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) {
      const std::string op = Next().text;
      absl::StatusOr<ExprPtr> right = ParsePow();
      if (!right.ok()) return right;
      left = Binary(op, *std::move(left), *std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    absl::StatusOr<ExprPtr> left = ParseUnary();
    while (left.ok() && IsOp("**")) {
      ++pos_;
      absl::StatusOr<ExprPtr> right = ParseUnary();
      if (!right.ok()) return right;
      left = Binary("**", *std::move(left), *std::move(right));
    }
    return left;
  }

  // As Jinja2: a sign binds tighter than filters (-3|abs is 3), filters tighter than math.
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filters = true) {
    const Nesting nesting(&depth_);
    if (!nesting.ok()) return TooDeep();
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      absl::StatusOr<ExprPtr> operand = ParseUnary(false);
      if (!operand.ok()) return operand;
      e = Make(Expr::Kind::kUnary, t.line);
      e->name = t.text;
      e->items.push_back(*std::move(operand));
    } else {
      absl::StatusOr<ExprPtr> primary = ParsePrimary();
      if (!primary.ok()) return primary;
      e = *std::move(primary);
    }
    absl::StatusOr<ExprPtr> postfix = ParsePostfix(std::move(e));
    if (!postfix.ok() || !with_filters) return postfix;
    return ParseFilters(*std::move(postfix));
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Next();
    switch (t.kind) {
      case Tok::kName: {
        if (t.text == "true" || t.text == "True") return Literal(Value(true), t.line);
        if (t.text == "false" || t.text == "False") return Literal(Value(false), t.line);
        if (t.text == "none" || t.text == "None") return Literal(Value::None(), t.line);
        ExprPtr e = Make(Expr::Kind::kName, t.line);
        e->name = t.text;
        return e;
      }
      case Tok::kString: {
        std::string s = t.text;
        while (Peek().kind == Tok::kString) s += Next().text;  // adjacent literals join
        return Literal(Value(std::move(s)), t.line);
      }
      case Tok::kInt:
        return Literal(Value(t.i), t.line);
      case Tok::kFloat:
        return Literal(Value(t.d), t.line);
      case Tok::kOp:
        if (t.text == "(") {
          absl::StatusOr<ExprPtr> inner = ParseExpression();
          if (!inner.ok()) return inner;
          if (!IsOp(",")) {
            if (absl::Status s = Expect(")"); !s.ok()) return s;
            return inner;
          }
          ExprPtr tuple = Make(Expr::Kind::kList, t.line);
          tuple->items.push_back(*std::move(inner));
          while (Accept(",") && !IsOp(")")) {
            absl::StatusOr<ExprPtr> item = ParseExpression();
            if (!item.ok()) return item;
            tuple->items.push_back(*std::move(item));
          }
          if (absl::Status s = Expect(")"); !s.ok()) return s;
          return tuple;
        }
        if (t.text == "[") {
          ExprPtr list = Make(Expr::Kind::kList, t.line);
          while (!Accept("]")) {
            absl::StatusOr<ExprPtr> item = ParseExpression();
            if (!item.ok()) return item;
            list->items.push_back(*std::move(item));
            if (!IsOp("]") && !Accept(",")) return Expect(",");
          }
          return list;
        }
        if (t.text == "{") {
          ExprPtr dict = Make(Expr::Kind::kDict, t.line);
          while (!Accept("}")) {
            absl::StatusOr<ExprPtr> key = ParseExpression();
            if (!key.ok()) return key;
            if (absl::Status s = Expect(":"); !s.ok()) return s;
            absl::StatusOr<ExprPtr> value = ParseExpression();
            if (!value.ok()) return value;
            dict->items.push_back(*std::move(key));
            dict->items.push_back(*std::move(value));
            if (!IsOp("}") && !Accept(",")) return Expect(",");
          }
          return dict;
        }
        break;
      default:
        break;
    }
    return Error(t.line, absl::StrCat("unexpected '", Describe(t), "' in an expression"));
  }

  ExprPtr Literal(Value v, int line) {
    ExprPtr e = Make(Expr::Kind::kLiteral, line);
    e->value = std::move(v);
    return e;
  }

  // .name, [index], [a:b:c] and (args) after a primary.
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      if (Accept(".")) {
        const Token& t = Next();
        if (t.kind != Tok::kName && t.kind != Tok::kInt) {
          return Error(t.line, "expected an attribute name after '.'");
        }
        ExprPtr a = Make(Expr::Kind::kAttribute, t.line);
        a->name = t.text;
        a->items.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        absl::StatusOr<ExprPtr> s = ParseSubscript(std::move(e));
        if (!s.ok()) return s;
        e = *std::move(s);
      } else if (IsOp("(")) {
        absl::StatusOr<ExprPtr> c = ParseCall(std::move(e));
        if (!c.ok()) return c;
        e = *std::move(c);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr target) {
    const int line = Next().line;  // '['
    ExprPtr bounds[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (Accept(":")) {
        if (++colons > 2) return Error(line, "a slice has at most two ':'");
        continue;
      }
      if (bounds[colons] != nullptr) return Expect("]");
      absl::StatusOr<ExprPtr> bound = ParseExpression();
      if (!bound.ok()) return bound;
      bounds[colons] = *std::move(bound);
    }
    ++pos_;
    if (colons == 0) {
      if (bounds[0] == nullptr) return Error(line, "an empty subscript");
      ExprPtr e = Make(Expr::Kind::kSubscript, line);
      e->items.push_back(std::move(target));
      e->items.push_back(std::move(bounds[0]));
      return e;
    }
    ExprPtr e = Make(Expr::Kind::kSlice, line);
    e->items.push_back(std::move(target));
    for (ExprPtr& bound : bounds) e->items.push_back(std::move(bound));
    return e;
  }

  // (positional, ..., name=value, ...) into e's items[from..] and keywords.
  absl::Status ParseArgs(Expr* e) {
    if (absl::Status s = Expect("("); !s.ok()) return s;
    while (!Accept(")")) {
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        std::string name = Next().text;
        ++pos_;
        absl::StatusOr<ExprPtr> value = ParseExpression();
        if (!value.ok()) return value.status();
        e->keywords.emplace_back(std::move(name), *std::move(value));
      } else {
        absl::StatusOr<ExprPtr> value = ParseExpression();
        if (!value.ok()) return value.status();
        e->items.push_back(*std::move(value));
      }
      if (!IsOp(")") && !Accept(",")) return Expect(",");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr e = Make(Expr::Kind::kCall, callee->line);
    e->items.push_back(std::move(callee));
    if (absl::Status s = ParseArgs(e.get()); !s.ok()) return s;
    return e;
  }

  // | filter(args) and is [not] test(args), in any order, then more postfix.
  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      if (Accept("|")) {
        absl::StatusOr<std::string> name = ExpectName();
        if (!name.ok()) return name.status();
        ExprPtr f = Make(Expr::Kind::kFilter, e->line);
        f->name = *std::move(name);
        f->items.push_back(std::move(e));
        if (IsOp("(")) {
          if (absl::Status s = ParseArgs(f.get()); !s.ok()) return s;
        }
        e = std::move(f);
      } else if (IsName("is")) {
        ++pos_;
        ExprPtr t = Make(Expr::Kind::kTest, e->line);
        if (IsName("not")) {
          ++pos_;
          t->negated = true;
        }
        // Test names may be keywords: none, true, false, in.
        const Token& name = Next();
        if (name.kind != Tok::kName && !(name.kind == Tok::kOp && name.text == "==")) {
          return Error(name.line, "expected a test name after 'is'");
        }
        t->name = name.text;
        t->items.push_back(std::move(e));
        if (IsOp("(")) {
          if (absl::Status s = ParseArgs(t.get()); !s.ok()) return s;
        } else if (Peek().kind == Tok::kString || Peek().kind == Tok::kInt ||
                   Peek().kind == Tok::kFloat) {
          absl::StatusOr<ExprPtr> arg = ParsePrimary();  // `is divisibleby 3`
          if (!arg.ok()) return arg;
          t->items.push_back(*std::move(arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  // Counts one level of nesting for its lifetime; `ok()` is false past kMaxNesting.
  class Nesting {
   public:
    explicit Nesting(int* depth) : depth_(depth) { ++*depth_; }
    ~Nesting() { --*depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
    bool ok() const { return *depth_ <= kMaxNesting; }

   private:
    int* depth_;
  };
  absl::Status TooDeep() const {
    return Error(Peek().line, absl::StrCat("the template nests deeper than ", kMaxNesting));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Template>> Parse(absl::string_view source) {
  // As Jinja2: newlines normalised, and one trailing newline dropped (keep_trailing_newline).
  std::string text = absl::StrReplaceAll(source, {{"\r\n", "\n"}});
  if (!text.empty() && text.back() == '\n') text.pop_back();
  absl::StatusOr<std::vector<Token>> tokens = Lex(text);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<NodeList> nodes = Parser(*std::move(tokens)).Run();
  if (!nodes.ok()) return nodes.status();
  auto parsed = std::make_shared<Template>();
  parsed->nodes = *std::move(nodes);
  return parsed;
}

}  // namespace tandem::jinja
