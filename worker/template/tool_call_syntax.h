// How a checkpoint writes tool calls, as its chat template teaches it (the conventions vLLM's
// and SGLang's tool parsers read):
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//                (Qwen2.5/3, Hermes and many others; the ChatML fallback's tool prompt)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}]
//   llama3_json  {"name": "f", "parameters": {...}}, calls separated by "; " (Llama 3.1-3.3)
// The verifier names its checkpoint's syntax (WorkerInfo.tool_call_syntax); the router's HTTP
// front constrains and parses calls in it (services/router/http_tools.h).
//
// Header-only: the router reads the names without linking the template engine.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem {

enum class ToolCallSyntax { kHermes, kMistral, kLlama3Json };

inline constexpr std::array<ToolCallSyntax, 3> kToolCallSyntaxes = {
    ToolCallSyntax::kHermes, ToolCallSyntax::kMistral, ToolCallSyntax::kLlama3Json};

inline const char* ToolCallSyntaxName(ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kHermes:
      return "hermes";
    case ToolCallSyntax::kMistral:
      return "mistral";
    case ToolCallSyntax::kLlama3Json:
      return "llama3_json";
  }
  return "";
}

// The syntax of a name ToolCallSyntaxName gives; "" is hermes (a worker that names none).
// InvalidArgument listing the names otherwise.
inline absl::StatusOr<ToolCallSyntax> ToolCallSyntaxOf(std::string_view name) {
  if (name.empty()) return ToolCallSyntax::kHermes;
  for (ToolCallSyntax syntax : kToolCallSyntaxes) {
    if (name == ToolCallSyntaxName(syntax)) return syntax;
  }
  return absl::InvalidArgumentError(absl::StrCat("tool call syntax '", std::string(name),
                                                 "' is not hermes, mistral or llama3_json"));
}

// The syntax a chat template's Jinja source teaches: the Mistral control string, the Hermes
// tag, or Llama 3's JSON calls with "parameters"; Hermes for a template that shows none (and
// for a checkpoint without a template, whose ChatML prompt lists tools the Hermes way).
inline ToolCallSyntax ToolCallSyntaxForTemplate(std::string_view source) {
  if (source.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallSyntax::kMistral;
  if (source.find("<tool_call>") != std::string_view::npos) return ToolCallSyntax::kHermes;
  if (source.find("\"parameters\": ") != std::string_view::npos ||
      source.find("<|python_tag|>") != std::string_view::npos) {
    return ToolCallSyntax::kLlama3Json;
  }
  return ToolCallSyntax::kHermes;
}

}  // namespace tandem
