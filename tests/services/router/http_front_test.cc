// HttpFront against a scripted Generation service on an in-process channel: what HTTP clients
// see for streams, whole responses, errors, API keys and clients that go away.
#include "services/router/http_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// Prompts script the answer: "fail:N" ends with gRPC code N before any output, "late-fail"
// fails after one chunk, "slow" streams until cancelled; anything else is "Hel" "lo" " world".
class ScriptedGeneration final : public v1::Generation::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      last_request_ = *request;
      auto it = context->client_metadata().find("authorization");
      last_authorization_ = it == context->client_metadata().end()
                                ? ""
                                : std::string(it->second.data(), it->second.size());
    }
    const std::string& prompt = request->prompt();
    int code = 0;
    if (absl::StartsWith(prompt, "fail:") && absl::SimpleAtoi(prompt.substr(5), &code)) {
      return grpc::Status(static_cast<grpc::StatusCode>(code), "scripted failure");
    }
    v1::GenerateResponse message;
    if (request->response_format().type() == "structural_tag") {
      // A call as a Mistral checkpoint writes it, when the constraint asks for that syntax.
      const bool mistral = absl::StrContains(request->response_format().schema(), "[TOOL_CALLS]");
      message.set_text(mistral ? R"([TOOL_CALLS][{"name": "get_time", "arguments": {}}])"
                               : "no call");
      message.set_finish_reason("stop");
      writer->Write(message);
      return grpc::Status::OK;
    }
    if (prompt == "slow") {
      slow_started_ = true;
      while (!context->IsCancelled()) {
        message.set_text("x");
        if (!writer->Write(message)) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      slow_cancelled_ = true;
      return grpc::Status::CANCELLED;
    }
    message.set_text("Hel");
    message.set_mode("ar");
    writer->Write(message);
    if (prompt == "late-fail") {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "verifier went away");
    }
    message.set_text("lo");
    writer->Write(message);
    message.set_text(" world");
    message.set_finish_reason("stop");
    message.mutable_usage()->set_prompt_tokens(4);
    message.mutable_usage()->set_completion_tokens(3);
    writer->Write(message);
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* reply) override {
    v1::ModelInfo* model = reply->add_models();
    model->set_id("m");
    model->add_modes("ar");
    model->set_max_context(64);
    absl::MutexLock lock(&mu_);
    model->set_tool_call_syntax(tool_call_syntax_);
    return grpc::Status::OK;
  }

  v1::GenerateRequest last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }
  std::string last_authorization() {
    absl::MutexLock lock(&mu_);
    return last_authorization_;
  }
  void set_tool_call_syntax(const std::string& syntax) {
    absl::MutexLock lock(&mu_);
    tool_call_syntax_ = syntax;
  }
  std::atomic<bool> slow_started_{false};
  std::atomic<bool> slow_cancelled_{false};

 private:
  absl::Mutex mu_;
  v1::GenerateRequest last_request_ ABSL_GUARDED_BY(mu_);
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
  std::string tool_call_syntax_ ABSL_GUARDED_BY(mu_);  // what ListModels says the model writes
};

class HttpFrontTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> keys = {},
             absl::Duration request_timeout = absl::Seconds(60)) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto front = HttpFront::Start({.listen = "127.0.0.1:0",
                                   .api_keys = ApiKeys(keys),
                                   .ready = [this] { return ready_.load(); },
                                   .max_connections = 64,
                                   .request_timeout = request_timeout,
                                   .on_request_timeout = [this] { ++timeouts_; }},
                                  server_->InProcessChannel(grpc::ChannelArguments()));
    ASSERT_TRUE(front.ok()) << front.status();
    front_ = std::move(*front);
    const std::string& address = front_->address();
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port);
    client_->set_read_timeout(10, 0);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    if (front_) front_->Stop();
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) {
    return client_->Post(path.c_str(), headers, body, "application/json");
  }

  // The JSON of each "data: " event, and whether the stream ended with [DONE].
  static std::vector<json> Events(const std::string& body, bool* done) {
    std::vector<json> events;
    *done = false;
    for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
      EXPECT_TRUE(absl::StartsWith(event, "data: ")) << event;
      const std::string data(event.substr(6));
      if (data == "[DONE]") {
        *done = true;
        continue;
      }
      EXPECT_FALSE(*done) << "an event after [DONE]";
      events.push_back(json::parse(data));
    }
    return events;
  }

  // A connected socket to the front.
  int Connect() {
    const std::string& address = front_->address();
    int port = 0;
    EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0);
    return fd;
  }

  // Waits up to 10 s for `flag`.
  static bool WaitFor(const std::atomic<bool>& flag) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!flag && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return flag;
  }

  ScriptedGeneration service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpFront> front_;
  std::unique_ptr<httplib::Client> client_;
  std::atomic<bool> ready_{true};
  std::atomic<int> timeouts_{0};  // on_request_timeout calls
};

TEST_F(HttpFrontTest, CompletionWhole) {
  Start();
  auto res = Post("/v1/completions", R"({"model": "m", "prompt": "p", "max_tokens": 5})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["choices"][0]["text"], "Hello world");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 7);
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "cmpl-"));
  const v1::GenerateRequest sent = service_.last_request();
  EXPECT_EQ(sent.prompt(), "p");
  EXPECT_EQ(sent.max_tokens(), 5);
  EXPECT_EQ(sent.request_id(), body["id"]);
}

TEST_F(HttpFrontTest, ChatWholeDefaultsToTheRestOfTheContext) {
  Start();
  auto res = Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  json body = json::parse(res->body);
  EXPECT_EQ(body["object"], "chat.completion");
  // No model named: the only one.
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(service_.last_request().max_tokens(), 63);
  EXPECT_EQ(service_.last_request().chat().messages(0).content(), "hi");
}

TEST_F(HttpFrontTest, CompletionStream) {
  Start();
  auto res = Post("/v1/completions", R"({"prompt": "p", "stream": true})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  std::vector<json> events = Events(res->body, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 4u);  // three texts, then the finish
  std::string text;
  for (const json& event : events) {
    EXPECT_EQ(event["object"], "text_completion");
    EXPECT_EQ(event["id"], events[0]["id"]);
    EXPECT_FALSE(event.contains("usage"));
    text += event["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Hello world");
  EXPECT_TRUE(events[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpFrontTest, ChatStreamWithUsage) {
  Start();
  auto res = Post("/v1/chat/completions",
                  R"({"messages": [{"role": "user", "content": "p"}], "stream": true,
                      "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(res);
  bool done = false;
  std::vector<json> events = Events(res->body, &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(events.size(), 6u);  // role, three contents, finish, usage
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
    EXPECT_TRUE(events[i]["usage"].is_null());
    text += events[i]["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "Hello world");
  EXPECT_EQ(events[4]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(events[5]["choices"].empty());
  EXPECT_EQ(events[5]["usage"], json({{"prompt_tokens", 4},
                                      {"completion_tokens", 3},
                                      {"total_tokens", 7},
                                      {"prompt_tokens_details", {{"cached_tokens", 0}}}}));
}

TEST_F(HttpFrontTest, GrpcErrorsBecomeHttpStatuses) {
  Start();
  const std::pair<grpc::StatusCode, int> cases[] = {
      {grpc::StatusCode::INVALID_ARGUMENT, 400}, {grpc::StatusCode::UNAUTHENTICATED, 401},
      {grpc::StatusCode::NOT_FOUND, 404},        {grpc::StatusCode::RESOURCE_EXHAUSTED, 429},
      {grpc::StatusCode::UNAVAILABLE, 503},      {grpc::StatusCode::DEADLINE_EXCEEDED, 504},
      {grpc::StatusCode::INTERNAL, 500},
  };
  for (const auto& [code, status] : cases) {
    for (const char* stream : {"false", "true"}) {
      auto res =
          Post("/v1/completions", absl::StrCat(R"({"prompt": "fail:)", static_cast<int>(code),
                                               R"(", "stream": )", stream, "}"));
      ASSERT_TRUE(res);
      EXPECT_EQ(res->status, status) << code << " stream " << stream;
      EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
      json body = json::parse(res->body);
      EXPECT_EQ(body["error"]["message"], "scripted failure");
      EXPECT_EQ(res->has_header("Retry-After"), status == 429 || status == 503);
    }
  }
}

TEST_F(HttpFrontTest, ErrorAfterTheStreamStartedIsAnEvent) {
  Start();
  auto res = Post("/v1/completions", R"({"prompt": "late-fail", "stream": true})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  bool done = false;
  std::vector<json> events = Events(res->body, &done);
  EXPECT_FALSE(done);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["error"]["message"], "verifier went away");
  EXPECT_EQ(events[1]["error"]["code"], "unavailable");
}

TEST_F(HttpFrontTest, RequestErrors) {
  Start();
  auto bad_json = Post("/v1/completions", "{nope");
  ASSERT_TRUE(bad_json);
  EXPECT_EQ(bad_json->status, 400);
  EXPECT_THAT(json::parse(bad_json->body)["error"]["message"].get<std::string>(),
              HasSubstr("not valid JSON"));
  auto n17 =
      Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 17})");
  ASSERT_TRUE(n17);
  EXPECT_EQ(n17->status, 400);
  EXPECT_EQ(json::parse(n17->body)["error"]["param"], "n");
  auto unknown = Post("/v1/completions", R"({"model": "gpt-4", "prompt": "x"})");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  json error = json::parse(unknown->body)["error"];
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("this router serves: m"));
  auto no_route = client_->Get("/v1/nothing");
  ASSERT_TRUE(no_route);
  EXPECT_EQ(no_route->status, 404);
  EXPECT_THAT(json::parse(no_route->body)["error"]["message"].get<std::string>(),
              HasSubstr("/v1/nothing"));
}

TEST_F(HttpFrontTest, ModelsHealthReady) {
  Start();
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "m");
  auto health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto ready = client_->Get("/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
  ready_ = false;
  auto not_ready = client_->Get("/ready");
  ASSERT_TRUE(not_ready);
  EXPECT_EQ(not_ready->status, 503);
}

TEST_F(HttpFrontTest, ApiKeys) {
  Start({"k1", "k2"});
  const std::string body = R"({"prompt": "p"})";
  auto missing = Post("/v1/completions", body);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], "invalid_api_key");
  auto wrong = Post("/v1/completions", body, {{"Authorization", "Bearer k3"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  auto good = Post("/v1/completions", body, {{"Authorization", "Bearer k2"}});
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  // The key travels on to the Generation service, which checks it too.
  EXPECT_EQ(service_.last_authorization(), "Bearer k2");
  auto health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto ready = client_->Get("/ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->status, 200);
}

TEST_F(HttpFrontTest, ClientThatGoesAwayCancelsTheUpstreamCall) {
  Start();
  int chunks = 0;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.body = R"({"prompt": "slow", "stream": true})";
  request.set_header("Content-Type", "application/json");
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 3;  // hang up after a few chunks
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  client_->send(request, response, error);
  EXPECT_GE(chunks, 3);
  EXPECT_TRUE(WaitFor(service_.slow_cancelled_));
}

// Tool calls in the syntax the model's verifier names: the constraint asks for it and the
// response is read in it; a syntax this router does not know is a 500 that says so.
TEST_F(HttpFrontTest, ToolCallsFollowTheModelsSyntax) {
  service_.set_tool_call_syntax("mistral");
  Start();
  const std::string body = R"({"messages": [{"role": "user", "content": "time?"}],
      "tools": [{"type": "function", "function": {"name": "get_time"}}]})";
  auto whole = Post("/v1/chat/completions", body);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json response = json::parse(whole->body);
  EXPECT_EQ(response["choices"][0]["finish_reason"], "tool_calls") << whole->body;
  EXPECT_EQ(response["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time");
  const json format = json::parse(service_.last_request().response_format().schema())["format"];
  EXPECT_EQ(format["triggers"][0], "[TOOL_CALLS]");
  service_.set_tool_call_syntax("pythonic");
  auto unknown = Post("/v1/chat/completions", body);
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 500);
  EXPECT_THAT(unknown->body, HasSubstr("pythonic"));
}

// A non-streaming client that hangs up while its completion is generated cancels the upstream
// call. Before, cpp-httplib noticed only when it wrote the response, so the generation ran to
// max_tokens.
TEST_F(HttpFrontTest, NonStreamingClientThatGoesAwayCancelsTheUpstreamCall) {
  Start();
  const int fd = Connect();
  const std::string body = R"({"prompt": "slow"})";
  const std::string request =
      absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                   "Content-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  ASSERT_TRUE(WaitFor(service_.slow_started_));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(service_.slow_cancelled_);  // the client still waits
  close(fd);
  EXPECT_TRUE(WaitFor(service_.slow_cancelled_));
  // The front serves on.
  auto whole = Post("/v1/completions", R"({"prompt": "hi"})");
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->status, 200) << whole->body;
}

// Slow clients (issue: a few hundred connections sending their request a byte a second held
// every thread of a fixed pool, and /health waited for them to time out): 32 connections that
// sent half a request header and then nothing, four times the old pool of 8, leave /health and
// a completion served at once.
TEST_F(HttpFrontTest, HalfSentRequestsDoNotBlockOtherClients) {
  Start();
  const std::string& address = front_->address();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  std::vector<int> sockets;
  for (int i = 0; i < 32; ++i) {
    const int fd = Connect();
    const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le";
    ASSERT_EQ(send(fd, half.data(), half.size(), 0), static_cast<ssize_t>(half.size()));
    sockets.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all of them accepted
  httplib::Client quick("127.0.0.1", port);
  quick.set_connection_timeout(2, 0);
  quick.set_read_timeout(2, 0);  // under cpp-httplib's 5 s server read timeout
  const auto start = std::chrono::steady_clock::now();
  auto health = quick.Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  auto completion = quick.Post("/v1/completions", R"({"prompt": "hi"})", "application/json");
  ASSERT_TRUE(completion) << httplib::to_string(completion.error());
  EXPECT_EQ(completion->status, 200) << completion->body;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  for (int fd : sockets) close(fd);
}

// Whether the front closed `fd` (or reset it) within `within`, sending one more byte of an endless
// request header every 200 ms meanwhile: under cpp-httplib's 5 s between reads, never a whole
// request. Sets *elapsed to the time it took.
bool ClosedWhileTrickling(int fd, std::chrono::milliseconds within,
                          std::chrono::milliseconds* elapsed) {
  const auto start = std::chrono::steady_clock::now();
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  if (send(fd, head.data(), head.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(head.size())) {
    return false;
  }
  while (std::chrono::steady_clock::now() - start < within) {
    pollfd poll_fd{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    if (poll(&poll_fd, 1, 200) > 0) {  // closed: nothing else is ever sent before the request
      *elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      return true;
    }
    if (send(fd, "a", 1, MSG_NOSIGNAL) != 1) {
      *elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - start);
      return true;
    }
  }
  return false;
}

// Slow clients, the rest (issue: a client that trickles its request never meets cpp-httplib's
// 5 s timeout between reads, and holds its thread for good): with a 1 s request timeout, a
// connection trickling a header a byte per 200 ms is closed after about a second, and the
// front serves on.
TEST_F(HttpFrontTest, ARequestTrickledPastTheTimeoutIsClosed) {
  Start({}, absl::Seconds(1));
  const int fd = Connect();
  std::chrono::milliseconds elapsed{0};
  EXPECT_TRUE(ClosedWhileTrickling(fd, std::chrono::seconds(4), &elapsed));
  EXPECT_GE(elapsed.count(), 900);
  EXPECT_LT(elapsed.count(), 4000);
  EXPECT_EQ(front_->requests_timed_out(), 1);
  EXPECT_EQ(timeouts_, 1);  // the router's metric counts through this
  close(fd);
  auto whole = Post("/v1/completions", R"({"prompt": "hi"})");
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->status, 200) << whole->body;
}

// The timeout is for receiving requests: a stream that lasts past it, and the next request on
// the same kept-alive connection, are served whole.
TEST_F(HttpFrontTest, TheRequestTimeoutDoesNotCutAStreamOrTheNextRequest) {
  Start({}, absl::Seconds(1));
  size_t received = 0;
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/completions";
  request.set_header("Content-Type", "application/json");
  request.body = R"({"prompt": "slow", "stream": true})";
  const auto start = std::chrono::steady_clock::now();
  request.content_receiver = [&](const char*, size_t length, uint64_t, uint64_t) {
    received += length;
    return std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500);
  };
  client_->set_keep_alive(true);
  auto streamed = client_->send(request);
  // Ended by the receiver (canceled), not by the front closing the connection (a read error).
  EXPECT_EQ(streamed.error(), httplib::Error::Canceled) << httplib::to_string(streamed.error());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2500));
  EXPECT_GT(received, 0u);
  EXPECT_TRUE(WaitFor(service_.slow_cancelled_));
  // Kept-alive requests 0.7 s apart on one connection, past the timeout in all, are served
  // (each request's clock starts when the previous response ends).
  for (int i = 0; i < 3; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(700));
    auto whole = Post("/v1/completions", R"({"prompt": "hi"})");
    ASSERT_TRUE(whole) << httplib::to_string(whole.error());
    EXPECT_EQ(whole->status, 200) << whole->body;
  }
  EXPECT_EQ(front_->requests_timed_out(), 0);
}

TEST(SplitHostPortTest, Forms) {
  auto v4 = SplitHostPort("127.0.0.1:8471");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->first, "127.0.0.1");
  EXPECT_EQ(v4->second, 8471);
  auto v6 = SplitHostPort("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  EXPECT_FALSE(SplitHostPort("localhost").ok());
  EXPECT_FALSE(SplitHostPort(":80").ok());
  EXPECT_FALSE(SplitHostPort("h:70000").ok());
}

}  // namespace
}  // namespace tandem
