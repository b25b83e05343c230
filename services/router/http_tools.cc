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

// A syntax's text around the calls (worker/template/tool_call_syntax.h): what the constraint
// writes, and what parsing accepts.
struct Syntax {
  std::string_view trigger;    // what starts a block of calls in free text
  std::string_view begin;      // a constrained call's text before its {"name": ...
  std::string_view end;        // and after its closing brace
  std::string_view arguments;  // the key a constrained call writes its arguments under
  std::string_view separator;  // between the calls of a response that holds only calls
  std::string_view lead;       // parsing: a block's text before its first call
  bool list;                   // parsing: a block holds a JSON list of calls, not one call
  std::string_view tail;       // parsing: a block's text after its calls
};

constexpr Syntax kHermes{.trigger = "<tool_call>",
                         .begin = "<tool_call>\n",
                         .end = "\n</tool_call>",
                         .arguments = "arguments",
                         .separator = "\n",
                         .lead = "<tool_call>",
                         .list = false,
                         .tail = "</tool_call>"};
constexpr Syntax kMistral{.trigger = "[TOOL_CALLS]",
                          .begin = "[TOOL_CALLS][",
                          .end = "]",
                          .arguments = "arguments",
                          .separator = "\n",
                          .lead = "[TOOL_CALLS]",
                          .list = true,
                          .tail = ""};
constexpr Syntax kLlama3{.trigger = "{\"name\": ",
                         .begin = "",
                         .end = "",
                         .arguments = "parameters",
                         .separator = "; ",
                         .lead = "",
                         .list = false,
                         .tail = ""};

const Syntax& SyntaxOf(ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kMistral:
      return kMistral;
    case ToolCallSyntax::kLlama3Json:
      return kLlama3;
    case ToolCallSyntax::kHermes:
      break;
  }
  return kHermes;
}

// Text between or after calls that is no content: blanks, and the ";" Llama separates calls by.
bool IsFiller(std::string_view text) {
  for (char c : text) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c)) && c != ';') return false;
  }
  return true;
}

size_t SkipSpace(std::string_view text, size_t at) {
  while (at < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[at]))) ++at;
  return at;
}

// The end of the JSON object or list that opens at text[at] (past its closing bracket), or npos
// while it has not closed. Strings and their escapes are skipped; the content is not checked.
size_t BracketEnd(std::string_view text, size_t at) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
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

// One call's tag in the structural tag: the syntax's text around a call, with the arguments
// constrained to the tool's parameters.
json CallTag(const Syntax& syntax, const std::string& name, const json& parameters) {
  return json{{"type", "tag"},
              {"begin", absl::StrCat(std::string(syntax.begin), "{\"name\": ", json(name).dump(),
                                     ", \"", std::string(syntax.arguments), "\": ")},
              {"content", {{"type", "json_schema"}, {"json_schema", parameters}}},
              {"end", absl::StrCat("}", std::string(syntax.end))}};
}

std::string NewCallId() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kHex[random() % 16];
  return id;
}

// The call a JSON object's text holds, if it is one.
std::optional<ToolCall> CallFromBody(std::string_view body) {
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("name") ||
      !parsed["name"].is_string()) {
    return std::nullopt;
  }
  const json* arguments = nullptr;
  for (const char* key : {"arguments", "parameters"}) {
    if (parsed.contains(key) && parsed[key].is_object()) arguments = &parsed[key];
  }
  if (arguments == nullptr) return std::nullopt;
  return ToolCall{
      .id = NewCallId(), .name = parsed["name"].get<std::string>(), .arguments = arguments->dump()};
}

// A block of calls at the start of `text` (which starts with the syntax's trigger).
struct Block {
  enum class State { kOpen, kText, kCalls } state = State::kText;
  size_t end = 0;  // kCalls: past the block
  std::vector<ToolCall> calls;
};

Block ParseBlock(std::string_view text, const Syntax& syntax) {
  Block open{.state = Block::State::kOpen};
  const Block no{.state = Block::State::kText};
  size_t at = SkipSpace(text, syntax.lead.size());
  if (syntax.list) {
    if (at == text.size()) return open;
    if (text[at] != '[') return no;
    at = SkipSpace(text, at + 1);
  }
  Block block{.state = Block::State::kCalls};
  while (true) {
    if (at == text.size()) return open;
    if (text[at] != '{') return no;
    const size_t end = BracketEnd(text, at);
    if (end == std::string_view::npos) return open;
    std::optional<ToolCall> call = CallFromBody(text.substr(at, end - at));
    if (!call.has_value()) return no;
    block.calls.push_back(*std::move(call));
    at = SkipSpace(text, end);
    if (!syntax.list) break;
    if (at == text.size()) return open;
    if (text[at] == ']') {
      ++at;
      break;
    }
    if (text[at] != ',') return no;
    at = SkipSpace(text, at + 1);
  }
  if (!syntax.tail.empty()) {
    const std::string_view rest = text.substr(at);
    if (rest.size() < syntax.tail.size()) {
      return syntax.tail.substr(0, rest.size()) == rest ? open : no;
    }
    if (rest.substr(0, syntax.tail.size()) != syntax.tail) return no;
    at += syntax.tail.size();
  }
  block.end = at;
  return block;
}

// The length of the longest end of `text` that begins `trigger` (a call that may be starting).
size_t PartialTrigger(std::string_view text, std::string_view trigger) {
  for (size_t k = std::min(text.size(), trigger.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == trigger.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::optional<ToolRequest>> ParseTools(const json& body,
                                                      v1::GenerateRequest* request) {
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
    return std::nullopt;
  }
  json listed = json::array();
  for (const json& tool : body["tools"]) listed.push_back(tool);
  request->mutable_chat()->set_tools(Dump(listed));
  if (choice == "none") return std::nullopt;

  if (request->has_response_format() && !request->response_format().type().empty() &&
      request->response_format().type() != "text") {
    return BadParam("response_format",
                    "response_format cannot be combined with tools (both constrain the output); "
                    "set tool_choice \"none\" to use it");
  }
  if (choice == "function") {
    bool found = false;
    for (const auto& [name, unused] : tools) found = found || name == named;
    if (!found) {
      return BadParam("tool_choice", absl::StrCat("tool_choice names '", named,
                                                  "', which is not among the tools"));
    }
  }
  return ToolRequest{
      .tools = std::move(tools), .choice = choice, .named = named, .parallel = parallel};
}

absl::Status ConstrainToTools(const ToolRequest& tools, ToolCallSyntax syntax,
                              v1::GenerateRequest* request) {
  const Syntax& text = SyntaxOf(syntax);
  json tags = json::array();
  for (const auto& [name, parameters] : tools.tools) {
    if (tools.choice != "function" || name == tools.named) {
      tags.push_back(CallTag(text, name, parameters));
    }
  }
  json format;
  if (tools.choice == "auto") {
    format = {{"type", "triggered_tags"},
              {"triggers", json::array({std::string(text.trigger)})},
              {"tags", std::move(tags)},
              {"at_least_one", false},
              {"stop_after_first", !tools.parallel}};
  } else {  // required or a named function: calls and nothing else
    format = {{"type", "tags_with_separator"},
              {"tags", std::move(tags)},
              {"separator", std::string(text.separator)},
              {"at_least_one", true},
              {"stop_after_first", !tools.parallel || tools.choice == "function"}};
  }
  const std::string tag = Dump(json{{"type", "structural_tag"}, {"format", std::move(format)}});
  if (tag.size() > kMaxGrammarBytes) {
    return BadParam("tools", absl::StrCat("the tools' schemas take ", tag.size(),
                                          " bytes as a grammar; at most ", kMaxGrammarBytes));
  }
  request->mutable_response_format()->set_type("structural_tag");
  request->mutable_response_format()->set_schema(tag);
  return absl::OkStatus();
}

ParsedToolCalls ParseToolCalls(std::string_view text, ToolCallSyntax syntax) {
  ToolCallStream stream(syntax);
  stream.held_ = std::string(text);
  ParsedToolCalls parsed;
  std::string content;
  for (ToolCallStream::Piece& piece : stream.Drain(/*final=*/true)) {
    content += piece.content;
    for (ToolCall& call : piece.calls) parsed.calls.push_back(std::move(call));
  }
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
  const int first = calls_;
  return Deltas(Drain(/*final=*/false), first);
}

std::vector<json> ToolCallStream::Finish() {
  const int first = calls_;
  return Deltas(Drain(/*final=*/true), first);
}

std::vector<json> ToolCallStream::Deltas(std::vector<Piece> pieces, int index) {
  std::vector<json> deltas;
  for (Piece& piece : pieces) {
    if (!piece.content.empty()) deltas.push_back({{"content", std::move(piece.content)}});
    for (const ToolCall& call : piece.calls) {
      deltas.push_back({{"tool_calls", json::array({ToolCallJson(call, index++)})}});
    }
  }
  return deltas;
}

std::vector<ToolCallStream::Piece> ToolCallStream::Drain(bool final) {
  const Syntax& syntax = SyntaxOf(syntax_);
  std::vector<Piece> pieces;
  const auto content = [&](std::string_view piece) {
    // Filler between and after calls is no content.
    if (piece.empty() || (calls_ > 0 && IsFiller(piece))) return;
    pieces.push_back({.content = std::string(piece)});
  };
  while (true) {
    const size_t open = held_.find(syntax.trigger);
    if (open == std::string::npos) {
      const size_t keep = final ? 0 : PartialTrigger(held_, syntax.trigger);
      content(std::string_view(held_).substr(0, held_.size() - keep));
      held_.erase(0, held_.size() - keep);
      return pieces;
    }
    content(std::string_view(held_).substr(0, open));
    held_.erase(0, open);
    Block block = ParseBlock(held_, syntax);
    if (block.state == Block::State::kOpen) {
      if (final) {
        content(held_);
        held_.clear();
      }
      return pieces;
    }
    if (block.state == Block::State::kText) {  // the trigger is text; look on past it
      content(std::string_view(held_).substr(0, syntax.trigger.size()));
      held_.erase(0, syntax.trigger.size());
      continue;
    }
    calls_ += static_cast<int>(block.calls.size());
    pieces.push_back({.calls = std::move(block.calls)});
    held_.erase(0, block.end);
  }
}

}  // namespace tandem::http
