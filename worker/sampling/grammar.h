// Structured output: OpenAI's response_format (json_object, json_schema) and tool calls,
// constrained by xgrammar's grammar engine (docs/ARCHITECTURE.md, "Structured output", says why
// xgrammar). A request's constraint is compiled once against the model's vocabulary; each
// sequence then keeps a GrammarCursor, which masks a logit row to the tokens the grammar allows
// after the row's context. The cursor moves between contexts by rolling back and accepting
// tokens, so the rows of a verify pass (the sequence, then drafts on a path) cost one accepted
// token each, not a replay of the completion.
//
// Thread-safety: GrammarCompiler is thread-safe; a Grammar is immutable and shared; a
// GrammarCursor belongs to one sequence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem {

// Largest schema or structural tag a request may carry, in bytes.
inline constexpr size_t kMaxGrammarBytes = 64 * 1024;
// Deepest nesting of objects and arrays in a schema or structural tag document. Compiling grows
// faster than linearly with nesting: 128 nested array schemas compile in 0.1 s on the bundled
// vocabulary, 1500 (37 KB) took 140 s.
inline constexpr int kMaxGrammarDepth = 128;
// Longest run of whitespace between JSON tokens (room for a newline and indentation): a model
// cannot fill its budget with blanks, a known failure of unconstrained whitespace in JSON modes.
inline constexpr int kMaxJsonWhitespace = 32;

struct GrammarSpec {
  enum class Kind {
    kJsonObject,     // any JSON object (OpenAI's json_object); `text` unused
    kJsonSchema,     // a JSON Schema (OpenAI's json_schema); `text` is the schema
    kStructuralTag,  // an xgrammar structural tag (tool calls); `text` is its JSON
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
};

// The response_format type of a kind ("json_object", "json_schema", "structural_tag"), and the
// kind of a type name (InvalidArgument naming it for another). Inline: the request checks use
// them in builds without the grammar engine.
inline const char* GrammarTypeName(GrammarSpec::Kind kind) {
  switch (kind) {
    case GrammarSpec::Kind::kJsonObject:
      return "json_object";
    case GrammarSpec::Kind::kJsonSchema:
      return "json_schema";
    case GrammarSpec::Kind::kStructuralTag:
      return "structural_tag";
  }
  return "";
}

inline absl::StatusOr<GrammarSpec::Kind> GrammarKindOf(const std::string& type) {
  for (GrammarSpec::Kind kind : {GrammarSpec::Kind::kJsonObject, GrammarSpec::Kind::kJsonSchema,
                                 GrammarSpec::Kind::kStructuralTag}) {
    if (type == GrammarTypeName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("response_format type '", type,
                   "' is not supported (text, json_object, json_schema or structural_tag)"));
}

// A compiled constraint; opaque outside grammar.cc.
class Grammar;

class GrammarCompiler {
 public:
  // `token_bytes`: each token id's bytes; empty for special tokens and padding ids, which the
  // grammar never allows except as stop tokens. `vocab_size`: the logit row's length.
  // `stop_tokens`: the model's end-of-sequence tokens.
  GrammarCompiler(std::vector<std::string> token_bytes, int vocab_size,
                  std::vector<int32_t> stop_tokens);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // InvalidArgument naming what is wrong for a spec over kMaxGrammarBytes or kMaxGrammarDepth,
  // or one the engine refuses (not JSON, an unsupported schema feature). Compiled grammars are
  // cached by spec.
  absl::StatusOr<std::shared_ptr<const Grammar>> Compile(const GrammarSpec& spec) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Where a sequence stands in its grammar.
class GrammarCursor {
 public:
  // `stop_tokens`: the sequence's stop tokens, allowed only where the grammar is complete.
  GrammarCursor(std::shared_ptr<const Grammar> grammar, std::vector<int32_t> stop_tokens);
  ~GrammarCursor();
  GrammarCursor(GrammarCursor&&) noexcept;
  GrammarCursor& operator=(GrammarCursor&&) noexcept;

  // Moves to the state after the generated tokens `first` then `then`. False when the grammar
  // refuses one of them (a rejected draft's path); the state is then that after the longest
  // accepted prefix, and Mask must not be called.
  bool MoveTo(std::span<const int32_t> first, std::span<const int32_t> then);
  // Sets to -inf each logit of `row` that the grammar does not allow next.
  void Mask(std::span<float> row);
  // Whether the text so far is a whole match (a stop token may end it here).
  bool complete() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
