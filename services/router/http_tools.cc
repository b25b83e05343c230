#include "services/router/http_tools.h"

#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/router/http_openai.h"
#include "worker/sampling/grammar.h"

namespace tandem::http {
namespace {

using nlohmann::json;

constexpr char kOpenTag[] = "<tool_call>";
constexpr char kCloseTag[] = "</tool_call>";
constexpr std::string_view kOpen = kOpenTag;
constexpr std::string_view kClose = kCloseTag;

bool IsBlank(std::string_view text) {
  return absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())).empty();
}

bool IsToolName(const std::string& name) {
  if (name.empty() || name.size() > kMaxToolNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// A tool's name and parameters schema; InvalidArgument naming tools[i] otherwise.
absl::StatusOr<std::pair<std::string, json>> ParseTool(const json& tool, size_t i) {
  const std::string param = absl::StrCat("tools[", i, "]");
  if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
      !tool["function"].is_object()) {
    return BadParam(param, param + " must be {\"type\": \"function\", \"function\": {...}}");
  }
  const json& function = tool["function"];
  if (!function.contains("name") || !function["name"].is_string() ||
      !IsToolName(function["name"].get<std::string>())) {
    return BadParam(param + ".function.name",
                    absl::StrCat(param, ".function.name must be 1 to ", kMaxToolNameBytes,
                                 " letters, digits, '_' or '-'"));
  }
  json parameters = json{{"type", "object"}};
  if (function.contains("parameters") && !function["parameters"].is_null()) {
    if (!function["parameters"].is_object()) {
      return BadParam(param + ".function.parameters",
                      param + ".function.parameters must be a JSON Schema object");
    }
    parameters = function["parameters"];
  }
  return std::pair{function["name"].get<std::string>(), std::move(parameters)};
}

// One call's tag in the structural tag: the Hermes block with the arguments constrained.
json CallTag(const std::string& name, const json& parameters) {
  return json{
      {"type", "tag"},
      {"begin", absl::StrCat(kOpenTag, "\n{\"name\": ", json(name).dump(), ", \"arguments\": ")},
      {"content", {{"type", "json_schema"}, {"json_schema", parameters}}},
      {"end", absl::StrCat("}\n", kCloseTag)}};
}

std::string NewCallId() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[random() % 16];
  return id;
}

// The call a block's body holds, if it is one.
std::optional<ToolCall> CallFromBody(std::string_view body) {
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("name") ||
      !parsed["name"].is_string() || !parsed.contains("arguments") ||
      !parsed["arguments"].is_object()) {
    return std::nullopt;
  }
  return ToolCall{.id = NewCallId(),
                  .name = parsed["name"].get<std::string>(),
                  .arguments = parsed["arguments"].dump()};
}

// The length of the longest end of `text` that begins kOpen (a call that may be starting).
size_t PartialOpen(std::string_view text) {
  for (size_t k = std::min(text.size(), kOpen.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == kOpen.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace

absl::StatusOr<bool> ParseTools(const json& body, v1::GenerateRequest* request) {
  std::vector<std::pair<std::string, json>> tools;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return BadParam("tools", "tools must be a list");
    if (it->size() > kMaxTools) {
      return BadParam("tools",
                      absl::StrCat("tools has ", it->size(), " entries; at most ", kMaxTools));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      absl::StatusOr<std::pair<std::string, json>> tool = ParseTool((*it)[i], i);
      if (!tool.ok()) return tool.status();
      for (const auto& [name, unused] : tools) {
        if (name == tool->first) {
          return BadParam("tools", absl::StrCat("tools names '", name, "' twice"));
        }
      }
      tools.push_back(*std::move(tool));
    }
  }
  // tool_choice: "none", "auto" (the default with tools), "required", or a named function.
  std::string choice = tools.empty() ? "none" : "auto";
  std::string named;
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      choice = it->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required") {
        return BadParam("tool_choice", absl::StrCat("tool_choice '", choice,
                                                    "' is not none, auto, required or a "
                                                    "function"));
      }
    } else if (it->is_object() && it->value("type", "") == "function" && it->contains("function") &&
               (*it)["function"].is_object() && (*it)["function"].contains("name") &&
               (*it)["function"]["name"].is_string()) {
      choice = "function";
      named = (*it)["function"]["name"].get<std::string>();
    } else {
      return BadParam("tool_choice",
                      "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
                      "\"function\", \"function\": {\"name\": ...}}");
    }
  }
  bool parallel = true;
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return BadParam("parallel_tool_calls", "parallel_tool_calls must be true or false");
    }
    parallel = it->get<bool>();
  }
  if (tools.empty()) {
    if (choice == "required" || choice == "function") {
      return BadParam("tool_choice", "tool_choice asks for a call, but there are no tools");
    }
    return false;
  }
  json listed = json::array();
  for (const json& tool : body["tools"]) listed.push_back(tool);
  request->mutable_chat()->set_tools(Dump(listed));
  if (choice == "none") return false;

  if (request->has_response_format() && !request->response_format().type().empty() &&
      request->response_format().type() != "text") {
    return BadParam("response_format",
                    "response_format cannot be combined with tools (both constrain the output); "
                    "set tool_choice \"none\" to use it");
  }
  json tags = json::array();
  for (const auto& [name, parameters] : tools) {
    if (choice != "function" || name == named) tags.push_back(CallTag(name, parameters));
  }
  if (tags.empty()) {
    return BadParam("tool_choice",
                    absl::StrCat("tool_choice names '", named, "', which is not among the tools"));
  }
  json format;
  if (choice == "auto") {
    format = {{"type", "triggered_tags"},
              {"triggers", json::array({kOpenTag})},
              {"tags", std::move(tags)},
              {"at_least_one", false},
              {"stop_after_first", !parallel}};
  } else {  // required or a named function: calls and nothing else
    format = {{"type", "tags_with_separator"},
              {"tags", std::move(tags)},
              {"separator", "\n"},
              {"at_least_one", true},
              {"stop_after_first", !parallel || choice == "function"}};
  }
  const std::string tag = Dump(json{{"type", "structural_tag"}, {"format", std::move(format)}});
  if (tag.size() > kMaxGrammarBytes) {
    return BadParam("tools", absl::StrCat("the tools' schemas take ", tag.size(),
                                          " bytes as a grammar; at most ", kMaxGrammarBytes));
  }
  request->mutable_response_format()->set_type("structural_tag");
  request->mutable_response_format()->set_schema(tag);
  return true;
}

ParsedToolCalls ParseToolCalls(std::string_view text) {
  ParsedToolCalls parsed;
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string_view::npos) break;
    const size_t close = text.find(kClose, open + kOpen.size());
    if (close == std::string_view::npos) break;
    std::optional<ToolCall> call =
        CallFromBody(text.substr(open + kOpen.size(), close - open - kOpen.size()));
    const size_t end = close + kClose.size();
    if (call.has_value()) {
      content.append(text.substr(at, open - at));
      parsed.calls.push_back(*std::move(call));
    } else {
      content.append(text.substr(at, end - at));
    }
    at = end;
  }
  content.append(text.substr(std::min(at, text.size())));
  parsed.content = std::string(absl::StripAsciiWhitespace(content));
  return parsed;
}

json ToolCallJson(const ToolCall& call, int index) {
  json out = {{"id", call.id},
              {"type", "function"},
              {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
  if (index >= 0) out["index"] = index;
  return out;
}

std::vector<json> ToolCallStream::Push(std::string_view text) {
  held_.append(text);
  return Drain(/*final=*/false);
}

std::vector<json> ToolCallStream::Finish() { return Drain(/*final=*/true); }

std::vector<json> ToolCallStream::Drain(bool final) {
  std::vector<json> deltas;
  const auto content = [&](std::string_view piece) {
    // Whitespace between calls is no content.
    if (piece.empty() || (calls_ > 0 && IsBlank(piece))) return;
    deltas.push_back({{"content", std::string(piece)}});
  };
  while (true) {
    const size_t open = held_.find(kOpen);
    if (open == std::string::npos) {
      const size_t keep = final ? 0 : PartialOpen(held_);
      content(std::string_view(held_).substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      return deltas;
    }
    content(std::string_view(held_).substr(0, open));
    held_.erase(0, open);
    const size_t close = held_.find(kClose, kOpen.size());
    if (close == std::string::npos) {
      if (final) {
        content(held_);
        held_.clear();
      }
      return deltas;
    }
    const size_t end = close + kClose.size();
    std::optional<ToolCall> call =
        CallFromBody(std::string_view(held_).substr(kOpen.size(), close - kOpen.size()));
    if (call.has_value()) {
      deltas.push_back({{"tool_calls", json::array({ToolCallJson(*call, calls_++)})}});
    } else {
      content(std::string_view(held_).substr(0, end));
    }
    held_.erase(0, end);
  }
}

}  // namespace tandem::http
