#include "worker/template/chat_tools.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<ordered_json> ParseArray(std::string_view text, const char* what) {
  ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a JSON array"));
  }
  return parsed;
}

// A call as the Hermes block's JSON: {"name", "arguments"} with the arguments as an object when
// they parse as one (OpenAI sends them as a JSON string).
ordered_json HermesCall(const ordered_json& call) {
  const ordered_json* function = &call;
  if (call.is_object() && call.contains("function") && call["function"].is_object()) {
    function = &call["function"];
  }
  ordered_json out = ordered_json::object();
  out["name"] = function->value("name", "");
  ordered_json arguments =
      function->contains("arguments") ? (*function)["arguments"] : ordered_json::object();
  if (arguments.is_string()) {
    ordered_json parsed =
        ordered_json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) arguments = std::move(parsed);
  }
  out["arguments"] = std::move(arguments);
  return out;
}

}  // namespace

absl::StatusOr<ordered_json> ChatMessagesJson(std::span<const ChatTurn> turns) {
  ordered_json messages = ordered_json::array();
  for (const ChatTurn& turn : turns) {
    ordered_json message = {{"role", turn.role}, {"content", turn.content}};
    if (!turn.tool_calls.empty()) {
      absl::StatusOr<ordered_json> calls = ParseArray(turn.tool_calls, "a message's tool_calls");
      if (!calls.ok()) return calls.status();
      message["tool_calls"] = *std::move(calls);
    }
    if (!turn.tool_call_id.empty()) message["tool_call_id"] = turn.tool_call_id;
    messages.push_back(std::move(message));
  }
  return messages;
}

absl::StatusOr<ordered_json> ChatToolsJson(std::string_view tools) {
  return ParseArray(tools, "tools");
}

absl::StatusOr<std::string> ApplyChatMlWithTools(std::span<const ChatTurn> turns,
                                                 std::string_view tools,
                                                 bool add_generation_prompt) {
  std::vector<ChatTurn> out;
  size_t first = 0;
  if (!tools.empty()) {
    absl::StatusOr<ordered_json> list = ChatToolsJson(tools);
    if (!list.ok()) return list.status();
    std::string listing =
        "You can call functions to help with the request. Their signatures, one JSON object per "
        "line:\n<tools>\n";
    for (const ordered_json& tool : *list) absl::StrAppend(&listing, tool.dump(), "\n");
    absl::StrAppend(&listing,
                    "</tools>\nTo call one, write a JSON object with its name and arguments "
                    "between tags:\n<tool_call>\n{\"name\": <function name>, \"arguments\": "
                    "<arguments object>}\n</tool_call>");
    if (!turns.empty() && turns[0].role == "system") {
      out.push_back({"system", absl::StrCat(turns[0].content, "\n\n", listing)});
      first = 1;
    } else {
      out.push_back({"system", listing});
    }
  }
  for (size_t i = first; i < turns.size(); ++i) {
    ChatTurn turn = turns[i];
    if (!turn.tool_calls.empty()) {
      absl::StatusOr<ordered_json> calls = ParseArray(turn.tool_calls, "a message's tool_calls");
      if (!calls.ok()) return calls.status();
      for (const ordered_json& call : *calls) {
        absl::StrAppend(&turn.content, turn.content.empty() ? "" : "\n", "<tool_call>\n",
                        HermesCall(call).dump(), "\n</tool_call>");
      }
    }
    if (turn.role == "tool") {
      turn.content = absl::StrCat("<tool_response>\n", turn.content, "\n</tool_response>");
    }
    out.push_back({turn.role, turn.content});
  }
  return ApplyChatMl(out, add_generation_prompt);
}

}  // namespace tandem
