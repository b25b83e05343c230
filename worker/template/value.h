// Values of the Jinja subset that chat templates use (worker/template/render.h), with Python's
// semantics where templates can see them: truthiness, equality, str() and repr() as
// {{ value }} prints them, and json.dumps as Hugging Face's `tojson` filter writes them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem::jinja {

class Value;
using List = std::vector<Value>;
// Insertion-ordered, as Python's dict.
using Dict = std::vector<std::pair<std::string, Value>>;

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(const Args&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value Undefined(std::string name = {});
  static Value None();
  Value(bool b);     // NOLINT(google-explicit-constructor): literals read naturally
  Value(int64_t i);  // NOLINT
  Value(int i) : Value(static_cast<int64_t>(i)) {}  // NOLINT
  Value(double d);                                  // NOLINT
  Value(std::string s);                             // NOLINT
  Value(const char* s) : Value(std::string(s)) {}   // NOLINT
  static Value FromList(List list);
  static Value FromDict(Dict dict);
  // A namespace(): a dict whose attributes `set ns.x = ...` may change.
  static Value Namespace(Dict dict);
  static Value FromFunction(Function f);
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && namespace_; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }  // namespaces only
  const Function& as_function() const { return *function_; }
  const std::string& undefined_name() const { return *s_; }

  // Python's bool(): false for undefined, None, False, 0, "", [] and {}.
  bool Truthy() const;
  // The member `key` of a dict, or undefined.
  Value Get(absl::string_view key) const;
  // Python's ==.
  bool Equals(const Value& other) const;
  // Python's str() (as {{ value }} prints it; undefined prints nothing) and repr().
  std::string Str() const;
  std::string Repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys) with the default
  // separators; indent < 0 = none. InvalidArgument for what JSON cannot hold.
  absl::StatusOr<std::string> ToJson(int indent = -1, bool sort_keys = false) const;
  // A name for messages: "string", "list", ...
  absl::string_view TypeName() const;

 private:
  // Nesting Repr and Equals follow (a namespace can be made to hold itself).
  static constexpr int kMaxDepth = 256;
  std::string Repr(int depth) const;
  bool Equals(const Value& other, int depth) const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;  // string, or an undefined value's name
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> function_;
};

// Python's repr() of a float (shortest round trip; exponent form below 1e-4 and from 1e16).
std::string PyFloat(double d);

}  // namespace tandem::jinja
