#include "worker/template/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker/template/render.h"  // the bounds a template's values keep

namespace tandem::jinja {
namespace {

absl::Status Bad(absl::string_view message) { return absl::InvalidArgumentError(message); }

// Argument `i` (or keyword `name`) of a call, or `fallback`.
Value Arg(const Args& args, size_t i, absl::string_view name, Value fallback = Value::Undefined()) {
  if (i < args.positional.size()) return args.positional[i];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return v;
  }
  return fallback;
}

// Python's str.strip family: `chars` (undefined or none: whitespace) from either end.
std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::string set = chars.is_string() ? chars.as_string() : std::string(" \t\n\r\f\v");
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end && set.find(s[begin]) != std::string::npos) ++begin;
  }
  if (right) {
    while (end > begin && set.find(s[end - 1]) != std::string::npos) --end;
  }
  return s.substr(begin, end - begin);
}

// The UTF-8 characters of `s`, each as its bytes.
List Characters(const std::string& s) {
  List out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(Value(s.substr(i, n)));
    i += n;
  }
  return out;
}

absl::StatusOr<Value> Split(const std::string& s, const Value& sep, const Value& max_value,
                            bool from_right) {
  const int64_t max = max_value.kind() == Value::Kind::kInt ? max_value.as_int() : -1;
  std::vector<std::string> parts;
  if (!sep.is_string()) {  // runs of whitespace, leading and trailing ignored
    for (absl::string_view p :
         absl::StrSplit(s, absl::ByAnyChar(" \t\n\r\f\v"), absl::SkipEmpty())) {
      parts.emplace_back(p);
    }
    if (max >= 0 && static_cast<int64_t>(parts.size()) > max + 1) {
      // Rejoining the tail loses the original whitespace; rare enough to refuse instead.
      return Bad("split() without a separator takes no maxsplit here");
    }
  } else {
    if (sep.as_string().empty()) return Bad("split(): empty separator");
    const std::string& d = sep.as_string();
    if (!from_right) {
      size_t start = 0;
      size_t at;
      while ((max < 0 || static_cast<int64_t>(parts.size()) < max) &&
             (at = s.find(d, start)) != std::string::npos) {
        parts.push_back(s.substr(start, at - start));
        start = at + d.size();
      }
      parts.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      std::vector<std::string> reversed;
      while ((max < 0 || static_cast<int64_t>(reversed.size()) < max) && end >= d.size()) {
        const size_t at = s.rfind(d, end - d.size());
        if (at == std::string::npos) break;
        reversed.push_back(s.substr(at + d.size(), end - at - d.size()));
        end = at;
      }
      reversed.push_back(s.substr(0, end));
      parts.assign(reversed.rbegin(), reversed.rend());
    }
  }
  List out;
  for (std::string& p : parts) out.push_back(Value(std::move(p)));
  return Value::FromList(std::move(out));
}

// startswith / endswith with a string or a tuple of strings.
absl::StatusOr<Value> Affix(const std::string& s, const Value& affix, bool prefix) {
  const auto one = [&](const Value& a) -> absl::StatusOr<bool> {
    if (!a.is_string()) return Bad("startswith/endswith take a string or a tuple of strings");
    return prefix ? s.starts_with(a.as_string()) : s.ends_with(a.as_string());
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list()) {
      absl::StatusOr<bool> hit = one(a);
      if (!hit.ok()) return hit.status();
      if (*hit) return Value(true);
    }
    return Value(false);
  }
  absl::StatusOr<bool> hit = one(affix);
  if (!hit.ok()) return hit.status();
  return Value(*hit);
}

absl::StatusOr<std::string> Replace(const std::string& s, const std::string& from,
                                    const std::string& to, int64_t count) {
  if (from.empty()) return s;
  size_t matches = 0;
  for (size_t at = s.find(from);
       at != std::string::npos && (count < 0 || matches < static_cast<size_t>(count));
       at = s.find(from, at + from.size())) {
    ++matches;
  }
  if (to.size() > from.size() &&
      static_cast<double>(matches) * static_cast<double>(to.size() - from.size()) +
              static_cast<double>(s.size()) >
          static_cast<double>(kMaxOutputBytes)) {
    return Bad("replace: the result would pass the template's bounds");
  }
  std::string out;
  size_t start = 0;
  size_t at;
  int64_t done = 0;
  while ((count < 0 || done < count) && (at = s.find(from, start)) != std::string::npos) {
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string Capitalize(const std::string& s) {
  std::string out = absl::AsciiStrToLower(s);
  if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    if (absl::ascii_isalpha(c)) {
      c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
      start = false;
    } else {
      start = true;
    }
  }
  return out;
}

// Python's < for sorting: numbers, strings, lists of them.
absl::StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  return Bad(absl::StrCat("cannot order ", a.TypeName(), " and ", b.TypeName()));
}

// `attribute` of an item: "a.b" walks nested dicts; an integer indexes a list.
Value Attribute(const Value& item, const Value& attribute) {
  if (attribute.kind() == Value::Kind::kInt && item.is_list()) {
    const int64_t i = attribute.as_int();
    return i >= 0 && i < static_cast<int64_t>(item.as_list().size())
               ? item.as_list()[static_cast<size_t>(i)]
               : Value::Undefined();
  }
  Value v = item;
  for (absl::string_view part : absl::StrSplit(attribute.Str(), '.')) v = v.Get(part);
  return v;
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> Select(const Value& value, const Args& args, bool by_attribute, bool keep) {
  absl::StatusOr<List> items = Iterate(value);
  if (!items.ok()) return items.status();
  const size_t first = by_attribute ? 1 : 0;
  const Value test = Arg(args, first, "");
  Args test_args;
  for (size_t i = first + 1; i < args.positional.size(); ++i) {
    test_args.positional.push_back(args.positional[i]);
  }
  List out;
  for (const Value& item : *items) {
    const Value subject = by_attribute ? Attribute(item, Arg(args, 0, "attribute")) : item;
    bool pass = subject.Truthy();
    if (test.is_string()) {
      absl::StatusOr<bool> t = ApplyTest(test.as_string(), subject, test_args);
      if (!t.ok()) return t.status();
      pass = *t;
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::FromList(std::move(out));
}

absl::StatusOr<Value> Map(const Value& value, const Args& args) {
  absl::StatusOr<List> items = Iterate(value);
  if (!items.ok()) return items.status();
  const Value attribute = Arg(args, 99, "attribute");
  List out;
  for (const Value& item : *items) {
    if (!attribute.is_undefined()) {
      Value v = Attribute(item, attribute);
      if (v.is_undefined()) v = Arg(args, 99, "default", v);
      out.push_back(std::move(v));
      continue;
    }
    const Value filter = Arg(args, 0, "");
    if (!filter.is_string()) return Bad("map needs a filter name or attribute=");
    Args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    absl::StatusOr<Value> v = ApplyFilter(filter.as_string(), item, rest);
    if (!v.ok()) return v.status();
    out.push_back(*std::move(v));
  }
  return Value::FromList(std::move(out));
}

absl::StatusOr<Value> Sort(const Value& value, const Args& args) {
  absl::StatusOr<List> items = Iterate(value);
  if (!items.ok()) return items.status();
  const bool reverse = Arg(args, 0, "reverse", Value(false)).Truthy();
  const Value attribute = Arg(args, 2, "attribute");
  absl::Status error = absl::OkStatus();
  std::stable_sort(items->begin(), items->end(), [&](const Value& a, const Value& b) {
    const Value x = attribute.is_undefined() ? a : Attribute(a, attribute);
    const Value y = attribute.is_undefined() ? b : Attribute(b, attribute);
    absl::StatusOr<bool> less = reverse ? Less(y, x) : Less(x, y);
    if (!less.ok()) {
      error = less.status();
      return false;
    }
    return *less;
  });
  if (!error.ok()) return error;
  return Value::FromList(*std::move(items));
}

absl::StatusOr<Value> ToInt(const Value& v, const Value& fallback) {
  if (v.kind() == Value::Kind::kInt) return v;
  if (v.kind() == Value::Kind::kBool) return Value(int64_t{v.as_bool()});
  if (v.kind() == Value::Kind::kFloat) return Value(static_cast<int64_t>(v.as_double()));
  if (v.is_string()) {
    int64_t i = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v.as_string()), &i)) return Value(i);
    double d = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(v.as_string()), &d)) {
      return Value(static_cast<int64_t>(d));
    }
  }
  return fallback.is_undefined() ? Value(int64_t{0}) : fallback;
}

}  // namespace

absl::StatusOr<List> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return List{};
    case Value::Kind::kList:
      return value.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, v] : value.as_dict()) keys.push_back(Value(k));
      return keys;
    }
    case Value::Kind::kString:
      return Characters(value.as_string());
    default:
      return Bad(absl::StrCat("a ", value.TypeName(), " is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kString:
      return static_cast<int64_t>(Characters(value.as_string()).size());
    case Value::Kind::kList:
      return static_cast<int64_t>(value.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(value.as_dict().size());
    case Value::Kind::kUndefined:
      return 0;
    default:
      return Bad(absl::StrCat("a ", value.TypeName(), " has no length"));
  }
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& value, const Args& args) {
  const auto text = [&] { return value.Str(); };
  if (name == "trim") return Value(Strip(text(), Arg(args, 0, "chars"), true, true));
  if (name == "tojson") {
    const Value indent = Arg(args, 0, "indent");
    absl::StatusOr<std::string> json =
        value.ToJson(indent.kind() == Value::Kind::kInt ? static_cast<int>(indent.as_int()) : -1,
                     Arg(args, 99, "sort_keys", Value(false)).Truthy());
    if (!json.ok()) return json.status();
    return Value(*std::move(json));
  }
  if (name == "length" || name == "count") {
    absl::StatusOr<int64_t> n = Length(value);
    if (!n.ok()) return n.status();
    return Value(*n);
  }
  if (name == "lower") return Value(absl::AsciiStrToLower(text()));
  if (name == "upper") return Value(absl::AsciiStrToUpper(text()));
  if (name == "capitalize") return Value(Capitalize(text()));
  if (name == "title") return Value(Title(text()));
  if (name == "string") return Value(text());
  if (name == "safe") return value;
  if (name == "default" || name == "d") {
    const bool boolean = Arg(args, 1, "boolean", Value(false)).Truthy();
    const bool use_default = value.is_undefined() || (boolean && !value.Truthy());
    return use_default ? Arg(args, 0, "default_value", Value("")) : value;
  }
  if (name == "join") {
    absl::StatusOr<List> items = Iterate(value);
    if (!items.ok()) return items.status();
    const Value attribute = Arg(args, 1, "attribute");
    std::vector<std::string> parts;
    const std::string separator = Arg(args, 0, "d", Value("")).Str();
    double size = 0;
    for (const Value& item : *items) {
      parts.push_back((attribute.is_undefined() ? item : Attribute(item, attribute)).Str());
      size += static_cast<double>(parts.back().size() + separator.size());
    }
    if (size > static_cast<double>(kMaxOutputBytes)) {
      return Bad("join: the result would pass the template's bounds");
    }
    return Value(absl::StrJoin(parts, separator));
  }
  if (name == "first" || name == "last") {
    absl::StatusOr<List> items = Iterate(value);
    if (!items.ok()) return items.status();
    if (items->empty()) return Value::Undefined();
    return name == "first" ? items->front() : items->back();
  }
  if (name == "list") {
    absl::StatusOr<List> items = Iterate(value);
    if (!items.ok()) return items.status();
    return Value::FromList(*std::move(items));
  }
  if (name == "reverse") {
    if (value.is_string()) {
      List chars = Characters(value.as_string());
      std::string s;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) s += it->as_string();
      return Value(std::move(s));
    }
    absl::StatusOr<List> items = Iterate(value);
    if (!items.ok()) return items.status();
    std::reverse(items->begin(), items->end());
    return Value::FromList(*std::move(items));
  }
  if (name == "items" || name == "dictsort") {
    if (!value.is_dict()) {
      if (value.is_undefined()) return Value::FromList({});
      return Bad(absl::StrCat(name, " needs a dict, got a ", value.TypeName()));
    }
    List pairs;
    for (const auto& [k, v] : value.as_dict()) pairs.push_back(Value::FromList({Value(k), v}));
    if (name == "dictsort") {
      std::stable_sort(pairs.begin(), pairs.end(), [](const Value& a, const Value& b) {
        return absl::AsciiStrToLower(a.as_list()[0].as_string()) <
               absl::AsciiStrToLower(b.as_list()[0].as_string());
      });
    }
    return Value::FromList(std::move(pairs));
  }
  if (name == "replace") {
    const Value count = Arg(args, 2, "count");
    absl::StatusOr<std::string> out =
        Replace(text(), Arg(args, 0, "old").Str(), Arg(args, 1, "new").Str(),
                count.kind() == Value::Kind::kInt ? count.as_int() : -1);
    if (!out.ok()) return out.status();
    return Value(*std::move(out));
  }
  if (name == "int") return ToInt(value, Arg(args, 0, "default"));
  if (name == "float") {
    if (value.is_number()) return Value(value.as_double());
    double d = 0;
    if (value.is_string() && absl::SimpleAtod(value.as_string(), &d)) return Value(d);
    return Arg(args, 0, "default", Value(0.0));
  }
  if (name == "abs") {
    if (value.kind() == Value::Kind::kInt) return Value(std::abs(value.as_int()));
    if (value.is_number()) return Value(std::abs(value.as_double()));
    return Bad("abs needs a number");
  }
  if (name == "round") {
    if (!value.is_number()) return Bad("round needs a number");
    const Value precision = Arg(args, 0, "precision", Value(int64_t{0}));
    const double scale = std::pow(10.0, precision.is_number() ? precision.as_double() : 0);
    return Value(std::round(value.as_double() * scale) / scale);
  }
  if (name == "sum") {
    absl::StatusOr<List> items = Iterate(value);
    if (!items.ok()) return items.status();
    bool ints = true;
    int64_t i = 0;
    double d = 0;
    for (const Value& item : *items) {
      if (!item.is_number()) return Bad("sum needs numbers");
      ints = ints && item.kind() == Value::Kind::kInt;
      if (item.kind() == Value::Kind::kInt) i += item.as_int();
      d += item.as_double();
    }
    return ints ? Value(i) : Value(d);
  }
  if (name == "unique") {
    absl::StatusOr<List> items = Iterate(value);
    if (!items.ok()) return items.status();
    List out;
    for (const Value& item : *items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return o.Equals(item); })) {
        out.push_back(item);
      }
    }
    return Value::FromList(std::move(out));
  }
  if (name == "indent") {
    const Value width = Arg(args, 0, "width", Value(int64_t{4}));
    const int64_t spaces = std::clamp<int64_t>(
        width.kind() == Value::Kind::kInt ? width.as_int() : 4, 0, int64_t{1} << 20);
    const std::string pad =
        width.is_string() ? width.as_string() : std::string(static_cast<size_t>(spaces), ' ');
    const bool first = Arg(args, 1, "first", Value(false)).Truthy();
    const bool blank = Arg(args, 2, "blank", Value(false)).Truthy();
    std::vector<std::string> lines = absl::StrSplit(text(), '\n');
    if (static_cast<double>(pad.size()) * static_cast<double>(lines.size()) +
            static_cast<double>(text().size()) >
        static_cast<double>(kMaxOutputBytes)) {
      return Bad("indent: the result would pass the template's bounds");
    }
    for (size_t i = 0; i < lines.size(); ++i) {
      if ((i > 0 || first) && (blank || !lines[i].empty())) lines[i] = pad + lines[i];
    }
    return Value(absl::StrJoin(lines, "\n"));
  }
  if (name == "map") return Map(value, args);
  if (name == "select" || name == "reject") return Select(value, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") {
    return Select(value, args, true, name == "selectattr");
  }
  if (name == "sort") return Sort(value, args);
  return Bad(absl::StrCat("the filter '", name, "' is not supported"));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& value, const Args& args) {
  const Value other = Arg(args, 0, "");
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "string") return value.is_string();
  if (name == "number") return value.is_number();
  if (name == "integer") return value.kind() == Value::Kind::kInt;
  if (name == "float") return value.kind() == Value::Kind::kFloat;
  if (name == "boolean") return value.kind() == Value::Kind::kBool;
  if (name == "true") return value.kind() == Value::Kind::kBool && value.as_bool();
  if (name == "false") return value.kind() == Value::Kind::kBool && !value.as_bool();
  if (name == "mapping") return value.is_dict();
  if (name == "iterable") return value.is_list() || value.is_dict() || value.is_string();
  if (name == "sequence") return value.is_list() || value.is_dict() || value.is_string();
  if (name == "callable") return value.is_function();
  if (name == "lower")
    return value.is_string() && absl::AsciiStrToLower(value.as_string()) == value.as_string();
  if (name == "upper")
    return value.is_string() && absl::AsciiStrToUpper(value.as_string()) == value.as_string();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (value.kind() != Value::Kind::kInt)
      return Bad(absl::StrCat("'", name, "' needs an integer"));
    const int64_t by =
        name == "divisibleby" ? (other.kind() == Value::Kind::kInt ? other.as_int() : 0) : 2;
    if (by == 0) return Bad("divisibleby needs a non-zero integer");
    const bool divisible = value.as_int() % by == 0;
    return name == "odd" ? !divisible : divisible;
  }
  if (name == "eq" || name == "equalto" || name == "==") return value.Equals(other);
  if (name == "ne" || name == "!=") return !value.Equals(other);
  if (name == "sameas") return value.Equals(other) && value.kind() == other.kind();
  if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
    absl::StatusOr<bool> less = Less(value, other);
    if (!less.ok()) return less.status();
    absl::StatusOr<bool> greater = Less(other, value);
    if (!greater.ok()) return greater.status();
    if (name == "lt") return *less;
    if (name == "gt") return *greater;
    if (name == "le") return !*greater;
    return !*less;
  }
  if (name == "in") {
    if (other.is_string()) {
      if (!value.is_string()) return Bad("'in <string>' needs a string on the left");
      return other.as_string().find(value.as_string()) != std::string::npos;
    }
    if (other.is_dict()) return value.is_string() && !other.Get(value.as_string()).is_undefined();
    if (other.is_list()) {
      return std::any_of(other.as_list().begin(), other.as_list().end(),
                         [&](const Value& item) { return item.Equals(value); });
    }
    if (other.is_undefined() || other.is_none()) return false;
    return Bad(absl::StrCat("'in' needs a string, list or dict, got a ", other.TypeName()));
  }
  return Bad(absl::StrCat("the test '", name, "' is not supported"));
}

Value Method(const Value& self, absl::string_view name) {
  const auto bind = [](auto f) { return Value::FromFunction(std::move(f)); };
  if (self.is_string()) {
    const std::string s = self.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool left = name != "rstrip";
      const bool right = name != "lstrip";
      return bind([s, left, right](const Args& a) -> absl::StatusOr<Value> {
        return Value(Strip(s, Arg(a, 0, "chars"), left, right));
      });
    }
    if (name == "split" || name == "rsplit") {
      const bool from_right = name == "rsplit";
      return bind([s, from_right](const Args& a) -> absl::StatusOr<Value> {
        return Split(s, Arg(a, 0, "sep"), Arg(a, 1, "maxsplit"), from_right);
      });
    }
    if (name == "startswith" || name == "endswith") {
      const bool prefix = name == "startswith";
      return bind([s, prefix](const Args& a) { return Affix(s, Arg(a, 0, "prefix"), prefix); });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      const std::string filter(name);
      return bind([self, filter](const Args&) { return ApplyFilter(filter, self, {}); });
    }
    if (name == "replace") {
      return bind([s](const Args& a) -> absl::StatusOr<Value> {
        const Value count = Arg(a, 2, "count");
        absl::StatusOr<std::string> out =
            Replace(s, Arg(a, 0, "old").Str(), Arg(a, 1, "new").Str(),
                    count.kind() == Value::Kind::kInt ? count.as_int() : -1);
        if (!out.ok()) return out.status();
        return Value(*std::move(out));
      });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return bind([s, find](const Args& a) -> absl::StatusOr<Value> {
        const std::string needle = Arg(a, 0, "sub").Str();
        if (find) {
          const size_t at = s.find(needle);
          return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at));
        }
        if (needle.empty()) return Value(static_cast<int64_t>(Characters(s).size() + 1));
        int64_t n = 0;
        for (size_t at = s.find(needle); at != std::string::npos;
             at = s.find(needle, at + needle.size())) {
          ++n;
        }
        return Value(n);
      });
    }
    if (name == "join") {
      return bind([s](const Args& a) -> absl::StatusOr<Value> {
        absl::StatusOr<List> items = Iterate(Arg(a, 0, "iterable"));
        if (!items.ok()) return items.status();
        std::vector<std::string> parts;
        for (const Value& item : *items) parts.push_back(item.Str());
        return Value(absl::StrJoin(parts, s));
      });
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace") {
      const std::string kind(name);
      return bind([s, kind](const Args&) -> absl::StatusOr<Value> {
        if (s.empty()) return Value(false);
        return Value(std::all_of(s.begin(), s.end(), [&](char c) {
          return kind == "isdigit"   ? absl::ascii_isdigit(c)
                 : kind == "isalpha" ? absl::ascii_isalpha(c)
                                     : absl::ascii_isspace(c);
        }));
      });
    }
  }
  if (self.is_dict() && !self.is_namespace()) {
    if (name == "items") {
      return bind([self](const Args&) { return ApplyFilter("items", self, {}); });
    }
    if (name == "keys" || name == "values") {
      const bool keys = name == "keys";
      return bind([self, keys](const Args&) -> absl::StatusOr<Value> {
        List out;
        for (const auto& [k, v] : self.as_dict()) out.push_back(keys ? Value(k) : v);
        return Value::FromList(std::move(out));
      });
    }
    if (name == "get") {
      return bind([self](const Args& a) -> absl::StatusOr<Value> {
        const Value v = self.Get(Arg(a, 0, "key").Str());
        return v.is_undefined() ? Arg(a, 1, "default", Value::None()) : v;
      });
    }
  }
  return Value::Undefined(std::string(name));
}

Dict Globals() {
  Dict globals;
  globals.emplace_back("raise_exception",
                       Value::FromFunction([](const Args& a) -> absl::StatusOr<Value> {
                         return Bad(Arg(a, 0, "message").Str());
                       }));
  globals.emplace_back("namespace", Value::FromFunction([](const Args& a) -> absl::StatusOr<Value> {
                         Dict d;
                         if (!a.positional.empty() && a.positional[0].is_dict()) {
                           d = a.positional[0].as_dict();
                         }
                         for (const auto& [k, v] : a.keyword) d.emplace_back(k, v);
                         return Value::Namespace(std::move(d));
                       }));
  globals.emplace_back("dict", Value::FromFunction([](const Args& a) -> absl::StatusOr<Value> {
                         Dict d;
                         for (const auto& [k, v] : a.keyword) d.emplace_back(k, v);
                         return Value::FromDict(std::move(d));
                       }));
  globals.emplace_back("range", Value::FromFunction([](const Args& a) -> absl::StatusOr<Value> {
                         int64_t bounds[3] = {0, 0, 1};
                         if (a.positional.empty() || a.positional.size() > 3) {
                           return Bad("range takes 1 to 3 integers");
                         }
                         for (size_t i = 0; i < a.positional.size(); ++i) {
                           if (a.positional[i].kind() != Value::Kind::kInt) {
                             return Bad("range takes integers");
                           }
                         }
                         if (a.positional.size() == 1) {
                           bounds[1] = a.positional[0].as_int();
                         } else {
                           bounds[0] = a.positional[0].as_int();
                           bounds[1] = a.positional[1].as_int();
                           if (a.positional.size() == 3) bounds[2] = a.positional[2].as_int();
                         }
                         if (bounds[2] == 0) return Bad("range step cannot be zero");
                         List out;
                         for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1];
                              i += bounds[2]) {
                           if (out.size() >= 1'000'000) return Bad("range of over 1000000 items");
                           out.push_back(Value(i));
                         }
                         return Value::FromList(std::move(out));
                       }));
  // Hugging Face's: today's date in the server's local time, for templates that print it.
  globals.emplace_back(
      "strftime_now", Value::FromFunction([](const Args& a) -> absl::StatusOr<Value> {
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf), Arg(a, 0, "format").Str().c_str(), &local);
        return Value(std::string(buf, n));
      }));
  return globals;
}

}  // namespace tandem::jinja
