#include "worker/template/render.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/template/builtins.h"

namespace tandem::jinja {
namespace {

absl::Status Error(int line, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", message));
}

// A Python-style index into a sequence of `size`; -1 when out of range.
int64_t Index(int64_t i, int64_t size) {
  if (i < 0) i += size;
  return i < 0 || i >= size ? -1 : i;
}

// Python's slice indices for `size` items.
std::vector<int64_t> SliceIndices(int64_t size, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  std::vector<int64_t> out;
  const auto clamp = [&](std::optional<int64_t> v, int64_t fallback) -> int64_t {
    if (!v) return fallback;
    int64_t x = *v < 0 ? *v + size : *v;
    if (step > 0) return std::clamp<int64_t>(x, 0, size);
    return std::clamp<int64_t>(x, -1, size - 1);
  };
  if (step > 0) {
    for (int64_t i = clamp(start, 0), end = clamp(stop, size); i < end; i += step) out.push_back(i);
  } else {
    for (int64_t i = clamp(start, size - 1), end = clamp(stop, -1); i > end; i += step) {
      out.push_back(i);
    }
  }
  return out;
}

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Dict& context) {
    scopes_.emplace_back();
    for (auto& [name, value] : Globals()) scopes_.back()[name] = value;
    for (const auto& [name, value] : context) scopes_.back()[name] = value;
  }

  absl::Status RenderNodes(const NodeList& nodes, std::string* out, Flow* flow) {
    for (const auto& node : nodes) {
      if (absl::Status s = RenderNode(*node, out, flow); !s.ok()) return s;
      if (*flow != Flow::kNormal) return absl::OkStatus();
      if (out->size() > kMaxOutputBytes) {
        return Error(node->line, absl::StrCat("the output passed ", kMaxOutputBytes, " bytes"));
      }
    }
    return absl::OkStatus();
  }

 private:
  using Scope = std::map<std::string, Value, std::less<>>;

  Value Lookup(absl::string_view name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value::Undefined(std::string(name));
  }

  absl::Status RenderNode(const Node& node, std::string* out, Flow* flow) {
    switch (node.kind) {
      case Node::Kind::kText:
        out->append(node.text);
        return absl::OkStatus();
      case Node::Kind::kOutput: {
        absl::StatusOr<Value> v = Eval(*node.expr);
        if (!v.ok()) return v.status();
        out->append(v->Str());
        return absl::OkStatus();
      }
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          absl::StatusOr<Value> c = Eval(*condition);
          if (!c.ok()) return c.status();
          if (c->Truthy()) return RenderNodes(body, out, flow);
        }
        return RenderNodes(node.else_body, out, flow);
      case Node::Kind::kFor:
        return RenderFor(node, out);
      case Node::Kind::kSet:
        return RenderSet(node);
      case Node::Kind::kMacro:
        scopes_.back()[node.text] = MakeMacro(node);
        return absl::OkStatus();
      case Node::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Node::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status RenderSet(const Node& node) {
    Value value;
    if (node.expr != nullptr) {
      absl::StatusOr<Value> v = Eval(*node.expr);
      if (!v.ok()) return v.status();
      value = *std::move(v);
    } else {
      std::string body;
      Flow flow = Flow::kNormal;
      if (absl::Status s = RenderNodes(node.body, &body, &flow); !s.ok()) return s;
      value = Value(std::move(body));
    }
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = std::move(value);
      return absl::OkStatus();
    }
    const Value ns = Lookup(node.targets[0]);
    if (!ns.is_namespace()) {
      return Error(node.line, absl::StrCat("cannot set an attribute of '", node.targets[0],
                                           "', which is not a namespace"));
    }
    Dict& dict = ns.mutable_dict();
    for (auto& [key, v] : dict) {
      if (key == node.targets[1]) {
        v = std::move(value);
        return absl::OkStatus();
      }
    }
    dict.emplace_back(node.targets[1], std::move(value));
    return absl::OkStatus();
  }

  absl::Status RenderFor(const Node& node, std::string* out) {
    absl::StatusOr<Value> iterable = Eval(*node.expr);
    if (!iterable.ok()) return iterable.status();
    absl::StatusOr<List> items = Iterate(*iterable);
    if (!items.ok()) return Error(node.line, items.status().message());
    scopes_.emplace_back();
    // The loop's own variables, and an item's targets (two targets unpack a pair).
    const auto bind = [&](const Value& item) -> absl::Status {
      if (node.targets.size() == 1) {
        scopes_.back()[node.targets[0]] = item;
        return absl::OkStatus();
      }
      if (!item.is_list() || item.as_list().size() != node.targets.size()) {
        return Error(node.line, absl::StrCat("cannot unpack a ", item.TypeName(), " into ",
                                             node.targets.size(), " loop variables"));
      }
      for (size_t t = 0; t < node.targets.size(); ++t) {
        scopes_.back()[node.targets[t]] = item.as_list()[t];
      }
      return absl::OkStatus();
    };
    // An `if` on the loop filters the items first (loop.length counts the kept ones).
    List kept;
    for (const Value& item : *items) {
      if (node.condition == nullptr) {
        kept.push_back(item);
        continue;
      }
      if (absl::Status s = bind(item); !s.ok()) return PopWith(s);
      absl::StatusOr<Value> keep = Eval(*node.condition);
      if (!keep.ok()) return PopWith(keep.status());
      if (keep->Truthy()) kept.push_back(item);
    }
    const auto n = static_cast<int64_t>(kept.size());
    for (int64_t i = 0; i < n; ++i) {
      if (++iterations_ > kMaxIterations) {
        return PopWith(
            Error(node.line, absl::StrCat("loops passed ", kMaxIterations, " iterations")));
      }
      if (absl::Status s = bind(kept[static_cast<size_t>(i)]); !s.ok()) return PopWith(s);
      scopes_.back()["loop"] = Value::FromDict({
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"previtem", i > 0 ? kept[static_cast<size_t>(i - 1)] : Value::Undefined("previtem")},
          {"nextitem", i + 1 < n ? kept[static_cast<size_t>(i + 1)] : Value::Undefined("nextitem")},
      });
      Flow flow = Flow::kNormal;
      if (absl::Status s = RenderNodes(node.body, out, &flow); !s.ok()) return PopWith(s);
      if (flow == Flow::kBreak) break;
    }
    absl::Status status = absl::OkStatus();
    if (n == 0) {
      Flow flow = Flow::kNormal;
      status = RenderNodes(node.else_body, out, &flow);
    }
    return PopWith(status);
  }

  absl::Status PopWith(absl::Status status) {
    scopes_.pop_back();
    return status;
  }

  Value MakeMacro(const Node& node) {
    return Value::FromFunction([this, &node](const Args& args) -> absl::StatusOr<Value> {
      if (depth_ >= kMaxCallDepth) {
        return Error(node.line, absl::StrCat("macro calls nest deeper than ", kMaxCallDepth));
      }
      Scope scope;
      for (size_t p = 0; p < node.targets.size(); ++p) {
        Value v = Value::Undefined(node.targets[p]);
        if (p < args.positional.size()) {
          v = args.positional[p];
        } else if (node.defaults[p] != nullptr) {
          absl::StatusOr<Value> d = Eval(*node.defaults[p]);
          if (!d.ok()) return d.status();
          v = *std::move(d);
        }
        scope[node.targets[p]] = std::move(v);
      }
      for (const auto& [name, v] : args.keyword) scope[name] = v;
      scopes_.push_back(std::move(scope));
      ++depth_;
      std::string out;
      Flow flow = Flow::kNormal;
      absl::Status s = RenderNodes(node.body, &out, &flow);
      --depth_;
      scopes_.pop_back();
      if (!s.ok()) return s;
      return Value(std::move(out));
    });
  }

  absl::StatusOr<Args> EvalArgs(const Expr& e, size_t from) {
    Args args;
    for (size_t i = from; i < e.items.size(); ++i) {
      absl::StatusOr<Value> v = Eval(*e.items[i]);
      if (!v.ok()) return v.status();
      args.positional.push_back(*std::move(v));
    }
    for (const auto& [name, expr] : e.keywords) {
      absl::StatusOr<Value> v = Eval(*expr);
      if (!v.ok()) return v.status();
      args.keyword.emplace_back(name, *std::move(v));
    }
    return args;
  }

  // Every value an expression makes is bounded: a string by the output bound, a list by the
  // iteration bound (a template doubling a string in a loop stops here).
  absl::StatusOr<Value> Eval(const Expr& e) {
    absl::StatusOr<Value> v = EvalUnbounded(e);
    if (!v.ok()) return v;
    if ((v->is_string() && v->as_string().size() > kMaxOutputBytes) ||
        (v->is_list() && static_cast<int64_t>(v->as_list().size()) > kMaxIterations)) {
      return Error(e.line, "a value past the template's bounds");
    }
    return v;
  }

  absl::StatusOr<Value> EvalUnbounded(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        List list;
        for (const auto& item : e.items) {
          absl::StatusOr<Value> v = Eval(*item);
          if (!v.ok()) return v;
          list.push_back(*std::move(v));
        }
        return Value::FromList(std::move(list));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          absl::StatusOr<Value> key = Eval(*e.items[i]);
          if (!key.ok()) return key;
          absl::StatusOr<Value> v = Eval(*e.items[i + 1]);
          if (!v.ok()) return v;
          dict.emplace_back(key->Str(), *std::move(v));
        }
        return Value::FromDict(std::move(dict));
      }
      case Expr::Kind::kAttribute:
      case Expr::Kind::kSubscript:
        return EvalMember(e);
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall: {
        absl::StatusOr<Value> callee = Eval(*e.items[0]);
        if (!callee.ok()) return callee;
        if (!callee->is_function()) {
          return Error(
              e.line,
              absl::StrCat("'", callee->is_undefined() ? callee->undefined_name() : callee->Repr(),
                           "' is not callable"));
        }
        absl::StatusOr<Args> args = EvalArgs(e, 1);
        if (!args.ok()) return args.status();
        absl::StatusOr<Value> result = callee->as_function()(*args);
        if (!result.ok() &&
            result.status().message().find("chat template line") == absl::string_view::npos) {
          return Error(e.line, result.status().message());
        }
        return result;
      }
      case Expr::Kind::kFilter: {
        absl::StatusOr<Value> v = Eval(*e.items[0]);
        if (!v.ok()) return v;
        absl::StatusOr<Args> args = EvalArgs(e, 1);
        if (!args.ok()) return args.status();
        absl::StatusOr<Value> result = ApplyFilter(e.name, *v, *args);
        if (!result.ok()) return Error(e.line, result.status().message());
        return result;
      }
      case Expr::Kind::kTest: {
        absl::StatusOr<Value> v = Eval(*e.items[0]);
        if (!v.ok()) return v;
        absl::StatusOr<Args> args = EvalArgs(e, 1);
        if (!args.ok()) return args.status();
        absl::StatusOr<bool> result = ApplyTest(e.name, *v, *args);
        if (!result.ok()) return Error(e.line, result.status().message());
        return Value(*result != e.negated);
      }
      case Expr::Kind::kUnary:
        return EvalUnary(e);
      case Expr::Kind::kBinary:
        return EvalBinary(e);
      case Expr::Kind::kCondition: {
        absl::StatusOr<Value> c = Eval(*e.items[0]);
        if (!c.ok()) return c;
        if (c->Truthy()) return Eval(*e.items[1]);
        if (e.items[2] == nullptr) return Value::Undefined();
        return Eval(*e.items[2]);
      }
    }
    return Error(e.line, "unknown expression");
  }

  absl::StatusOr<Value> EvalMember(const Expr& e) {
    absl::StatusOr<Value> target = Eval(*e.items[0]);
    if (!target.ok()) return target;
    Value key;
    if (e.kind == Expr::Kind::kAttribute) {
      key = Value(e.name);
    } else {
      absl::StatusOr<Value> k = Eval(*e.items[1]);
      if (!k.ok()) return k;
      key = *std::move(k);
    }
    if (target->is_undefined()) {
      return Error(e.line, absl::StrCat("'", target->undefined_name(), "' is undefined"));
    }
    if (target->is_dict() && key.is_string()) {
      Value v = target->Get(key.as_string());
      if (!v.is_undefined() || e.kind == Expr::Kind::kSubscript) return v;
    }
    if ((target->is_list() || target->is_string()) && key.kind() == Value::Kind::kInt) {
      if (target->is_list()) {
        const List& list = target->as_list();
        const int64_t i = Index(key.as_int(), static_cast<int64_t>(list.size()));
        return i < 0 ? Value::Undefined() : list[static_cast<size_t>(i)];
      }
      absl::StatusOr<List> chars = Iterate(*target);
      if (!chars.ok()) return chars.status();
      const int64_t i = Index(key.as_int(), static_cast<int64_t>(chars->size()));
      return i < 0 ? Value::Undefined() : (*chars)[static_cast<size_t>(i)];
    }
    if (key.is_string()) return Method(*target, key.as_string());
    return Value::Undefined();
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    absl::StatusOr<Value> target = Eval(*e.items[0]);
    if (!target.ok()) return target;
    std::optional<int64_t> bounds[3];
    for (int b = 0; b < 3; ++b) {
      if (e.items[1 + b] == nullptr) continue;
      absl::StatusOr<Value> v = Eval(*e.items[1 + b]);
      if (!v.ok()) return v;
      if (v->is_none()) continue;
      if (v->kind() != Value::Kind::kInt) return Error(e.line, "slice bounds must be integers");
      bounds[b] = v->as_int();
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return Error(e.line, "a slice step cannot be zero");
    if (!target->is_list() && !target->is_string()) {
      return Error(e.line, absl::StrCat("cannot slice a ", target->TypeName()));
    }
    absl::StatusOr<List> items = Iterate(*target);
    if (!items.ok()) return items.status();
    List out;
    for (int64_t i :
         SliceIndices(static_cast<int64_t>(items->size()), bounds[0], bounds[1], step)) {
      out.push_back((*items)[static_cast<size_t>(i)]);
    }
    if (target->is_list()) return Value::FromList(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.as_string();
    return Value(std::move(s));
  }

  absl::StatusOr<Value> EvalUnary(const Expr& e) {
    absl::StatusOr<Value> v = Eval(*e.items[0]);
    if (!v.ok()) return v;
    if (e.name == "not") return Value(!v->Truthy());
    if (!v->is_number()) {
      return Error(e.line,
                   absl::StrCat("bad operand type for unary ", e.name, ": ", v->TypeName()));
    }
    if (e.name == "+") return *v;
    if (v->kind() == Value::Kind::kInt) return Value(-v->as_int());
    return Value(-v->as_double());
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    absl::StatusOr<Value> left = Eval(*e.items[0]);
    if (!left.ok()) return left;
    // and / or return an operand, and evaluate the right one only when needed.
    if (e.name == "and") return left->Truthy() ? Eval(*e.items[1]) : left;
    if (e.name == "or") return left->Truthy() ? left : Eval(*e.items[1]);
    absl::StatusOr<Value> right = Eval(*e.items[1]);
    if (!right.ok()) return right;
    const Value& a = *left;
    const Value& b = *right;
    const std::string& op = e.name;
    if (op == "==") return Value(a.Equals(b));
    if (op == "!=") return Value(!a.Equals(b));
    if (op == "~") return Value(a.Str() + b.Str());
    if (op == "in" || op == "not in") {
      absl::StatusOr<bool> in = ApplyTest("in", a, Args{.positional = {b}});
      if (!in.ok()) return Error(e.line, in.status().message());
      return Value(*in == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp = 0;
      if (a.is_number() && b.is_number()) {
        cmp = a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        cmp = a.as_string().compare(b.as_string());
      } else {
        return Error(e.line, absl::StrCat("'", op, "' is not supported between ", a.TypeName(),
                                          " and ", b.TypeName()));
      }
      if (op == "<") return Value(cmp < 0);
      if (op == ">") return Value(cmp > 0);
      if (op == "<=") return Value(cmp <= 0);
      return Value(cmp >= 0);
    }
    if (op == "+" && a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (op == "+" && a.is_list() && b.is_list()) {
      List list = a.as_list();
      list.insert(list.end(), b.as_list().begin(), b.as_list().end());
      return Value::FromList(std::move(list));
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.kind() == Value::Kind::kInt) {
      const auto size =
          static_cast<double>(a.is_string() ? a.as_string().size() : a.as_list().size());
      const double bound =
          static_cast<double>(a.is_string() ? kMaxOutputBytes : size_t{kMaxIterations});
      if (static_cast<double>(b.as_int()) * size > bound) {
        return Error(e.line, "a repetition past the output bound");
      }
      if (a.is_string()) {
        std::string s;
        for (int64_t i = 0; i < b.as_int(); ++i) s += a.as_string();
        return Value(std::move(s));
      }
      List list;
      for (int64_t i = 0; i < b.as_int(); ++i) {
        list.insert(list.end(), a.as_list().begin(), a.as_list().end());
      }
      return Value::FromList(std::move(list));
    }
    const bool numbers = (a.is_number() || a.kind() == Value::Kind::kBool) &&
                         (b.is_number() || b.kind() == Value::Kind::kBool);
    if (!numbers) {
      return Error(e.line, absl::StrCat("unsupported operand types for ", op, ": ", a.TypeName(),
                                        " and ", b.TypeName()));
    }
    const auto as_int = [](const Value& v) {
      return v.kind() == Value::Kind::kBool ? int64_t{v.as_bool()} : v.as_int();
    };
    const auto as_double = [&](const Value& v) {
      return v.kind() == Value::Kind::kBool ? static_cast<double>(v.as_bool()) : v.as_double();
    };
    const bool ints = a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat;
    if (op == "/") {
      if (as_double(b) == 0) return Error(e.line, "division by zero");
      return Value(as_double(a) / as_double(b));
    }
    if (op == "//" || op == "%") {
      if (as_double(b) == 0) return Error(e.line, "division by zero");
      if (ints) {
        const int64_t x = as_int(a);
        const int64_t y = as_int(b);
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
        return op == "//" ? Value(q) : Value(x - q * y);
      }
      const double q = std::floor(as_double(a) / as_double(b));
      return op == "//" ? Value(q) : Value(as_double(a) - q * as_double(b));
    }
    if (op == "**") {
      if (ints && as_int(b) >= 0)
        return Value(static_cast<int64_t>(std::pow(as_int(a), as_int(b))));
      return Value(std::pow(as_double(a), as_double(b)));
    }
    if (ints) {
      if (op == "+") return Value(as_int(a) + as_int(b));
      if (op == "-") return Value(as_int(a) - as_int(b));
      if (op == "*") return Value(as_int(a) * as_int(b));
    } else {
      if (op == "+") return Value(as_double(a) + as_double(b));
      if (op == "-") return Value(as_double(a) - as_double(b));
      if (op == "*") return Value(as_double(a) * as_double(b));
    }
    return Error(e.line, absl::StrCat("unsupported operator ", op));
  }

  std::vector<Scope> scopes_;
  int64_t iterations_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Render(const Template& tmpl, const Dict& context) {
  Renderer renderer(context);
  std::string out;
  Flow flow = Flow::kNormal;
  if (absl::Status s = renderer.RenderNodes(tmpl.nodes, &out, &flow); !s.ok()) return s;
  return out;
}

}  // namespace tandem::jinja
