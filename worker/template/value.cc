#include "worker/template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {
namespace {

// json.dumps's escaping with ensure_ascii=False: quotes, backslashes and control characters.
void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out->append(buf);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Python's repr() of a string: single quotes unless the string has one and no double quote.
std::string PyStringRepr(absl::string_view s) {
  const bool double_quotes =
      s.find('\'') != absl::string_view::npos && s.find('"') == absl::string_view::npos;
  const char quote = double_quotes ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
      out.append(buf);
    } else {
      out.push_back(c);
    }
  }
  out.push_back(quote);
  return out;
}

absl::Status AppendJson(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: the value nests too deeply");
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out->append("null");
      return absl::OkStatus();
    case Value::Kind::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out->append("NaN");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? "Infinity" : "-Infinity");
      } else {
        out->append(PyFloat(d));
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.as_string(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      const List& list = v.as_list();
      if (list.empty()) {
        out->append("[]");
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out->append(indent < 0 ? ", " : ",");
        newline(depth + 1);
        if (absl::Status s = AppendJson(list[i], indent, sort_keys, depth + 1, out); !s.ok()) {
          return s;
        }
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.as_dict()) items.push_back(&item);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      if (items.empty()) {
        out->append("{}");
        return absl::OkStatus();
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(indent < 0 ? ", " : ",");
        newline(depth + 1);
        AppendJsonString(items[i]->first, out);
        out->append(": ");
        if (absl::Status s = AppendJson(items[i]->second, indent, sort_keys, depth + 1, out);
            !s.ok()) {
          return s;
        }
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tojson: a value of type ", v.TypeName(), " is not JSON serializable"));
}

}  // namespace

std::string PyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that round-trip, then Python's layout of them.
  char buf[64];
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]d[.ddd]e[+-]XX
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) {
    return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  }
  const auto point = static_cast<size_t>(exponent + 1);
  if (digits.size() <= point) {
    return out + digits + std::string(point - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

Value Value::Undefined(std::string name) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s)
    : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value Value::FromList(List list) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const List>(std::move(list));
  return v;
}
Value Value::FromDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}
Value Value::Namespace(Dict dict) {
  Value v = FromDict(std::move(dict));
  v.namespace_ = true;
  return v;
}
Value Value::FromFunction(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.function_ = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List list;
      for (const nlohmann::ordered_json& item : json) list.push_back(FromJson(item));
      return FromList(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict dict;
      for (const auto& [key, item] : json.items()) dict.emplace_back(key, FromJson(item));
      return FromDict(std::move(dict));
    }
    default:
      return Undefined();
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return namespace_ || !dict_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

Value Value::Get(absl::string_view key) const {
  if (kind_ == Kind::kDict) {
    for (const auto& [k, v] : *dict_) {
      if (k == key) return v;
    }
  }
  return Undefined(std::string(key));
}

bool Value::Equals(const Value& other) const { return Equals(other, 0); }

bool Value::Equals(const Value& other, int depth) const {
  if (depth > kMaxDepth) return false;
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kInt && other.kind_ == Kind::kInt) return i_ == other.i_;
    return as_double() == other.as_double();
  }
  // Python: True == 1.
  if (kind_ == Kind::kBool && other.is_number()) return Value(int64_t{b_}).Equals(other, depth);
  if (other.kind_ == Kind::kBool && is_number()) return other.Equals(*this, depth);
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == other.b_;
    case Kind::kString:
      return *s_ == *other.s_;
    case Kind::kList:
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i], depth + 1)) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->size() != other.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        if (!other.Get(k).Equals(v, depth + 1)) return false;
      }
      return true;
    case Kind::kFunction:
      return function_ == other.function_;
    default:
      return false;
  }
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return *s_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const { return Repr(0); }

std::string Value::Repr(int depth) const {
  if (depth > kMaxDepth) return "...";  // a namespace that holds itself, say
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return PyFloat(d_);
    case Kind::kString:
      return PyStringRepr(*s_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr(depth + 1);
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = namespace_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        if (i > 0) out += ", ";
        out += PyStringRepr((*dict_)[i].first) + ": " + (*dict_)[i].second.Repr(depth + 1);
      }
      return out + (namespace_ ? "}>" : "}");
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

absl::StatusOr<std::string> Value::ToJson(int indent, bool sort_keys) const {
  std::string out;
  if (absl::Status s = AppendJson(*this, indent, sort_keys, 0, &out); !s.ok()) return s;
  return out;
}

absl::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return namespace_ ? "namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "";
}

}  // namespace tandem::jinja
