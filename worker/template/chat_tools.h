// Tool calling in chat prompts: OpenAI-shaped messages for a chat template (assistant turns'
// tool_calls, tool turns' tool_call_id) and the `tools` variable, and the prompt for a checkpoint
// without a template: ChatML with the tools listed in a system turn and calls written in the
// Hermes style that the HTTP front constrains and parses (<tool_call>{"name", "arguments"}
// </tool_call>).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {

// The turns as OpenAI's messages: {"role", "content"} plus "tool_calls" (parsed) for an
// assistant's calls and "tool_call_id" for a tool's answer. InvalidArgument for tool_calls that
// are not a JSON array.
absl::StatusOr<nlohmann::ordered_json> ChatMessagesJson(std::span<const ChatTurn> turns);

// The tools JSON array; InvalidArgument when `tools` is not one.
absl::StatusOr<nlohmann::ordered_json> ChatToolsJson(std::string_view tools);

// ChatML (ApplyChatMl) with tools: a system turn lists them (merged into the conversation's own
// system turn when it starts with one; none when `tools` is empty), an assistant's calls follow
// its content as <tool_call> blocks, a tool's answer is a "tool" turn inside <tool_response>.
// Turns with none of these render as ApplyChatMl renders them.
absl::StatusOr<std::string> ApplyChatMlWithTools(std::span<const ChatTurn> turns,
                                                 std::string_view tools,
                                                 bool add_generation_prompt = true);

}  // namespace tandem
