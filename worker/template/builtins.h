// The filters, tests, methods and globals chat templates use, as Jinja2 (and Python, for the
// methods of strings and dicts) define them. Internal to worker/template/render.cc.
//
// Filters: abs, capitalize, count, d/default, dictsort, first, float, indent, int, items, join,
// last, length, list, lower, map, reject, rejectattr, replace, reverse, round, safe, select,
// selectattr, sort, string, sum, title, tojson (Hugging Face's: indent, sort_keys), trim, unique,
// upper. Tests: boolean, callable, defined, divisibleby, eq/equalto/==, even, false, float,
// ge, gt, in, integer, iterable, le, lower, lt, mapping, ne, none, number, odd, sameas,
// sequence, string, true, undefined, upper. Methods: str.strip/lstrip/rstrip/split/rsplit/
// startswith/endswith/upper/lower/title/capitalize/replace/find/count/join/isdigit/isalpha/
// isspace, dict.items/keys/values/get.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/template/value.h"

namespace tandem::jinja {

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& value, const Args& args);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& value, const Args& args);

// `self.name` as a bound method, or undefined when `self` has no such method.
Value Method(const Value& self, absl::string_view name);

// raise_exception, namespace, range, dict, strftime_now.
Dict Globals();

// The items a for loop walks: a list's items, a dict's keys, a string's characters (bytes of
// UTF-8 characters together); nothing for undefined or none. InvalidArgument otherwise.
absl::StatusOr<List> Iterate(const Value& value);

// Python's len(): strings in characters. InvalidArgument for what has no length.
absl::StatusOr<int64_t> Length(const Value& value);

}  // namespace tandem::jinja
