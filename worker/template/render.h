// Rendering a parsed template (worker/template/parser.h) as Hugging Face renders chat
// templates with Jinja2: no autoescaping, undefined names print nothing and are false, the
// globals raise_exception, namespace, range, dict and strftime_now, and `tojson` as
// json.dumps(ensure_ascii=False). The filters, tests and methods are those of
// worker/template/builtins.h. Lists and dicts are immutable, as in Hugging Face's sandbox.
//
// Bounded: the output (kMaxOutputBytes), loop iterations (kMaxIterations) and macro recursion
// (kMaxCallDepth); a template that passes one fails with InvalidArgument.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/template/parser.h"
#include "worker/template/value.h"

namespace tandem::jinja {

inline constexpr size_t kMaxOutputBytes = size_t{64} << 20;
inline constexpr int64_t kMaxIterations = 1'000'000;
inline constexpr int kMaxCallDepth = 64;

// Renders `tmpl` with the variables of `context` (over the globals). InvalidArgument for a
// template error (naming the line), or the template's own raise_exception message.
absl::StatusOr<std::string> Render(const Template& tmpl, const Dict& context);

}  // namespace tandem::jinja
