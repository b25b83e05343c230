// Tool calling on the OpenAI HTTP front: `tools`, `tool_choice` and `parallel_tool_calls` to a
// constrained request, and the model's text back to `tool_calls`.
//
// Calls are written in the Hermes style that Qwen2.5/3 and many other checkpoints use:
//   <tool_call>
//   {"name": "get_weather", "arguments": {"city": "Paris"}}
//   </tool_call>
// and are constrained by a structural tag (xgrammar, worker/sampling/grammar.h): free text until
// "<tool_call>", then the name of a given tool and arguments valid against its parameters
// schema. tool_choice "auto" leaves the choice to the model, "required" asks for at least one
// call (and no text before it), a named function for exactly that one, "none" for no calls
// (no constraint, no parsing). With parallel_tool_calls false, at most one call.
//
// Thread-safety: pure functions; a ToolCallStream belongs to one response stream.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generate.pb.h"

namespace tandem::http {

inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolNameBytes = 64;

// Parses tools / tool_choice / parallel_tool_calls of a chat body into `request`: the tools for
// the chat template (chat.tools) and, unless tool_choice is "none", the structural tag
// (response_format). Returns whether the response is to be parsed for calls. InvalidArgument
// naming the parameter (see http_openai.h's ParamOf) for a malformed tool, a tool_choice naming
// no given tool, or tools together with a response_format.
absl::StatusOr<bool> ParseTools(const nlohmann::json& body, v1::GenerateRequest* request);

struct ToolCall {
  std::string id;  // "call_" and 24 random hex digits
  std::string name;
  std::string arguments;  // a JSON object's text
};

struct ParsedToolCalls {
  std::string content;  // the text outside the calls, trimmed
  std::vector<ToolCall> calls;
};

// The calls in a completion's text; a block that is not a call ({"name": string, "arguments":
// object}) stays in the content.
ParsedToolCalls ParseToolCalls(std::string_view text);

// OpenAI's tool_call object; `index` set: as a stream delta ({"index", "id", "type",
// "function"}).
nlohmann::json ToolCallJson(const ToolCall& call, int index = -1);

// Splits a streamed completion into content deltas and whole calls: text is passed through
// until it may begin a call, which is held until its block closes.
class ToolCallStream {
 public:
  // Deltas for the next piece of text, in order: {"content": text} or {"tool_calls": [call]}.
  std::vector<nlohmann::json> Push(std::string_view text);
  // What is still held (a block that never closed comes out as content).
  std::vector<nlohmann::json> Finish();
  // Whether a call was emitted (finish_reason "tool_calls").
  bool called() const { return calls_ > 0; }

 private:
  std::vector<nlohmann::json> Drain(bool final);

  std::string held_;
  int calls_ = 0;
};

}  // namespace tandem::http
