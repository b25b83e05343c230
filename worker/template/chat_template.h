// A checkpoint's chat template, rendered as Hugging Face's apply_chat_template renders it: the
// Jinja source from chat_template.jinja, else tokenizer_config.json's "chat_template" (a string,
// or a list of named templates of which "default" is used), with the config's bos_token and
// eos_token, `messages`, `add_generation_prompt` and any extra variables (tools, ...). The
// rendered text carries the special tokens the template writes (BOS included); tokenize it
// without adding any.
//
// Thread-safety: const methods may be called from any thread.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/template/parser.h"
#include "worker/template/tool_call_syntax.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {

class ChatTemplate {
 public:
  // The checkpoint's template; nullptr when it has none. InvalidArgument naming the file for a
  // config or template that does not parse.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromModelDir(const std::string& dir);
  // InvalidArgument for a template outside the supported subset (worker/template/parser.h).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromSource(absl::string_view source,
                                                                  std::string bos_token,
                                                                  std::string eos_token);

  // The prompt for `turns` (worker/template/chat_tools.h: tool calls and answers) with `tools`
  // (a JSON array, "" for none); InvalidArgument for what the template refuses (its
  // raise_exception message), a template error, or tools / tool calls that are no JSON array.
  absl::StatusOr<std::string> Apply(std::span<const ChatTurn> turns,
                                    bool add_generation_prompt = true,
                                    std::string_view tools = "") const;
  // The same over JSON messages (OpenAI's shape) and extra variables (an object: tools, ...).
  // Ordered JSON, so that objects keep their keys' order as Python's dicts do (tojson prints
  // them in that order).
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                                    bool add_generation_prompt,
                                    const nlohmann::ordered_json& extra) const;

  // How the template teaches the model to write tool calls (ToolCallSyntaxForTemplate).
  ToolCallSyntax tool_call_syntax() const { return tool_call_syntax_; }

 private:
  ChatTemplate() = default;

  std::shared_ptr<const jinja::Template> template_;
  ToolCallSyntax tool_call_syntax_ = ToolCallSyntax::kHermes;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace tandem
