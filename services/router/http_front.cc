#include "services/router/http_front.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "httplib.h"
#include "services/router/connection_watch.h"
#include "services/router/http_openai.h"
#include "services/router/http_tools.h"
#include "services/router/request_deadline.h"

namespace tandem {

namespace {

constexpr char kJson[] = "application/json";
// Requests larger than this are refused by cpp-httplib (413) before parsing. The router's own
// limit on the decoded request (request_decode.h) is smaller; JSON escaping can double a prompt.
constexpr size_t kMaxBodyBytes = 32 << 20;
constexpr auto kListModelsTimeout = std::chrono::seconds(10);

// cpp-httplib's task queue with a thread per connection (http_front.h, "Connections"): a
// connection waits only when `max_threads` are busy. Threads start when a connection finds no
// idle one and stay, idle, for later connections; shutdown() lets the queued connections run,
// then joins every thread.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {}
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(fn));
    // Each idle thread takes one job; start a thread for a job no idle one will take.
    if (jobs_.size() > idle_ && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    for (std::thread& thread : threads) thread.join();
  }

 private:
  void Work() {
    absl::MutexLock lock(&mu_);
    while (true) {
      ++idle_;
      mu_.Await(absl::Condition(
          +[](ConnectionThreads* self) { return !self->jobs_.empty() || self->stopping_; }, this));
      --idle_;
      if (jobs_.empty()) return;  // stopping, and every queued connection served
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      mu_.Unlock();
      job();
      mu_.Lock();
    }
  }

  const size_t max_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

void SendError(httplib::Response& res, int http_status, const std::string& message,
               const std::string& param = "", const std::string& code = "") {
  res.status = http_status;
  if (http_status == 429 || http_status == 503) res.set_header("Retry-After", "1");
  res.set_content(http::Dump(http::ErrorBody(http_status, message, param, code)), kJson);
}

void SendGrpcError(httplib::Response& res, const grpc::Status& status) {
  SendError(res, http::HttpStatusFor(status.error_code()), status.error_message());
}

// One Generate call on the in-process channel. The destructor cancels a call that has not
// finished, so a handler that returns early (the client went away) stops the verifier's work.
class UpstreamCall {
 public:
  UpstreamCall(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
               const std::string& authorization) {
    if (!authorization.empty()) context_.AddMetadata("authorization", authorization);
    reader_ = stub.Generate(&context_, request);
  }
  ~UpstreamCall() { Cancel(); }

  bool Read(v1::GenerateResponse* message) { return !finished_ && reader_->Read(message); }

  // After Read returned false.
  grpc::Status Finish() {
    if (!finished_) {
      finished_ = true;
      status_ = reader_->Finish();
    }
    return status_;
  }

  // From any thread: ends the call, whose Read then returns false and Finish CANCELLED.
  void Interrupt() { context_.TryCancel(); }

  void Cancel() {
    if (finished_) return;
    context_.TryCancel();
    v1::GenerateResponse ignored;
    while (reader_->Read(&ignored)) {
    }
    Finish();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  bool finished_ = false;
  grpc::Status status_;
};

// The state of one streaming response, driven by cpp-httplib's content provider on the
// connection's thread. With n choices, each choice's stream is relayed whole, one after
// another (they generate concurrently upstream; chunks carry their choice's index).
struct SseStream {
  http::Api api = http::Api::kCompletions;
  http::ResponseMeta meta;
  bool include_usage = false;
  std::vector<std::unique_ptr<UpstreamCall>> calls;
  std::vector<std::optional<v1::GenerateResponse>> firsts;  // read before the status line
  size_t current = 0;                                       // the choice being relayed
  bool role_sent = false;
  std::string finish_reason;
  std::vector<v1::Usage> usages;
  int64_t text_offset = 0;          // completions' logprobs text_offset of the next token
  http::ToolCallStream tool_calls;  // chat with tools (meta.tool_calls): calls out of the text

  // Writes what the next upstream message gives; false when the client is gone.
  bool Next(httplib::DataSink& sink) {
    std::string out;
    const int index = static_cast<int>(current);
    if (api == http::Api::kChat && !role_sent) {
      out += http::SseEvent(http::RoleChunk(meta, include_usage, index));
      role_sent = true;
    }
    UpstreamCall& call = *calls[current];
    v1::GenerateResponse message;
    bool have = false;
    if (firsts[current].has_value()) {
      message = std::move(*firsts[current]);
      firsts[current].reset();
      have = true;
    } else {
      have = call.Read(&message);
    }
    if (have) {
      if (message.prompt_logprobs_size() > 0) {  // echo: the prompt first
        nlohmann::json logprobs =
            meta.logprobs ? http::LogprobsJson(api, message.prompt_logprobs(), &text_offset)
                          : nullptr;
        out += http::SseEvent(http::ContentChunk(api, meta,
                                                 http::PromptText(message.prompt_logprobs()), "",
                                                 include_usage, std::move(logprobs), index));
      }
      // A chunk for new text, or for tokens whose logprobs were asked for (a stop token, or
      // text held back, has none).
      if (!message.text().empty() || (meta.logprobs && message.logprobs_size() > 0)) {
        nlohmann::json logprobs =
            meta.logprobs ? http::LogprobsJson(api, message.logprobs(), &text_offset) : nullptr;
        if (meta.tool_calls) {
          std::vector<nlohmann::json> deltas = tool_calls.Push(message.text());
          if (deltas.empty() && !logprobs.is_null()) deltas.push_back({{"content", ""}});
          for (nlohmann::json& delta : deltas) {
            out += http::SseEvent(http::DeltaChunk(meta, std::move(delta), include_usage,
                                                   std::move(logprobs), index));
            logprobs = nullptr;
          }
        } else {
          out += http::SseEvent(http::ContentChunk(api, meta, message.text(), "", include_usage,
                                                   std::move(logprobs), index));
        }
      }
      if (!message.finish_reason().empty()) {
        finish_reason = message.finish_reason();
        usages.push_back(message.usage());
      }
      return out.empty() || sink.write(out.data(), out.size());
    }
    const grpc::Status status = call.Finish();
    if (!status.ok()) {
      out += http::SseEvent(
          http::ErrorBody(http::HttpStatusFor(status.error_code()), status.error_message()));
      if (!sink.write(out.data(), out.size())) return false;
      sink.done();
      return true;
    }
    if (meta.tool_calls) {
      for (nlohmann::json& delta : tool_calls.Finish()) {
        out +=
            http::SseEvent(http::DeltaChunk(meta, std::move(delta), include_usage, nullptr, index));
      }
      if (tool_calls.called() && finish_reason == "stop") finish_reason = "tool_calls";
    }
    out += http::SseEvent(
        http::ContentChunk(api, meta, "", finish_reason, include_usage, nullptr, index));
    if (++current < calls.size()) {  // the next choice
      role_sent = false;
      text_offset = 0;
      finish_reason.clear();
      tool_calls = http::ToolCallStream(meta.tool_syntax);
      return sink.write(out.data(), out.size());
    }
    if (include_usage) out += http::SseEvent(http::UsageChunk(api, meta, http::TotalUsage(usages)));
    out += std::string(http::kSseDone);
    if (!sink.write(out.data(), out.size())) return false;
    sink.done();
    return true;
  }

  void Cancel() {
    for (auto& call : calls) call->Cancel();
  }
};

class Handlers {
 public:
  Handlers(const HttpFrontOptions* options, v1::Generation::Stub* stub, ConnectionWatch* watch)
      : options_(options),
        stub_(stub),
        watch_(watch),
        created_(static_cast<int64_t>(std::time(nullptr))) {}

  // Set once, after binding and before the first request.
  void set_deadline(RequestDeadline* deadline) { deadline_ = deadline; }

  // Stops the request deadline's clock on this request's connection while the handle lives.
  std::shared_ptr<RequestDeadline::Serving> Serve(const httplib::Request& req) const {
    if (deadline_ == nullptr) return nullptr;
    return deadline_->Serve(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
  }

  // False (and the 401 written) when API keys are on and the request carries none of them.
  bool Authorize(const httplib::Request& req, httplib::Response& res) const {
    absl::Status status = options_->api_keys.Check(req.get_header_value("Authorization"));
    if (status.ok()) return true;
    SendError(res, 401, std::string(status.message()), "", "invalid_api_key");
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }

  // The Authorization header for the Generation service, which checks it again. Only a key
  // this router knows is forwarded: without keys, a client's arbitrary header (the OpenAI client
  // always sends one) could hold bytes gRPC metadata does not allow.
  std::string Forwarded(const httplib::Request& req) const {
    return options_->api_keys.enabled() ? req.get_header_value("Authorization") : std::string();
  }

  grpc::Status ListModels(const std::string& authorization, v1::ListModelsResponse* reply) const {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kListModelsTimeout);
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
    return stub_->ListModels(&context, v1::ListModelsRequest(), reply);
  }

  void Models(const httplib::Request& req, httplib::Response& res) const {
    const std::shared_ptr<RequestDeadline::Serving> serving = Serve(req);
    if (!Authorize(req, res)) return;
    v1::ListModelsResponse reply;
    grpc::Status status = ListModels(Forwarded(req), &reply);
    if (!status.ok()) return SendGrpcError(res, status);
    res.set_content(http::Dump(http::ModelsList(reply, created_)), kJson);
  }

  void Ready(httplib::Response& res) const {
    const bool ready = options_->ready && options_->ready();
    res.status = ready ? 200 : 503;
    res.set_content(ready ? "ready\n" : "no verifier is up\n", "text/plain");
  }

  void Generate(http::Api api, const httplib::Request& req, httplib::Response& res) const {
    std::shared_ptr<RequestDeadline::Serving> serving = Serve(req);  // a stream's: to its end
    if (!Authorize(req, res)) return;
    absl::StatusOr<http::ParsedRequest> parsed = http::ParseRequest(api, req.body);
    if (!parsed.ok()) {
      return SendError(res, 400, std::string(parsed.status().message()),
                       http::ParamOf(parsed.status()));
    }
    const std::string authorization = Forwarded(req);
    v1::GenerateRequest& request = parsed->request;

    // The model's description gives the response its `model`, chat its default max_tokens (the
    // rest of the context, as OpenAI does) and an unknown model OpenAI's 404.
    v1::ListModelsResponse models;
    grpc::Status listed = ListModels(authorization, &models);
    if (!listed.ok()) return SendGrpcError(res, listed);
    const v1::ModelInfo* model = nullptr;
    for (const v1::ModelInfo& info : models.models()) {
      if (info.id() == request.model() || (request.model().empty() && models.models_size() == 1)) {
        model = &info;
      }
    }
    if (model == nullptr && !request.model().empty()) {
      std::vector<std::string> ids;
      for (const v1::ModelInfo& info : models.models()) ids.push_back(info.id());
      return SendError(
          res, 404,
          absl::StrCat("The model '", request.model(), "' does not exist; this router serves: ",
                       ids.empty() ? "none yet" : absl::StrJoin(ids, ", ")),
          "model", "model_not_found");
    }
    if (!parsed->max_tokens_set && api == http::Api::kChat) {
      // Chat's default is the rest of the context (completions': kDefaultCompletionMaxTokens,
      // set by ParseRequest). Without a model, Generate answers why (no verifier yet, several
      // models).
      request.set_max_tokens(model != nullptr ? std::max(1, model->max_context() - 1)
                                              : http::kDefaultCompletionMaxTokens);
    }
    // Tool calls in the syntax the model's chat template teaches.
    ToolCallSyntax syntax = ToolCallSyntax::kHermes;
    if (parsed->tools.has_value()) {
      absl::StatusOr<ToolCallSyntax> known =
          ToolCallSyntaxOf(model != nullptr ? model->tool_call_syntax() : "");
      if (!known.ok()) {
        return SendError(res, 500,
                         absl::StrCat("the verifier's tool call syntax is unknown to this router: ",
                                      known.status().message()));
      }
      syntax = *known;
      absl::Status constrained = http::ConstrainToTools(*parsed->tools, syntax, &request);
      if (!constrained.ok()) {
        return SendError(res, 400, std::string(constrained.message()), http::ParamOf(constrained));
      }
    }
    // logprobs as asked: best_of's own ranking logprobs stay hidden.
    http::ResponseMeta meta{.id = http::NewResponseId(api),
                            .created = static_cast<int64_t>(std::time(nullptr)),
                            .model = model != nullptr ? model->id() : request.model(),
                            .logprobs = request.logprobs(),
                            .tool_calls = parsed->tools.has_value(),
                            .tool_syntax = syntax};
    request.set_request_id(meta.id);

    // One call per completion (best_of of them): they share the prompt's KV when they land on
    // one verifier, which prefix affinity makes likely. A seeded request's choice i uses seed
    // + i, so each choice is reproducible and the choices differ.
    const bool ranked = parsed->best_of > parsed->n;
    if (ranked) request.set_logprobs(true);  // the ranking reads them
    std::vector<std::unique_ptr<UpstreamCall>> calls;
    for (int i = 0; i < parsed->best_of; ++i) {
      v1::GenerateRequest choice = request;
      if (request.sampling().has_seed()) {
        choice.mutable_sampling()->set_seed(request.sampling().seed() + static_cast<uint64_t>(i));
      }
      if (parsed->best_of > 1) choice.set_request_id(absl::StrCat(meta.id, "-", i));
      calls.push_back(std::make_unique<UpstreamCall>(*stub_, choice, authorization));
    }
    // A client that hangs up while it waits (queued, or for a whole response) cancels the calls;
    // a stream's calls, once moved to its content provider, end at its first failed write.
    const std::unique_ptr<ConnectionWatch::Watched> watched = WatchClient(req, calls);
    // The first messages decide the status line: an error before any output is an HTTP error.
    std::vector<std::optional<v1::GenerateResponse>> firsts(calls.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      v1::GenerateResponse first;
      if (calls[i]->Read(&first)) {
        firsts[i] = std::move(first);
      } else {
        grpc::Status status = calls[i]->Finish();
        if (!status.ok()) return SendGrpcError(res, status);
      }
    }
    if (!parsed->stream) {
      std::vector<http::Collected> choices(calls.size());
      std::vector<v1::Usage> usages;
      for (size_t i = 0; i < calls.size(); ++i) {
        if (firsts[i].has_value()) http::Collect(*firsts[i], &choices[i]);
        v1::GenerateResponse message;
        while (calls[i]->Read(&message)) http::Collect(message, &choices[i]);
        grpc::Status status = calls[i]->Finish();
        if (!status.ok()) return SendGrpcError(res, status);
        usages.push_back(choices[i].usage);
      }
      if (ranked) {
        std::stable_sort(choices.begin(), choices.end(),
                         [](const http::Collected& a, const http::Collected& b) {
                           return http::MeanLogprob(a) > http::MeanLogprob(b);
                         });
        choices.resize(static_cast<size_t>(parsed->n));
      }
      res.set_content(http::Dump(http::FinalResponse(api, meta, choices, http::TotalUsage(usages))),
                      kJson);
      return;
    }
    auto stream = std::make_shared<SseStream>();
    stream->api = api;
    stream->tool_calls = http::ToolCallStream(meta.tool_syntax);
    stream->meta = std::move(meta);
    stream->include_usage = parsed->include_usage;
    stream->calls = std::move(calls);
    stream->firsts = std::move(firsts);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream](size_t /*offset*/, httplib::DataSink& sink) { return stream->Next(sink); },
        [stream, serving = std::move(serving)](bool success) {
          // The client went away mid-stream: stop the verifiers' work now.
          if (!success) stream->Cancel();
        });
  }

 private:
  // Null when the connection's socket is not found (then the response's write notices).
  std::unique_ptr<ConnectionWatch::Watched> WatchClient(
      const httplib::Request& req, const std::vector<std::unique_ptr<UpstreamCall>>& calls) const {
    const int fd =
        FindConnectionSocket(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    if (fd < 0) return nullptr;
    return watch_->Watch(fd, [&calls] {
      for (const auto& call : calls) call->Interrupt();
    });
  }

  const HttpFrontOptions* options_;
  v1::Generation::Stub* stub_;
  ConnectionWatch* watch_;
  RequestDeadline* deadline_ = nullptr;  // null: no deadline
  const int64_t created_;                // the `created` of every model in /v1/models
};

}  // namespace

absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT (e.g. 127.0.0.1:8471, port 0 = any)"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

HttpFront::HttpFront(HttpFrontOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Generation::NewStub(channel_)),
      server_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(
    HttpFrontOptions options, std::shared_ptr<grpc::Channel> channel) {
  absl::StatusOr<std::pair<std::string, int>> host_port = SplitHostPort(options.listen);
  if (!host_port.ok()) return host_port.status();
  std::unique_ptr<HttpFront> front(new HttpFront(std::move(options), std::move(channel)));
  absl::StatusOr<std::unique_ptr<ConnectionWatch>> watch = ConnectionWatch::Create();
  if (!watch.ok()) return watch.status();
  front->watch_ = *std::move(watch);
  httplib::Server& server = *front->server_;
  const size_t max_connections = static_cast<size_t>(std::max(1, front->options_.max_connections));
  server.new_task_queue = [max_connections] { return new ConnectionThreads(max_connections); };
  server.set_payload_max_length(kMaxBodyBytes);

  // The handlers share the front's options and stub, which outlive the server's threads.
  auto handlers =
      std::make_shared<Handlers>(&front->options_, front->stub_.get(), front->watch_.get());
  server.Post("/v1/completions", [handlers](const httplib::Request& req, httplib::Response& res) {
    handlers->Generate(http::Api::kCompletions, req, res);
  });
  server.Post("/v1/chat/completions",
              [handlers](const httplib::Request& req, httplib::Response& res) {
                handlers->Generate(http::Api::kChat, req, res);
              });
  server.Get("/v1/models", [handlers](const httplib::Request& req, httplib::Response& res) {
    handlers->Models(req, res);
  });
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server.Get("/ready",
             [handlers](const httplib::Request&, httplib::Response& res) { handlers->Ready(res); });
  // Unknown routes and cpp-httplib's own refusals (413, 400) get an OpenAI-shaped body too.
  server.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                   httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string message =
        res.status == 404   ? absl::StrCat("no route for ", req.method, " ", req.path)
        : res.status == 413 ? absl::StrCat("the request body exceeds ", kMaxBodyBytes >> 20, " MiB")
                            : absl::StrCat("HTTP ", res.status);
    res.set_content(http::Dump(http::ErrorBody(res.status, message)), kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        SendError(res, 500, absl::StrCat("the router failed on this request: ", what));
      });

  const auto& [host, port] = *host_port;
  int bound = port;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
    if (bound <= 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", host, ":0"));
    }
  } else if (!server.bind_to_port(host, port)) {
    return absl::UnavailableError(absl::StrCat("cannot listen for HTTP on ", front->options_.listen,
                                               " (address in use or not local?)"));
  }
  front->address_ =
      absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":", bound);
  if (front->options_.request_timeout > absl::ZeroDuration()) {
    front->deadline_ = std::make_unique<RequestDeadline>(bound, front->options_.request_timeout,
                                                         front->options_.on_request_timeout);
    handlers->set_deadline(front->deadline_.get());
  }
  front->listener_ = std::thread([&server] { server.listen_after_bind(); });
  // Stop() before the loop runs would not stop it.
  for (int i = 0; i < 1000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return front;
}

void HttpFront::Stop() {
  if (!listener_.joinable()) return;
  server_->stop();
  listener_.join();
}

HttpFront::~HttpFront() { Stop(); }

int64_t HttpFront::requests_timed_out() const {
  return deadline_ != nullptr ? deadline_->expired() : 0;
}

}  // namespace tandem
