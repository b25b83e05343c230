// Tool calling on the OpenAI HTTP front: `tools`, `tool_choice` and `parallel_tool_calls` to a
// constrained request, and the model's text back to `tool_calls`.
//
// Calls are written in the syntax of the serving checkpoint (worker/template/tool_call_syntax.h:
// Hermes, Mistral or Llama 3 JSON, as the verifier reports it) and are constrained by a
// structural tag (xgrammar, worker/sampling/grammar.h): free text until the syntax's trigger
// ("<tool_call>", "[TOOL_CALLS]", '{"name": '), then the name of a given tool and arguments
// valid against its parameters schema. tool_choice "auto" leaves the choice to the model,
// "required" asks for at least one call (and no text before it), a named function for exactly
// that one, "none" for no calls (no constraint, no parsing). With parallel_tool_calls false, at
// most one call. Parsing reads what the constraint writes and what the checkpoints write
// unconstrained: several calls in one Mistral list, Llama calls separated by ";", "arguments"
// or "parameters".
//
// Thread-safety: pure functions; a ToolCallStream belongs to one response stream.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generate.pb.h"
#include "worker/template/tool_call_syntax.h"

namespace tandem::http {

inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolNameBytes = 64;

// The calls a chat request allows, checked.
struct ToolRequest {
  std::vector<std::pair<std::string, nlohmann::json>> tools;  // name, parameters schema
  std::string choice;                                         // "auto", "required" or "function"
  std::string named;                                          // choice "function": its name
  bool parallel = true;
};

// Parses tools / tool_choice / parallel_tool_calls of a chat body: the tools go to the chat
// template (request->chat.tools). Returns the calls to constrain and parse for, none when there
// are no tools or tool_choice is "none". InvalidArgument naming the parameter (see
// http_openai.h's ParamOf) for a malformed tool, a tool_choice naming no given tool, or tools
// together with a response_format.
absl::StatusOr<std::optional<ToolRequest>> ParseTools(const nlohmann::json& body,
                                                      v1::GenerateRequest* request);

// Constrains `request` to calls of `tools` written in `syntax` (response_format
// structural_tag). InvalidArgument naming "tools" when the grammar exceeds kMaxGrammarBytes.
absl::Status ConstrainToTools(const ToolRequest& tools, ToolCallSyntax syntax,
                              v1::GenerateRequest* request);

struct ToolCall {
  std::string id;  // "call_" and 24 random hex digits
  std::string name;
  std::string arguments;  // a JSON object's text
};

struct ParsedToolCalls {
  std::string content;  // the text outside the calls, trimmed
  std::vector<ToolCall> calls;
};

// The calls in a completion's text written in `syntax`; a block that is not a call ({"name":
// string, "arguments" or "parameters": object}) stays in the content, and blank text (or a
// Llama ";") after a call is dropped.
ParsedToolCalls ParseToolCalls(std::string_view text, ToolCallSyntax syntax);

// OpenAI's tool_call object; `index` set: as a stream delta ({"index", "id", "type",
// "function"}).
nlohmann::json ToolCallJson(const ToolCall& call, int index = -1);

// Splits a streamed completion into content deltas and whole calls: text is passed through
// until it may begin a call, which is held until its block closes.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallSyntax syntax = ToolCallSyntax::kHermes) : syntax_(syntax) {}

  // Deltas for the next piece of text, in order: {"content": text} or {"tool_calls": [call]}.
  std::vector<nlohmann::json> Push(std::string_view text);
  // What is still held (a block that never closed comes out as content).
  std::vector<nlohmann::json> Finish();
  // Whether a call was emitted (finish_reason "tool_calls").
  bool called() const { return calls_ > 0; }

 private:
  // One piece of the text: content, or the calls of one block.
  struct Piece {
    std::string content;
    std::vector<ToolCall> calls;
  };
  friend ParsedToolCalls ParseToolCalls(std::string_view text, ToolCallSyntax syntax);

  std::vector<Piece> Drain(bool final);
  // `index`: the first call's (the calls emitted before these pieces).
  static std::vector<nlohmann::json> Deltas(std::vector<Piece> pieces, int index);

  ToolCallSyntax syntax_;
  std::string held_;
  int calls_ = 0;  // calls parsed so far: the next call delta's index
};

}  // namespace tandem::http
