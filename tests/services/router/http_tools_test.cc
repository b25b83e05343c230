#include "services/router/http_tools.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/http_openai.h"

namespace tandem::http {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kTools[] = R"("tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}])";

absl::StatusOr<ParsedRequest> Chat(const std::string& extra) {
  return ParseRequest(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], )" +
                                      std::string(kTools) + extra + "}");
}

// The structural tag's format that constrains `parsed`'s tools in `syntax`.
// What a stream gives for `pieces` pushed in order, then finished: its content, and its calls'
// deltas.
struct Streamed {
  std::string content;
  std::vector<json> calls;
};

Streamed Stream(ToolCallStream& stream, const std::vector<std::string>& pieces) {
  std::vector<json> deltas;
  for (const std::string& piece : pieces) {
    for (json& d : stream.Push(piece)) deltas.push_back(std::move(d));
  }
  for (json& d : stream.Finish()) deltas.push_back(std::move(d));
  Streamed out;
  for (const json& d : deltas) {
    if (d.contains("content")) out.content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) out.calls.push_back(d["tool_calls"][0]);
  }
  return out;
}

json Format(const ParsedRequest& parsed, ToolCallSyntax syntax = ToolCallSyntax::kHermes) {
  EXPECT_TRUE(parsed.tools.has_value());
  if (!parsed.tools.has_value()) return json();
  v1::GenerateRequest request = parsed.request;
  EXPECT_TRUE(ConstrainToTools(*parsed.tools, syntax, &request).ok());
  EXPECT_EQ(request.response_format().type(), "structural_tag");
  return json::parse(request.response_format().schema())["format"];
}

TEST(HttpToolsTest, ToolChoiceBuildsTheStructuralTag) {
  absl::StatusOr<ParsedRequest> automatic = Chat("");
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(automatic->tools.has_value());
  EXPECT_FALSE(automatic->request.has_response_format());  // constrained once the model is known
  EXPECT_EQ(json::parse(automatic->request.chat().tools()).size(), 2u);
  json format = Format(*automatic);
  EXPECT_EQ(format["type"], "triggered_tags");
  EXPECT_EQ(format["triggers"], json::array({"<tool_call>"}));
  ASSERT_EQ(format["tags"].size(), 2u);
  EXPECT_EQ(format["tags"][0]["begin"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(format["tags"][0]["content"]["json_schema"]["required"], json::array({"city"}));
  EXPECT_EQ(format["tags"][1]["content"]["json_schema"], json({{"type", "object"}}));
  EXPECT_EQ(format["stop_after_first"], false);

  absl::StatusOr<ParsedRequest> required = Chat(R"(, "tool_choice": "required",
                                                     "parallel_tool_calls": false)");
  ASSERT_TRUE(required.ok()) << required.status();
  format = Format(*required);
  EXPECT_EQ(format["type"], "tags_with_separator");
  EXPECT_EQ(format["at_least_one"], true);
  EXPECT_EQ(format["stop_after_first"], true);

  absl::StatusOr<ParsedRequest> named =
      Chat(R"(, "tool_choice": {"type": "function", "function": {"name": "get_time"}})");
  ASSERT_TRUE(named.ok()) << named.status();
  format = Format(*named);
  ASSERT_EQ(format["tags"].size(), 1u);
  EXPECT_THAT(format["tags"][0]["begin"].get<std::string>(), HasSubstr("get_time"));

  // none: the template still sees the tools; nothing is constrained or parsed.
  absl::StatusOr<ParsedRequest> none = Chat(R"(, "tool_choice": "none",
                                                 "response_format": {"type": "json_object"})");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->tools.has_value());
  EXPECT_EQ(none->request.response_format().type(), "json_object");
  EXPECT_FALSE(none->request.chat().tools().empty());
}

TEST(HttpToolsTest, RefusalsNameTheParameter) {
  struct Case {
    std::string extra;
    std::string param;
  };
  const std::vector<Case> cases = {
      {R"(, "tool_choice": "maybe")", "tool_choice"},
      {R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})", "tool_choice"},
      {R"(, "tool_choice": 3)", "tool_choice"},
      {R"(, "parallel_tool_calls": "yes")", "parallel_tool_calls"},
      {R"(, "response_format": {"type": "json_object"})", "response_format"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ParsedRequest> parsed = Chat(c.extra);
    ASSERT_FALSE(parsed.ok()) << c.extra;
    EXPECT_EQ(ParamOf(parsed.status()), c.param) << c.extra << ": " << parsed.status();
  }
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "has space"}}]})",
       "tools[0].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [
          {"type": "function", "function": {"name": "f"}},
          {"type": "function", "function": {"name": "f"}}]})",
       "tools"},
  };
  for (const auto& [body, param] : bodies) {
    absl::StatusOr<ParsedRequest> parsed = ParseRequest(Api::kChat, body);
    ASSERT_FALSE(parsed.ok()) << body;
    EXPECT_EQ(ParamOf(parsed.status()), param) << body << ": " << parsed.status();
  }
  std::string many = R"({"messages": [{"role": "user", "content": "x"}], "tools": [)";
  for (size_t i = 0; i <= kMaxTools; ++i) {
    many += (i ? ", " : "") + std::string(R"({"type": "function", "function": {"name": "f)") +
            std::to_string(i) + "\"}}";
  }
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(Api::kChat, many + "]}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("at most"));
}

TEST(HttpToolsTest, HistoryWithCallsAndAnswersReachesTheTemplate) {
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(Api::kChat, R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::ChatMessages& chat = parsed->request.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(json::parse(chat.messages(1).tool_calls())[0]["function"]["name"], "get_weather");
  EXPECT_EQ(chat.messages(2).role(), "tool");
  EXPECT_EQ(chat.messages(2).tool_call_id(), "call_1");
  EXPECT_FALSE(parsed->tools.has_value());
}

TEST(HttpToolsTest, ParsesCallsOutOfText) {
  const ParsedToolCalls parsed = ParseToolCalls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
      "</tool_call>\n<tool_call>not json</tool_call>",
      ToolCallSyntax::kHermes);
  ASSERT_EQ(parsed.calls.size(), 2u);
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(parsed.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(parsed.calls[1].arguments, "{}");
  EXPECT_THAT(parsed.calls[0].id, ::testing::StartsWith("call_"));
  EXPECT_NE(parsed.calls[0].id, parsed.calls[1].id);
  // Blank text between calls is dropped; a block that is no call stays.
  EXPECT_EQ(parsed.content, "Let me check.\n<tool_call>not json</tool_call>");
  EXPECT_TRUE(ParseToolCalls("plain text", ToolCallSyntax::kHermes).calls.empty());
  EXPECT_EQ(ParseToolCalls("<tool_call>{\"name\": \"f\"", ToolCallSyntax::kHermes).content,
            "<tool_call>{\"name\": \"f\"");
  const json call = ToolCallJson(parsed.calls[0], 0);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["function"]["name"], "get_weather");
}

TEST(HttpToolsTest, StreamHoldsACallUntilItCloses) {
  const std::string text =
      "Sure. <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
      "</tool_call> <tool";
  // Any split of the text into pieces gives the same deltas.
  for (size_t piece : {1, 3, 7, 1000}) {
    ToolCallStream stream;
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size(); at += piece) pieces.push_back(text.substr(at, piece));
    const auto [content, calls] = Stream(stream, pieces);
    SCOPED_TRACE(piece);
    // Blank text between and after calls is dropped; a "<tool" that never became one stays.
    EXPECT_EQ(content, "Sure. <tool");
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"]["name"], "get_time");
    EXPECT_EQ(calls[1]["index"], 1);
    EXPECT_EQ(json::parse(calls[1]["function"]["arguments"].get<std::string>())["city"], "Oslo");
    EXPECT_TRUE(stream.called());
  }
}

TEST(HttpToolsTest, FinalResponseCarriesCalls) {
  Collected collected;
  collected.text = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  collected.finish_reason = "stop";
  ResponseMeta meta{.id = "chatcmpl-1", .created = 1, .model = "m", .tool_calls = true};
  const json response = FinalResponse(Api::kChat, meta, {collected}, v1::Usage());
  const json& choice = response["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_time");
  collected.text = "no call";
  const json plain = FinalResponse(Api::kChat, meta, {collected}, v1::Usage());
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "no call");
  EXPECT_FALSE(plain["choices"][0]["message"].contains("tool_calls"));
}

// Each syntax's constraint writes text its parser reads back: the calls of a "required"
// response (its tags joined by its separator), whole and streamed a byte at a time.
TEST(HttpToolsTest, EverySyntaxParsesWhatItsConstraintWrites) {
  absl::StatusOr<ParsedRequest> required = Chat(R"(, "tool_choice": "required")");
  ASSERT_TRUE(required.ok()) << required.status();
  const std::vector<json> arguments = {json{{"city", "Paris"}}, json::object()};
  for (const ToolCallSyntax syntax : kToolCallSyntaxes) {
    SCOPED_TRACE(ToolCallSyntaxName(syntax));
    const json format = Format(*required, syntax);
    ASSERT_EQ(format["tags"].size(), 2u);
    std::string text;
    for (size_t i = 0; i < 2; ++i) {
      if (i > 0) text += format["separator"].get<std::string>();
      text += format["tags"][i]["begin"].get<std::string>() + arguments[i].dump() +
              format["tags"][i]["end"].get<std::string>();
    }
    const ParsedToolCalls whole = ParseToolCalls(text, syntax);
    EXPECT_EQ(whole.content, "") << text;
    ASSERT_EQ(whole.calls.size(), 2u) << text;
    EXPECT_EQ(whole.calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(whole.calls[0].arguments), arguments[0]);
    EXPECT_EQ(whole.calls[1].name, "get_time");
    EXPECT_EQ(json::parse(whole.calls[1].arguments), arguments[1]);
    ToolCallStream stream(syntax);
    std::vector<std::string> bytes;
    for (char c : "Sure: " + text) bytes.emplace_back(1, c);
    const auto [content, calls] = Stream(stream, bytes);
    EXPECT_EQ(content, "Sure: ");
    ASSERT_EQ(calls.size(), 2u) << text;
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(calls[1]["index"], 1);

    const json automatic = Format(*Chat(""), syntax);
    const std::string trigger = automatic["triggers"][0].get<std::string>();
    for (const json& tag : automatic["tags"]) {
      EXPECT_TRUE(tag["begin"].get<std::string>().starts_with(trigger)) << tag.dump();
    }
  }
}

// What the checkpoints write unconstrained: a Mistral list of calls, Llama calls separated by
// ";" (with "parameters"), and a Hermes block with "parameters".
TEST(HttpToolsTest, ParsesEachSyntaxAsCheckpointsWriteIt) {
  ParsedToolCalls mistral = ParseToolCalls(
      R"(Checking. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", )"
      R"("arguments": {}}])",
      ToolCallSyntax::kMistral);
  EXPECT_EQ(mistral.content, "Checking.");
  ASSERT_EQ(mistral.calls.size(), 2u);
  EXPECT_EQ(mistral.calls[1].name, "b");
  ParsedToolCalls llama =
      ParseToolCalls(R"({"name": "a", "parameters": {"x": "}"}}; {"name": "b", "parameters": {}})",
                     ToolCallSyntax::kLlama3Json);
  EXPECT_EQ(llama.content, "");
  ASSERT_EQ(llama.calls.size(), 2u);
  EXPECT_EQ(json::parse(llama.calls[0].arguments)["x"], "}");  // a brace inside a string
  ParsedToolCalls hermes = ParseToolCalls(
      "<tool_call>{\"name\": \"a\", \"parameters\": {}}</tool_call>", ToolCallSyntax::kHermes);
  ASSERT_EQ(hermes.calls.size(), 1u);
  // Text that only looks like a start stays text, in every syntax.
  EXPECT_EQ(ParseToolCalls("[TOOL_CALLS] nothing", ToolCallSyntax::kMistral).content,
            "[TOOL_CALLS] nothing");
  EXPECT_EQ(ParseToolCalls(R"(say {"name": 3})", ToolCallSyntax::kLlama3Json).content,
            R"(say {"name": 3})");
  EXPECT_TRUE(ParseToolCalls("<tool_call>{\"name\": \"a\"}</tool_call>", ToolCallSyntax::kHermes)
                  .calls.empty());  // no arguments
}

TEST(ToolCallSyntaxTest, TemplatesNameTheirSyntax) {
  EXPECT_EQ(ToolCallSyntaxForTemplate("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}"),
            ToolCallSyntax::kMistral);
  EXPECT_EQ(ToolCallSyntaxForTemplate("<tool_call>\n{\"name\": ...}\n</tool_call>"),
            ToolCallSyntax::kHermes);
  EXPECT_EQ(ToolCallSyntaxForTemplate("{{- '\"parameters\": ' }}{{ args | tojson }}"),
            ToolCallSyntax::kLlama3Json);
  EXPECT_EQ(ToolCallSyntaxForTemplate("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallSyntax::kHermes);
  for (const ToolCallSyntax syntax : kToolCallSyntaxes) {
    EXPECT_EQ(*ToolCallSyntaxOf(ToolCallSyntaxName(syntax)), syntax);
  }
  EXPECT_EQ(*ToolCallSyntaxOf(""), ToolCallSyntax::kHermes);
  EXPECT_FALSE(ToolCallSyntaxOf("pythonic").ok());
}

}  // namespace
}  // namespace tandem::http
