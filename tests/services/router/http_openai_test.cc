#include "services/router/http_openai.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::http {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

v1::GenerateRequest ParseOk(Api api, const std::string& body) {
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(api, body);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return parsed.ok() ? parsed->request : v1::GenerateRequest();
}

absl::Status ParseError(Api api, const std::string& body) {
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(api, body);
  EXPECT_FALSE(parsed.ok()) << body;
  return parsed.ok() ? absl::OkStatus() : parsed.status();
}

TEST(HttpOpenAiTest, CompletionWithEveryParameter) {
  absl::StatusOr<ParsedRequest> parsed =
      ParseRequest(Api::kCompletions,
                   R"({"model": "m", "prompt": "def f(x):", "max_tokens": 7, "temperature": 0.5,
          "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1234, "stop": ["\n\n", "END"],
          "stop_token_ids": [2], "ignore_eos": true, "mode": "spec", "n": 1, "stream": true,
          "stream_options": {"include_usage": true}, "user": "ignored", "presence_penalty": 0})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::GenerateRequest& request = parsed->request;
  EXPECT_EQ(request.model(), "m");
  EXPECT_EQ(request.prompt(), "def f(x):");
  EXPECT_EQ(request.max_tokens(), 7);
  EXPECT_TRUE(parsed->max_tokens_set);
  EXPECT_FLOAT_EQ(request.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(request.sampling().top_p(), 0.9f);
  EXPECT_EQ(request.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(request.sampling().min_p(), 0.05f);
  ASSERT_TRUE(request.sampling().has_seed());
  EXPECT_EQ(request.sampling().seed(), 1234u);
  EXPECT_THAT(request.stop(), ::testing::ElementsAre("\n\n", "END"));
  EXPECT_THAT(request.stop_token_ids(), ::testing::ElementsAre(2));
  EXPECT_TRUE(request.ignore_eos());
  EXPECT_EQ(request.mode(), "spec");
  EXPECT_TRUE(parsed->stream);
  EXPECT_TRUE(parsed->include_usage);
}

TEST(HttpOpenAiTest, PenaltiesLogitBiasAndMinTokens) {
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(
      Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5,
          "frequency_penalty": -1.5, "repetition_penalty": 1.2, "min_tokens": 4,
          "logit_bias": {"17": -100, "3": 2.5}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::GenerateRequest& request = parsed->request;
  EXPECT_FLOAT_EQ(request.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(request.sampling().frequency_penalty(), -1.5f);
  EXPECT_FLOAT_EQ(request.sampling().repetition_penalty(), 1.2f);
  EXPECT_EQ(request.min_tokens(), 4);
  ASSERT_EQ(request.sampling().logit_bias().size(), 2u);
  EXPECT_FLOAT_EQ(request.sampling().logit_bias().at(17), -100.0f);
  EXPECT_FLOAT_EQ(request.sampling().logit_bias().at(3), 2.5f);
  // More than 300 entries is refused before any is read.
  std::string many = R"({"prompt": "x", "logit_bias": {)";
  for (int i = 0; i <= 300; ++i) many += (i ? ", " : "") + ("\"" + std::to_string(i) + "\": 1");
  many += "}}";
  absl::Status status = ParseError(Api::kCompletions, many);
  EXPECT_EQ(ParamOf(status), "logit_bias");
  EXPECT_THAT(std::string(status.message()), HasSubstr("at most 300"));
}

TEST(HttpOpenAiTest, ResponseFormat) {
  absl::StatusOr<ParsedRequest> json_mode =
      ParseRequest(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(json_mode.ok()) << json_mode.status();
  EXPECT_EQ(json_mode->request.response_format().type(), "json_object");
  const v1::GenerateRequest schema = ParseOk(Api::kCompletions, R"({"prompt": "x",
      "response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": true,
                          "schema": {"type": "object", "properties": {"k": {"type": "string"}}}}}})");
  EXPECT_EQ(schema.response_format().type(), "json_schema");
  EXPECT_EQ(json::parse(schema.response_format().schema()),
            json::parse(R"({"type": "object", "properties": {"k": {"type": "string"}}})"));
  const v1::GenerateRequest tag = ParseOk(Api::kCompletions, R"({"prompt": "x",
      "response_format": {"type": "structural_tag", "format": {"type": "const_string",
                                                               "value": "hi"}}})");
  EXPECT_EQ(tag.response_format().type(), "structural_tag");
  EXPECT_EQ(json::parse(tag.response_format().schema())["format"]["value"], "hi");
  const std::string huge = std::string(R"({"prompt": "x", "response_format": {"type":
      "json_schema", "json_schema": {"name": "a", "schema": {"description": ")") +
                           std::string(70000, 'x') + "\"}}}}";
  for (const std::string& body :
       {std::string(R"({"prompt": "x", "response_format": {"type": "json_schema",
                        "json_schema": {"name": "a"}}})"),
        std::string(R"({"prompt": "x", "response_format": {"type": "yaml"}})"),
        std::string(R"({"prompt": "x", "response_format": "json"})"), huge}) {
    absl::Status status = ParseError(Api::kCompletions, body);
    EXPECT_THAT(ParamOf(status), ::testing::StartsWith("response_format")) << body.substr(0, 80);
  }
}

TEST(HttpOpenAiTest, LogprobsInBothApis) {
  absl::StatusOr<ParsedRequest> completion =
      ParseRequest(Api::kCompletions, R"({"prompt": "x", "logprobs": 3})");
  ASSERT_TRUE(completion.ok()) << completion.status();
  EXPECT_TRUE(completion->request.logprobs());
  EXPECT_EQ(completion->request.top_logprobs(), 3);
  absl::StatusOr<ParsedRequest> chat = ParseRequest(
      Api::kChat,
      R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_TRUE(chat->request.logprobs());
  EXPECT_EQ(chat->request.top_logprobs(), 2);
  absl::StatusOr<ParsedRequest> off =
      ParseRequest(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}],
                                  "logprobs": false})");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->request.logprobs());
}

// Two tokens: "Hi" and the first byte of a two-byte character, each with one alternative.
google::protobuf::RepeatedPtrField<v1::TokenLogprob> TwoTokens() {
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> logprobs;
  v1::TokenLogprob* hi = logprobs.Add();
  hi->set_token_id(5);
  hi->set_token("Hi");
  hi->set_logprob(-0.25f);
  v1::TopLogprob* top = hi->add_top();
  top->set_token_id(5);
  top->set_token("Hi");
  top->set_logprob(-0.25f);
  v1::TokenLogprob* part = logprobs.Add();
  part->set_token_id(9);
  part->set_token("\xc3");
  part->set_logprob(-1.5f);
  top = part->add_top();
  top->set_token_id(4);
  top->set_token("!");
  top->set_logprob(-0.5f);
  return logprobs;
}

TEST(HttpOpenAiTest, LogprobsRenderInEachApisShape) {
  ResponseMeta meta{.id = "x", .created = 1, .model = "m", .logprobs = true};
  Collected collected;
  collected.text = "Hi";
  collected.finish_reason = "length";
  collected.logprobs = TwoTokens();
  const nlohmann::json chat = FinalResponse(Api::kChat, meta, {collected}, collected.usage);
  const nlohmann::json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hi");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(content[0]["bytes"], nlohmann::json::array({72, 105}));
  EXPECT_EQ(content[0]["top_logprobs"][0]["token"], "Hi");
  EXPECT_EQ(content[1]["token"], "bytes:\\xc3");
  EXPECT_EQ(content[1]["bytes"], nlohmann::json::array({0xc3}));
  EXPECT_EQ(content[1]["top_logprobs"][0]["token"], "!");

  const nlohmann::json completion =
      FinalResponse(Api::kCompletions, meta, {collected}, collected.usage);
  const nlohmann::json& legacy = completion["choices"][0]["logprobs"];
  EXPECT_EQ(legacy["tokens"], nlohmann::json::array({"Hi", "bytes:\\xc3"}));
  EXPECT_FLOAT_EQ(legacy["token_logprobs"][1].get<float>(), -1.5f);
  EXPECT_EQ(legacy["top_logprobs"][1].size(), 2u);  // the chosen token and "!"
  EXPECT_FLOAT_EQ(legacy["top_logprobs"][1]["!"].get<float>(), -0.5f);
  EXPECT_EQ(legacy["text_offset"], nlohmann::json::array({0, 2}));

  meta.logprobs = false;
  EXPECT_TRUE(
      FinalResponse(Api::kChat, meta, {collected}, collected.usage)["choices"][0]["logprobs"]
          .is_null());
  // A stream's chunks continue the offsets.
  int64_t offset = 7;
  const nlohmann::json chunk = LogprobsJson(Api::kCompletions, TwoTokens(), &offset);
  EXPECT_EQ(chunk["text_offset"], nlohmann::json::array({7, 9}));
  EXPECT_EQ(offset, 10);
}

TEST(HttpOpenAiTest, CompletionDefaultsFollowOpenAi) {
  absl::StatusOr<ParsedRequest> parsed =
      ParseRequest(Api::kCompletions, R"({"prompt": "hi", "stop": "x"})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request.max_tokens(), kDefaultCompletionMaxTokens);
  EXPECT_FALSE(parsed->max_tokens_set);
  EXPECT_FLOAT_EQ(parsed->request.sampling().temperature(), 1.0f);
  EXPECT_FALSE(parsed->request.sampling().has_seed());
  EXPECT_EQ(parsed->request.model(), "");
  EXPECT_THAT(parsed->request.stop(), ::testing::ElementsAre("x"));
  EXPECT_FALSE(parsed->stream);
}

TEST(HttpOpenAiTest, PromptForms) {
  EXPECT_THAT(ParseOk(Api::kCompletions, R"({"prompt": [1, 2, 3]})").token_ids().ids(),
              ::testing::ElementsAre(1, 2, 3));
  EXPECT_THAT(ParseOk(Api::kCompletions, R"({"prompt": [[4, 5]]})").token_ids().ids(),
              ::testing::ElementsAre(4, 5));
  EXPECT_EQ(ParseOk(Api::kCompletions, R"({"prompt": ["one"]})").prompt(), "one");
  // An empty prompt goes on to the router's checks, which answer for every client alike.
  v1::GenerateRequest empty = ParseOk(Api::kCompletions, R"({"prompt": ""})");
  EXPECT_EQ(empty.input_case(), v1::GenerateRequest::kPrompt);
  EXPECT_EQ(empty.prompt(), "");
}

TEST(HttpOpenAiTest, ChatMessages) {
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(Api::kChat,
                                                      R"({"model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello "},
                                         {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": null}],
          "max_completion_tokens": 9})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const v1::ChatMessages& chat = parsed->request.chat();
  ASSERT_EQ(chat.messages_size(), 3);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "be brief");
  EXPECT_EQ(chat.messages(1).role(), "user");
  EXPECT_EQ(chat.messages(1).content(), "hello there");
  EXPECT_EQ(chat.messages(2).content(), "");
  EXPECT_EQ(parsed->request.max_tokens(), 9);
  // Chat has no fixed default: the caller fills in the rest of the context.
  absl::StatusOr<ParsedRequest> no_max =
      ParseRequest(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(no_max.ok());
  EXPECT_FALSE(no_max->max_tokens_set);
  EXPECT_EQ(no_max->request.max_tokens(), 0);
}

TEST(HttpOpenAiTest, MalformedJsonNamesTheProblem) {
  absl::Status status = ParseError(Api::kCompletions, R"({"prompt": "x",)");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not valid JSON"));
  EXPECT_THAT(std::string(ParseError(Api::kChat, "[1]").message()), HasSubstr("JSON object"));
  // A number past double's range: nlohmann's out_of_range, not a parse_error (found by
  // tests/fuzz/openai_request_fuzz; it escaped as an exception, a 500 over HTTP).
  status = ParseError(Api::kCompletions, R"({"prompt": "x", "max_tokens": 1e999999})");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("number overflow"));
}

TEST(HttpOpenAiTest, RefusalsNameTheParameter) {
  struct Case {
    Api api;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {Api::kCompletions, R"({"prompt": "x", "n": 17})", "n"},
      {Api::kCompletions, R"({"prompt": "x", "n": 0})", "n"},
      {Api::kCompletions, R"({"prompt": "x", "n": 3, "best_of": 2})", "best_of"},
      {Api::kCompletions, R"({"prompt": "x", "best_of": 3, "stream": true})", "best_of"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "best_of": 3})", "best_of"},
      {Api::kCompletions, R"({"prompt": "x", "logprobs": 21})", "logprobs"},
      {Api::kCompletions, R"({"prompt": "x", "logprobs": true})", "logprobs"},
      {Api::kCompletions, R"({"prompt": "x", "top_logprobs": 2})", "top_logprobs"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})",
       "logprobs"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       "top_logprobs"},
      {Api::kChat,
       R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 30})",
       "top_logprobs"},
      {Api::kCompletions, R"({"prompt": "x", "echo": 1})", "echo"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", "echo"},
      {Api::kCompletions, R"({"prompt": "x", "frequency_penalty": 2.5})", "frequency_penalty"},
      {Api::kCompletions, R"({"prompt": "x", "presence_penalty": "high"})", "presence_penalty"},
      {Api::kCompletions, R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty"},
      {Api::kCompletions, R"({"prompt": "x", "logit_bias": [1]})", "logit_bias"},
      {Api::kCompletions, R"({"prompt": "x", "logit_bias": {"a": 1}})", "logit_bias"},
      {Api::kCompletions, R"({"prompt": "x", "logit_bias": {"-3": 1}})", "logit_bias"},
      {Api::kCompletions, R"({"prompt": "x", "logit_bias": {"3": 101}})", "logit_bias"},
      {Api::kCompletions, R"({"prompt": "x", "logit_bias": {"3": "up"}})", "logit_bias"},
      {Api::kCompletions, R"({"prompt": "x", "min_tokens": -1})", "min_tokens"},
      {Api::kCompletions, R"({"prompt": ["a", "b"]})", "prompt"},
      {Api::kCompletions, R"({"prompt": 3})", "prompt"},
      {Api::kCompletions, R"({"prompt": [1, -2]})", "prompt"},
      {Api::kCompletions, R"({})", "prompt"},
      {Api::kCompletions, R"({"prompt": "x", "max_tokens": "ten"})", "max_tokens"},
      {Api::kCompletions, R"({"prompt": "x", "max_tokens": 1.5})", "max_tokens"},
      {Api::kCompletions, R"({"prompt": "x", "temperature": "hot"})", "temperature"},
      {Api::kCompletions, R"({"prompt": "x", "seed": -1})", "seed"},
      {Api::kCompletions, R"({"prompt": "x", "stop": [1]})", "stop"},
      {Api::kCompletions, R"({"prompt": "x", "stream": "yes"})", "stream"},
      {Api::kCompletions, R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos"},
      {Api::kCompletions, R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       "stream_options"},
      {Api::kCompletions, R"({"prompt": "x", "model": 5})", "model"},
      {Api::kChat, R"({"messages": []})", "messages"},
      {Api::kChat, R"({"messages": "hi"})", "messages"},
      {Api::kChat, R"({"messages": [{"role": "robot", "content": "x"}]})", "messages[0].role"},
      {Api::kChat, R"({"messages": [{"role": "tool", "content": "x"}]})",
       "messages[0].tool_call_id"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
       "messages[0].tool_calls"},
      {Api::kCompletions, R"({"prompt": "x", "tools": [{"type": "function"}]})", "tools"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content"},
      {Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})",
       "tools[0]"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseError(c.api, c.body);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(ParamOf(status), c.param) << c.body << ": " << status;
  }
  // Defaults of the unsupported parameters are accepted.
  ParseOk(Api::kCompletions,
          R"({"prompt": "x", "n": 1, "best_of": 1, "logprobs": null, "echo": false,
              "frequency_penalty": 0, "logit_bias": {}})");
  ParseOk(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [],
                          "response_format": {"type": "text"}})");
}

ResponseMeta Meta() { return {.id = "cmpl-1", .created = 1700000000, .model = "m"}; }

v1::Usage Usage(int prompt, int completion) {
  v1::Usage usage;
  usage.set_prompt_tokens(prompt);
  usage.set_completion_tokens(completion);
  return usage;
}

TEST(HttpOpenAiTest, FinalResponsesHaveOpenAiShape) {
  Collected collected;
  v1::GenerateResponse first;
  first.set_text("Hello");
  first.set_mode("spec");
  v1::GenerateResponse last;
  last.set_text(" world");
  last.set_finish_reason("length");
  *last.mutable_usage() = Usage(3, 2);
  last.mutable_usage()->set_cached_tokens(1);  // OpenAI's usage.prompt_tokens_details
  Collect(first, &collected);
  Collect(last, &collected);

  json completion = FinalResponse(Api::kCompletions, Meta(), {collected}, collected.usage);
  EXPECT_EQ(completion["id"], "cmpl-1");
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["created"], 1700000000);
  EXPECT_EQ(completion["model"], "m");
  ASSERT_EQ(completion["choices"].size(), 1u);
  EXPECT_EQ(completion["choices"][0]["text"], "Hello world");
  EXPECT_EQ(completion["choices"][0]["index"], 0);
  EXPECT_EQ(completion["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(completion["usage"], json({{"prompt_tokens", 3},
                                       {"completion_tokens", 2},
                                       {"total_tokens", 5},
                                       {"prompt_tokens_details", {{"cached_tokens", 1}}}}));
  EXPECT_EQ(completion["tandem"]["mode"], "spec");

  json chat = FinalResponse(Api::kChat, Meta(), {collected}, collected.usage);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"],
            json({{"role", "assistant"}, {"content", "Hello world"}}));
  EXPECT_FALSE(chat["choices"][0].contains("text"));
}

TEST(HttpOpenAiTest, StreamChunks) {
  json role = RoleChunk(Meta(), false);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(role.contains("usage"));

  json content = ContentChunk(Api::kChat, Meta(), "hi", "", true);
  EXPECT_EQ(content["choices"][0]["delta"], json({{"content", "hi"}}));
  EXPECT_TRUE(content["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(content.contains("usage") && content["usage"].is_null());

  json finish = ContentChunk(Api::kChat, Meta(), "", "stop", false);
  EXPECT_EQ(finish["choices"][0]["delta"], json::object());
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "stop");

  json text = ContentChunk(Api::kCompletions, Meta(), "abc", "", false);
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "abc");

  json usage = UsageChunk(Api::kCompletions, Meta(), Usage(4, 6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 10);

  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(HttpOpenAiTest, ErrorsMapGrpcCodes) {
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::INVALID_ARGUMENT), 400);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::UNAUTHENTICATED), 401);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::NOT_FOUND), 404);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::UNAVAILABLE), 503);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::DEADLINE_EXCEEDED), 504);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::INTERNAL), 500);
  EXPECT_EQ(HttpStatusFor(grpc::StatusCode::UNKNOWN), 500);

  json error = ErrorBody(400, "bad n", "n");
  EXPECT_EQ(error, json({{"error",
                          {{"message", "bad n"},
                           {"type", "invalid_request_error"},
                           {"param", "n"},
                           {"code", "invalid_argument"}}}}));
  json busy = ErrorBody(429, "busy");
  EXPECT_TRUE(busy["error"]["param"].is_null());
  EXPECT_EQ(busy["error"]["type"], "rate_limit_error");
  EXPECT_EQ(ErrorBody(404, "no", "model", "model_not_found")["error"]["code"], "model_not_found");
  // The body cpp-httplib refuses before parsing is the client's error, not the server's.
  json large = ErrorBody(413, "the request body exceeds 8 MiB");
  EXPECT_EQ(large["error"]["type"], "invalid_request_error");
  EXPECT_EQ(large["error"]["code"], "payload_too_large");
}

TEST(HttpOpenAiTest, ModelsListAndIds) {
  v1::ListModelsResponse models;
  v1::ModelInfo* info = models.add_models();
  info->set_id("tandem-target");
  info->add_modes("ar");
  info->set_max_context(512);
  json list = ModelsList(models, 42);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "tandem-target");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["created"], 42);
  EXPECT_EQ(list["data"][0]["owned_by"], "tandem");
  EXPECT_EQ(list["data"][0]["max_context"], 512);
  EXPECT_EQ(list["data"][0]["tool_call_syntax"], "hermes");  // a verifier that names none
  info->set_tool_call_syntax("mistral");
  EXPECT_EQ(ModelsList(models, 42)["data"][0]["tool_call_syntax"], "mistral");

  const std::string a = NewResponseId(Api::kChat);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, NewResponseId(Api::kChat));
  EXPECT_EQ(NewResponseId(Api::kCompletions).rfind("cmpl-", 0), 0u);
}

}  // namespace
TEST(HttpOpenAiTest, ChoicesAndTheirUsage) {
  absl::StatusOr<ParsedRequest> parsed =
      ParseRequest(Api::kCompletions, R"({"prompt": "x", "n": 2, "best_of": 5})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->n, 2);
  EXPECT_EQ(parsed->best_of, 5);
  parsed = ParseRequest(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "n": 3})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->n, 3);
  EXPECT_EQ(parsed->best_of, 3);

  v1::Usage a = Usage(10, 4);
  v1::Usage b = Usage(10, 6);
  b.set_cached_tokens(8);
  const v1::Usage total = TotalUsage({a, b});
  EXPECT_EQ(total.prompt_tokens(), 10);  // the prompt once, as OpenAI counts it
  EXPECT_EQ(total.completion_tokens(), 10);
  EXPECT_EQ(total.cached_tokens(), 8);

  Collected sure;
  Collected unsure;
  for (float lp : {-0.1f, -0.3f}) sure.logprobs.Add()->set_logprob(lp);
  for (float lp : {-2.0f}) unsure.logprobs.Add()->set_logprob(lp);
  EXPECT_NEAR(MeanLogprob(sure), -0.2, 1e-6);
  EXPECT_GT(MeanLogprob(unsure), MeanLogprob(Collected{}));
  const json two = FinalResponse(Api::kChat, Meta(), {sure, unsure}, total);
  ASSERT_EQ(two["choices"].size(), 2u);
  EXPECT_EQ(two["choices"][1]["index"], 1);
  EXPECT_EQ(two["usage"]["total_tokens"], 20);
}

}  // namespace tandem::http
