#include "worker/sampling/grammar.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "xgrammar/xgrammar.h"

namespace tandem {

class Grammar {
 public:
  Grammar(xgrammar::CompiledGrammar compiled, std::shared_ptr<const std::vector<bool>> special)
      : compiled_(std::move(compiled)), special_(std::move(special)) {}

  const xgrammar::CompiledGrammar& compiled() const { return compiled_; }
  // Ids with no bytes (special tokens, padding): never accepted unless they are stop tokens.
  bool special(int32_t id) const {
    return id < 0 || static_cast<size_t>(id) >= special_->size() || (*special_)[id];
  }
  int vocab_size() const { return static_cast<int>(special_->size()); }

 private:
  xgrammar::CompiledGrammar compiled_;
  std::shared_ptr<const std::vector<bool>> special_;
};

namespace {

// The deepest nesting of objects and arrays in `text`; -1 when it is not JSON.
int JsonDepth(const std::string& text) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return -1;
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> stack = {{&doc, 1}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    deepest = std::max(deepest, depth);
    for (const nlohmann::json& child : *node) stack.push_back({&child, depth + 1});
  }
  return deepest;
}

// xgrammar's error text without its log prefix ("[hh:mm:ss] <source file>:<line>: ").
std::string ErrorText(const std::string& what) {
  if (what.empty() || what[0] != '[') return what;
  for (const char* source : {".cc:", ".h:"}) {
    const size_t at = what.find(source);
    if (at == std::string::npos) continue;
    const size_t colon = what.find(": ", at + std::string(source).size());
    if (colon != std::string::npos) return what.substr(colon + 2);
  }
  return what;
}

// Compiled grammars kept by the compiler's cache, at most.
constexpr int64_t kCacheBytes = int64_t{256} << 20;
// Threads one compilation may use.
constexpr int kCompileThreads = 2;

}  // namespace

struct GrammarCompiler::Impl {
  Impl(const std::vector<std::string>& token_bytes, int vocab_size,
       std::vector<int32_t> stop_tokens)
      : info(token_bytes, xgrammar::VocabType::RAW, vocab_size, std::move(stop_tokens)),
        compiler(info, kCompileThreads, /*cache_enabled=*/true, kCacheBytes) {
    auto flags = std::make_shared<std::vector<bool>>(static_cast<size_t>(vocab_size), true);
    for (size_t id = 0; id < token_bytes.size() && id < flags->size(); ++id) {
      (*flags)[id] = token_bytes[id].empty();
    }
    special = std::move(flags);
  }

  xgrammar::TokenizerInfo info;
  // Not const: compiling fills the cache. xgrammar's compiler is thread-safe.
  mutable xgrammar::GrammarCompiler compiler;
  std::shared_ptr<const std::vector<bool>> special;
};

GrammarCompiler::GrammarCompiler(std::vector<std::string> token_bytes, int vocab_size,
                                 std::vector<int32_t> stop_tokens)
    : impl_(std::make_unique<Impl>(token_bytes, vocab_size, std::move(stop_tokens))) {}

GrammarCompiler::~GrammarCompiler() = default;

absl::StatusOr<std::shared_ptr<const Grammar>> GrammarCompiler::Compile(
    const GrammarSpec& spec) const {
  if (spec.text.size() > kMaxGrammarBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", spec.kind == GrammarSpec::Kind::kJsonSchema ? "JSON schema" : "structural tag",
        " has ", spec.text.size(), " bytes; at most ", kMaxGrammarBytes));
  }
  const char* what =
      spec.kind == GrammarSpec::Kind::kStructuralTag ? "structural tag" : "JSON schema";
  if (spec.kind != GrammarSpec::Kind::kJsonObject) {
    const int depth = JsonDepth(spec.text);
    if (depth < 0) return absl::InvalidArgumentError(absl::StrCat("the ", what, " is not JSON"));
    if (depth > kMaxGrammarDepth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", what, " nests ", depth, " objects and arrays deep; at most ", kMaxGrammarDepth));
    }
  }
  try {
    std::optional<xgrammar::CompiledGrammar> compiled;
    switch (spec.kind) {
      case GrammarSpec::Kind::kJsonObject:
        // Any object: not strict, so properties the schema does not name are allowed.
        compiled =
            impl_->compiler.CompileJSONSchema(R"({"type": "object"})",
                                              /*any_whitespace=*/true, std::nullopt, std::nullopt,
                                              /*strict_mode=*/false, kMaxJsonWhitespace);
        break;
      case GrammarSpec::Kind::kJsonSchema:
        // OpenAI's strict structured outputs: properties the schema does not name are refused
        // unless it allows them (additionalProperties).
        compiled = impl_->compiler.CompileJSONSchema(spec.text, /*any_whitespace=*/true,
                                                     std::nullopt, std::nullopt,
                                                     /*strict_mode=*/true, kMaxJsonWhitespace);
        break;
      case GrammarSpec::Kind::kStructuralTag:
        compiled = impl_->compiler.CompileStructuralTag(spec.text);
        break;
    }
    return std::make_shared<const Grammar>(*std::move(compiled), impl_->special);
  } catch (const std::exception& e) {
    // xgrammar reports what it cannot compile by throwing; its message names the problem.
    return absl::InvalidArgumentError(absl::StrCat(what, " refused: ", ErrorText(e.what())));
  }
}

struct GrammarCursor::Impl {
  Impl(std::shared_ptr<const Grammar> g, std::vector<int32_t> stops)
      : grammar(std::move(g)),
        stop_tokens(std::move(stops)),
        matcher(grammar->compiled(), stop_tokens),
        bitmask(static_cast<size_t>(xgrammar::GetBitmaskSize(grammar->vocab_size()))) {}

  bool stop(int32_t id) const {
    return std::find(stop_tokens.begin(), stop_tokens.end(), id) != stop_tokens.end();
  }
  // Accepts `id` when the grammar allows it; false, the state unchanged, otherwise.
  bool Accept(int32_t id) {
    // The matcher logs a warning for a token it cannot take at all: refuse those here.
    if (matcher.IsTerminated() || (grammar->special(id) && !stop(id))) return false;
    return matcher.AcceptToken(id);
  }

  std::shared_ptr<const Grammar> grammar;
  std::vector<int32_t> stop_tokens;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> path;  // the tokens the matcher has accepted, in order
  std::vector<int32_t> bitmask;
};

GrammarCursor::GrammarCursor(std::shared_ptr<const Grammar> grammar,
                             std::vector<int32_t> stop_tokens)
    : impl_(std::make_unique<Impl>(std::move(grammar), std::move(stop_tokens))) {}

GrammarCursor::~GrammarCursor() = default;
GrammarCursor::GrammarCursor(GrammarCursor&&) noexcept = default;
GrammarCursor& GrammarCursor::operator=(GrammarCursor&&) noexcept = default;

bool GrammarCursor::MoveTo(std::span<const int32_t> first, std::span<const int32_t> then) {
  Impl& s = *impl_;
  const size_t target = first.size() + then.size();
  const auto at = [&](size_t i) { return i < first.size() ? first[i] : then[i - first.size()]; };
  size_t common = 0;
  while (common < s.path.size() && common < target && s.path[common] == at(common)) ++common;
  if (common < s.path.size()) {
    s.matcher.Rollback(static_cast<int>(s.path.size() - common));
    s.path.resize(common);
  }
  for (size_t i = common; i < target; ++i) {
    if (!s.Accept(at(i))) return false;
    s.path.push_back(at(i));
  }
  return true;
}

void GrammarCursor::Mask(std::span<float> row) {
  Impl& s = *impl_;
  if (s.matcher.IsTerminated()) return;
  DLTensor tensor{};
  int64_t shape = static_cast<int64_t>(s.bitmask.size());
  tensor.data = s.bitmask.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = &shape;
  s.matcher.FillNextTokenBitmask(&tensor);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = row.size();
  for (size_t t = 0; t < n; ++t) {
    const size_t word = t / 32;
    const bool allowed =
        word < s.bitmask.size() && ((static_cast<uint32_t>(s.bitmask[word]) >> (t % 32)) & 1u);
    if (!allowed) row[t] = kNegInf;
  }
  // A stop token ends the completion: only where the text so far is a whole match, even for a
  // request's own stop tokens that are ordinary text tokens to the grammar.
  if (!s.matcher.IsCompleted()) {
    for (int32_t id : s.stop_tokens) {
      if (id >= 0 && static_cast<size_t>(id) < n) row[static_cast<size_t>(id)] = kNegInf;
    }
  }
}

bool GrammarCursor::complete() const { return impl_->matcher.IsCompleted(); }

}  // namespace tandem
