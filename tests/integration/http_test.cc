// The router's OpenAI-compatible HTTP API on a real cluster (tandem-drafter, tandem-verifier,
// tandem-router with --http-listen and --api-key), driven with curl: completions and chat, whole
// and streamed (server-sent events), the same text as the gRPC API, errors, API keys on both
// APIs, /v1/models, /health and /ready.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster.h"
#include "tests/worker/model/checkpoint/temp_dir.h"

namespace tandem::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kKey[] = "test-key-1";

struct CurlResult {
  int status = 0;
  std::string content_type;
  std::string body;
  std::string headers;
};

// Runs curl against the router's HTTP API. `body` (when not empty) is POSTed as JSON.
CurlResult Curl(const std::string& url, const std::string& body, const std::string& key = kKey) {
  // A directory of this process's own: ctest runs this suite's tests as parallel processes.
  static const test::TempDir dir;
  static int counter = 0;
  const std::string body_file = dir.File(absl::StrCat("body_", ++counter, ".json"));
  const std::string header_file = dir.File(absl::StrCat("headers_", counter, ".txt"));
  std::string command = absl::StrCat("curl -sS -N --max-time 300 -D '", header_file,
                                     "' -w '\\n%{http_code} %{content_type}'");
  if (!key.empty()) absl::StrAppend(&command, " -H 'Authorization: Bearer ", key, "'");
  if (!body.empty()) {
    std::ofstream(body_file, std::ios::binary) << body;
    absl::StrAppend(&command, " -H 'Content-Type: application/json' --data-binary '@", body_file,
                    "'");
  }
  absl::StrAppend(&command, " '", url, "'");
  CurlResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run curl";
    return result;
  }
  char buffer[4096];
  size_t n;
  std::string out;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << "curl failed: " << command << "\n" << out;
  const size_t last = out.rfind('\n');
  if (last == std::string::npos) return result;
  result.body = out.substr(0, last);
  std::vector<std::string> tail = absl::StrSplit(out.substr(last + 1), absl::MaxSplits(' ', 1));
  result.status = std::atoi(tail[0].c_str());
  if (tail.size() > 1) result.content_type = tail[1];
  std::ifstream headers(header_file);
  result.headers.assign(std::istreambuf_iterator<char>(headers), std::istreambuf_iterator<char>());
  return result;
}

// The JSON of each event of a server-sent event stream; `done` when it ended with [DONE].
std::vector<json> Events(const std::string& body, bool* done) {
  std::vector<json> events;
  *done = false;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(event, "data: ")) << event;
    EXPECT_FALSE(*done) << "an event after [DONE]";
    const std::string data(event.substr(6));
    if (data == "[DONE]") {
      *done = true;
      continue;
    }
    events.push_back(json::parse(data));
  }
  return events;
}

class HttpTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = Cluster::Start(
        {.router_flags = {"--http-listen", "127.0.0.1:0", "--api-key", kKey, "--api-key", "k2"}});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
    std::optional<std::string> http = cluster_->router()->HttpAddress();
    ASSERT_TRUE(http.has_value()) << "the router announced no HTTP address";
    base_ = absl::StrCat("http://", *http);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (cluster_ == nullptr) GTEST_SKIP() << "the cluster did not start";
  }

  // Greedy text of `prompt` from the gRPC API, with the key.
  static std::string GrpcText(const std::string& prompt, int max_tokens) {
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.set_mode("ar");
    request.set_max_tokens(max_tokens);
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kKey));
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    auto reader = cluster_->generation().Generate(&context, request);
    std::string text;
    v1::GenerateResponse message;
    while (reader->Read(&message)) text += message.text();
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return text;
  }

  static Cluster* cluster_;
  static std::string base_;
};

Cluster* HttpTest::cluster_ = nullptr;
std::string HttpTest::base_;

const char kPrompt[] = "def fibonacci(n):";

TEST_F(HttpTest, CompletionMatchesTheGrpcApi) {
  CurlResult result = Curl(base_ + "/v1/completions",
                           absl::StrCat(R"({"model": "tandem-target", "prompt": ")", kPrompt,
                                        R"(", "max_tokens": 12, "temperature": 0, "mode": "ar"})"));
  ASSERT_EQ(result.status, 200) << result.body;
  EXPECT_EQ(result.content_type, "application/json");
  json body = json::parse(result.body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "tandem-target");
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "cmpl-"));
  ASSERT_EQ(body["choices"].size(), 1u);
  const std::string text = body["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text, GrpcText(kPrompt, 12));
  EXPECT_THAT(body["choices"][0]["finish_reason"].get<std::string>(),
              ::testing::AnyOf("stop", "length"));
  const json& usage = body["usage"];
  EXPECT_GT(usage["prompt_tokens"].get<int>(), 0);
  EXPECT_GT(usage["completion_tokens"].get<int>(), 0);
  EXPECT_LE(usage["completion_tokens"].get<int>(), 12);
  EXPECT_EQ(usage["total_tokens"].get<int>(),
            usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>());
}

TEST_F(HttpTest, CompletionStreamsTheSameText) {
  CurlResult result =
      Curl(base_ + "/v1/completions",
           absl::StrCat(R"({"prompt": ")", kPrompt,
                        R"(", "max_tokens": 12, "temperature": 0, "mode": "ar", "stream": true,
                            "stream_options": {"include_usage": true}})"));
  ASSERT_EQ(result.status, 200) << result.body;
  EXPECT_EQ(result.content_type, "text/event-stream");
  bool done = false;
  std::vector<json> events = Events(result.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);  // text, finish, usage
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], "text_completion");
    EXPECT_EQ(events[i]["id"], events[0]["id"]);
    text += events[i]["choices"][0]["text"].get<std::string>();
    if (i + 2 < events.size()) {
      EXPECT_TRUE(events[i]["choices"][0]["finish_reason"].is_null());
    }
  }
  EXPECT_EQ(text, GrpcText(kPrompt, 12));
  EXPECT_FALSE(events[events.size() - 2]["choices"][0]["finish_reason"].is_null());
  const json& usage = events.back()["usage"];
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_GT(usage["completion_tokens"].get<int>(), 0);
}

TEST_F(HttpTest, ChatWholeAndStreamed) {
  const std::string messages =
      R"("messages": [{"role": "system", "content": "You write Python."},
                      {"role": "user", "content": "Write a function."}],
         "max_tokens": 10, "temperature": 0, "mode": "ar")";
  CurlResult whole = Curl(base_ + "/v1/chat/completions", absl::StrCat("{", messages, "}"));
  ASSERT_EQ(whole.status, 200) << whole.body;
  json body = json::parse(whole.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  const std::string text = body["choices"][0]["message"]["content"];
  EXPECT_FALSE(text.empty());
  EXPECT_LE(body["usage"]["completion_tokens"].get<int>(), 10);

  CurlResult streamed =
      Curl(base_ + "/v1/chat/completions", absl::StrCat("{", messages, R"(, "stream": true})"));
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.content_type, "text/event-stream");
  bool done = false;
  std::vector<json> events = Events(streamed.body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);  // role, content, finish
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string streamed_text;
  for (size_t i = 1; i < events.size(); ++i) {
    const json& delta = events[i]["choices"][0]["delta"];
    if (delta.contains("content")) streamed_text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(streamed_text, text);
  EXPECT_FALSE(events.back()["choices"][0]["finish_reason"].is_null());
}

TEST_F(HttpTest, ErrorsAreOpenAiShaped) {
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": "x", )", 400, "not valid JSON"},
      {"/v1/completions", R"({"prompt": "x", "n": 17})", 400, "between 1 and 16"},
      {"/v1/completions", R"({"prompt": ""})", 400, ""},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "mode": "no-such-mode"})", 400, "no-such-mode"},
      {"/v1/completions", R"({"model": "gpt-4", "prompt": "x"})", 404, "gpt-4"},
      // The same refusals as over gRPC (cluster_test): a negative stop id here, one past the
      // vocabulary at the verifier, a top_k below -1 at the router.
      {"/v1/completions", R"({"prompt": "x", "stop_token_ids": [-1]})", 400, "stop_token_ids"},
      {"/v1/completions", R"({"prompt": "x", "stop_token_ids": [1073741824]})", 400,
       "outside the vocabulary"},
      {"/v1/completions", R"({"prompt": "x", "top_k": -2})", 400, "top_k"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", 400,
       "between 1 and 16"},
  };
  for (const Case& c : cases) {
    for (const char* stream : {"", "stream"}) {
      std::string body = c.body;
      // The same errors when streaming: they come before the first event.
      if (*stream != '\0' && body.back() == '}') {
        body = absl::StrCat(body.substr(0, body.size() - 1), R"(, "stream": true})");
      }
      CurlResult result = Curl(base_ + c.path, body);
      EXPECT_EQ(result.status, c.status) << body << " -> " << result.body;
      EXPECT_EQ(result.content_type, "application/json") << body;
      json error = json::parse(result.body, nullptr, false);
      ASSERT_TRUE(error.is_object() && error.contains("error")) << result.body;
      for (const char* field : {"message", "type", "param", "code"}) {
        EXPECT_TRUE(error["error"].contains(field)) << field << " in " << result.body;
      }
      EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr(c.message_part));
    }
  }
}

// Resident memory of a process in KiB (VmRSS), 0 when it cannot be read.
int64_t ResidentKiB(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, "VmRSS:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")),
                         &kib)) {
      return kib;
    }
  }
  return 0;
}

// Large refused bodies leave nothing behind: the router's memory returns to its baseline (it
// once kept 400 MB after 64 bodies of 10 MB, sent 16 at a time).
TEST_F(HttpTest, LargeRefusedBodiesDoNotStayInTheRoutersMemory) {
  const pid_t router = cluster_->router()->pid();
  const int64_t before = ResidentKiB(router);
  ASSERT_GT(before, 0) << "cannot read the router's /proc status";
  static const test::TempDir dir;
  const std::string body = dir.File("large_body.json");
  {
    std::ofstream out(body, std::ios::binary);
    out << R"({"prompt": ")" << std::string(10 << 20, 'a');  // unterminated: invalid JSON
  }
  const std::string command = absl::StrCat(
      "for i in $(seq 16); do curl -s -o /dev/null --max-time 120 -H 'Authorization: Bearer ", kKey,
      "' -H 'Content-Type: application/json' --data-binary '@", body, "' '", base_,
      "/v1/completions' & done; wait");
  for (int round = 0; round < 4; ++round) ASSERT_EQ(std::system(command.c_str()), 0);
  const int64_t after = ResidentKiB(router);
  EXPECT_LT(after - before, 128 << 10) << "router RSS " << before << " -> " << after << " KiB";
  // And it still serves.
  CurlResult ok = Curl(base_ + "/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(HttpTest, ApiKeys) {
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  CurlResult missing = Curl(base_ + "/v1/completions", body, "");
  EXPECT_EQ(missing.status, 401) << missing.body;
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], "invalid_api_key");
  CurlResult wrong = Curl(base_ + "/v1/completions", body, "nope");
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(Curl(base_ + "/v1/models", "", "").status, 401);
  EXPECT_EQ(Curl(base_ + "/v1/completions", body, "k2").status, 200);
  // /health and /ready need no key.
  EXPECT_EQ(Curl(base_ + "/health", "", "").status, 200);
  EXPECT_EQ(Curl(base_ + "/ready", "", "").status, 200);

  // gRPC: the same keys, as metadata.
  v1::GenerateRequest request;
  request.set_prompt("x");
  request.set_max_tokens(2);
  for (const std::string& key : {std::string(), std::string("nope")}) {
    grpc::ClientContext context;
    if (!key.empty()) context.AddMetadata("authorization", "Bearer " + key);
    auto reader = cluster_->generation().Generate(&context, request);
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED) << key;
  }
  grpc::ClientContext context;
  v1::ListModelsResponse models;
  EXPECT_EQ(cluster_->generation().ListModels(&context, {}, &models).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(GrpcText("x", 2).empty());
}

TEST_F(HttpTest, ModelsHealthReady) {
  CurlResult models = Curl(base_ + "/v1/models", "");
  ASSERT_EQ(models.status, 200) << models.body;
  json list = json::parse(models.body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "tandem-target");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["max_context"], 512);
  EXPECT_EQ(Curl(base_ + "/health", "").status, 200);
  EXPECT_EQ(Curl(base_ + "/ready", "").status, 200);
  CurlResult unknown = Curl(base_ + "/v1/engines", "");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_TRUE(json::parse(unknown.body).contains("error"));
}

}  // namespace
}  // namespace tandem::testing
