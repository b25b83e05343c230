// libFuzzer target for the chat-template interpreter (worker/template): the input is a template.
// When it parses, it is rendered over a fixed conversation (a system prompt, turns, a tool call
// and its result, tools). Parsing and rendering may refuse, never crash, hang or run past the
// renderer's bounds; a rendering that succeeds stays within the output bound.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/template/chat_template.h"
#include "worker/template/render.h"

namespace {

const nlohmann::ordered_json& Messages() {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "What's the weather in Paris? \"quoted\" é ✓"},
    {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\n",
     "tool_calls": [{"type": "function",
                     "function": {"name": "weather", "arguments": {"city": "Paris", "n": 2.5}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
  ])");
  return messages;
}

const nlohmann::ordered_json& Extra() {
  static const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(R"({
    "tools": [{"type": "function", "function": {"name": "weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "enable_thinking": false
  })");
  return extra;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<tandem::ChatTemplate>> chat =
      tandem::ChatTemplate::FromSource(source, "<s>", "</s>");
  if (!chat.ok()) return 0;
  for (bool generation_prompt : {false, true}) {
    absl::StatusOr<std::string> out = (*chat)->Apply(Messages(), generation_prompt, Extra());
    if (out.ok() && out->size() > tandem::jinja::kMaxOutputBytes + (size_t{1} << 20)) {
      std::fprintf(stderr, "chat_template_fuzz: output of %zu bytes passed the bound\n",
                   out->size());
      std::abort();
    }
  }
  return 0;
}
