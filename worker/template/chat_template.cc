#include "worker/template/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "worker/template/chat_tools.h"
#include "worker/template/render.h"

namespace tandem {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A special token in tokenizer_config.json: a string, or an object with "content".
std::string TokenText(const nlohmann::json& config, const char* name) {
  const auto it = config.find(name);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromModelDir(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (std::filesystem::exists(config_path)) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, " is not a JSON object"));
    }
  }
  std::string source;
  std::string origin;
  if (std::filesystem::exists(dir + "/chat_template.jinja")) {
    origin = dir + "/chat_template.jinja";
    absl::StatusOr<std::string> text = ReadFile(origin);
    if (!text.ok()) return text.status();
    source = *std::move(text);
  } else if (config.contains("chat_template")) {
    origin = config_path + " chat_template";
    const nlohmann::json& t = config["chat_template"];
    if (t.is_string()) {
      source = t.get<std::string>();
    } else if (t.is_array()) {
      for (const nlohmann::json& named : t) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          source = named["template"].get<std::string>();
        }
      }
      if (source.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": chat_template lists no template named \"default\""));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": chat_template is neither a string nor a list"));
    }
  } else {
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<ChatTemplate>> parsed =
      FromSource(source, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromSource(absl::string_view source,
                                                                       std::string bos_token,
                                                                       std::string eos_token) {
  absl::StatusOr<std::shared_ptr<const jinja::Template>> parsed = jinja::Parse(source);
  if (!parsed.ok()) return parsed.status();
  std::unique_ptr<ChatTemplate> out(new ChatTemplate());
  out->template_ = *std::move(parsed);
  out->tool_call_syntax_ =
      ToolCallSyntaxForTemplate(std::string_view(source.data(), source.size()));
  out->bos_token_ = std::move(bos_token);
  out->eos_token_ = std::move(eos_token);
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Apply(std::span<const ChatTurn> turns,
                                                bool add_generation_prompt,
                                                std::string_view tools) const {
  absl::StatusOr<nlohmann::ordered_json> messages = ChatMessagesJson(turns);
  if (!messages.ok()) return messages.status();
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  if (!tools.empty()) {
    absl::StatusOr<nlohmann::ordered_json> list = ChatToolsJson(tools);
    if (!list.ok()) return list.status();
    extra["tools"] = *std::move(list);
  }
  return Apply(*messages, add_generation_prompt, extra);
}

absl::StatusOr<std::string> ChatTemplate::Apply(const nlohmann::ordered_json& messages,
                                                bool add_generation_prompt,
                                                const nlohmann::ordered_json& extra) const {
  jinja::Dict context;
  context.emplace_back("messages", jinja::Value::FromJson(messages));
  context.emplace_back("add_generation_prompt", jinja::Value(add_generation_prompt));
  context.emplace_back("bos_token", jinja::Value(bos_token_));
  context.emplace_back("eos_token", jinja::Value(eos_token_));
  if (extra.is_object()) {
    for (const auto& [name, value] : extra.items()) {
      context.emplace_back(name, jinja::Value::FromJson(value));
    }
  }
  return jinja::Render(*template_, context);
}

}  // namespace tandem
