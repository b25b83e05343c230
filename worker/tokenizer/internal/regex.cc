#include "worker/tokenizer/internal/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace tandem::tokenizer_internal {
namespace {

pcre2_code* Code(void* code) { return static_cast<pcre2_code*>(code); }

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

}  // namespace

std::string WithOnigurumaWhitespace(std::string_view pattern) {
  // Oniguruma's \s: U+0009-U+000D, U+0085 and the Z categories. PCRE2's (UCP) also has U+180E.
  constexpr std::string_view kSpaceItems = "\\t-\\r\\x{85}\\p{Z}";
  std::string out;
  out.reserve(pattern.size());
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        if (in_class) {
          out.append(kSpaceItems);
        } else {
          out.append("[").append(kSpaceItems).append("]");
        }
      } else if (next == 'S' && !in_class) {
        out.append("[^").append(kSpaceItems).append("]");
      } else {
        // \S inside a class has no such spelling and is kept as PCRE2's.
        out.push_back(c);
        out.push_back(next);
      }
      continue;
    }
    out.push_back(c);
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // POSIX class such as [:alpha:]: copied through its closing ":]".
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i + 1, close + 2 - (i + 1)));
        i = close + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal) {
  // PCRE2 refuses UCP together with LITERAL; a literal needs no character classes anyway.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  const std::string compiled = literal ? std::string(pattern) : WithOnigurumaWhitespace(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot compile regex '", absl::string_view(pattern.data(), pattern.size()),
                     "' at offset ", error_offset, ": ", Pcre2Error(error_code)));
  }
  std::unique_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  // JIT is an optimisation only: without it (unsupported CPU, build without JIT) the
  // interpreter gives the same matches.
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

Regex::~Regex() { pcre2_code_free(Code(code_)); }

Regex::Matcher::Matcher(const Regex& regex)
    : regex_(regex),
      match_data_(pcre2_match_data_create_from_pattern(Code(regex.code_), nullptr)) {}

Regex::Matcher::~Matcher() { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data_)); }

absl::Status Regex::Matcher::SplitIsolated(std::string_view text,
                                           std::vector<std::string_view>* pieces) {
  auto* match_data = static_cast<pcre2_match_data*>(match_data_);
  if (match_data == nullptr) return absl::ResourceExhaustedError("cannot allocate regex state");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  size_t gap_start = 0;  // end of the previous match
  bool have_previous = false;
  while (search_from <= text.size()) {
    // Input was validated as UTF-8 by the caller, so PCRE2's own check is skipped.
    int rc = -1;
    if (regex_.jit_) {
      rc = pcre2_jit_match(Code(regex_.code_), subject, text.size(), search_from,
                           PCRE2_NO_UTF_CHECK, match_data, nullptr);
    }
    if (!regex_.jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH)) {
      // The interpreter keeps its backtracking state on the heap, so it is the fallback when
      // the JIT stack runs out on a pathological input.
      rc = pcre2_match(Code(regex_.code_), subject, text.size(), search_from, PCRE2_NO_UTF_CHECK,
                       match_data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("pre-tokenizer regex '", regex_.pattern_, "' failed: ", Pcre2Error(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start == end && have_previous && end == gap_start) {
      if (search_from >= text.size()) break;
      search_from += Utf8Length(static_cast<unsigned char>(text[search_from]));
      continue;
    }
    if (start > gap_start) pieces->push_back(text.substr(gap_start, start - gap_start));
    if (end > start) pieces->push_back(text.substr(start, end - start));
    gap_start = end;
    have_previous = true;
    search_from = end;
  }
  if (gap_start < text.size()) pieces->push_back(text.substr(gap_start));
  return absl::OkStatus();
}

}  // namespace tandem::tokenizer_internal
