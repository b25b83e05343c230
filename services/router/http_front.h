// The router's OpenAI-compatible HTTP API (cpp-httplib): POST /v1/completions and
// /v1/chat/completions (JSON or server-sent events), GET /v1/models, GET /health and GET /ready.
// The wire format is http_openai.h.
//
// Every request goes through the router's own Generation service over an in-process channel
// (grpc::Server::InProcessChannel), so HTTP clients get exactly what gRPC clients get: the same
// validation, admission bound, verifier choice, relay and API-key check (the HTTP Authorization
// header is forwarded as gRPC metadata). gRPC status codes become HTTP statuses
// (http::HttpStatusFor). An error before the first token is an HTTP error; once a stream has
// started (200 sent), an error arrives as a `data: {"error": ...}` event and the stream ends
// without [DONE], as OpenAI does. A client that goes away cancels its upstream calls: while its
// handler waits (queued, or for a whole response) through a ConnectionWatch on its socket
// (connection_watch.h: cpp-httplib 0.11 exposes no connection state to handlers), and once a
// stream has started at its next chunk's failed write.
//
// Connections: each is served on a thread of its own while it lasts (threads are started as
// connections arrive and kept for the next ones), up to `max_connections` at once; more wait for
// one to end. A fixed pool the size of the admission bound let a few hundred clients that send
// their request a byte a second hold every thread, so that /health and every new request waited
// until they timed out; now such clients cost a thread each and the rest are served. A client
// must also send each request, headers and body, within `request_timeout` of connecting or of
// its previous response (request_deadline.h), or its connection is closed: cpp-httplib's own
// timeout is only between two reads, which a client sending a byte every few seconds never
// meets.
//
// Thread-safety: handlers run on those threads (never gRPC's) and block on the in-process call.
// Start/Stop/address from one thread (main).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "services/common/api_keys.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace httplib {
class Server;
}

namespace tandem {

class ConnectionWatch;
class RequestDeadline;

struct HttpFrontOptions {
  std::string listen;  // HOST:PORT; port 0 = chosen by the OS
  // When enabled, every endpoint but /health and /ready needs `Authorization: Bearer KEY`.
  ApiKeys api_keys;
  // /ready answers 200 while this is true (a verifier is up), else 503.
  std::function<bool()> ready;
  // Connections served at once, a thread each; more wait for one to end. Streams and slow
  // clients hold one for their length.
  int max_connections = 1024;
  // The time a connection has to send each request (headers and body); zero: no limit.
  absl::Duration request_timeout = absl::Seconds(60);
  // Called (on the deadline's thread) for each connection closed for missing request_timeout.
  std::function<void()> on_request_timeout;
};

class HttpFront {
 public:
  // Binds and starts serving. `channel` reaches the router's Generation service. Errors name the
  // address (malformed, in use).
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(HttpFrontOptions options,
                                                          std::shared_ptr<grpc::Channel> channel);
  ~HttpFront();

  // host:port clients can reach.
  const std::string& address() const { return address_; }

  // Stops accepting and waits for the handlers in progress. Shut the gRPC server down first (or
  // with a deadline) so that streams in flight end and their handlers return.
  void Stop();

  // Connections closed so far for not sending a request within request_timeout.
  int64_t requests_timed_out() const;

 private:
  HttpFront(HttpFrontOptions options, std::shared_ptr<grpc::Channel> channel);

  HttpFrontOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<ConnectionWatch> watch_;     // outlives the server's handlers
  std::unique_ptr<RequestDeadline> deadline_;  // and this, their Serving handles
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  std::string address_;
};

// Splits "HOST:PORT" ("[::1]:80" for IPv6); InvalidArgument naming `address` otherwise.
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(const std::string& address);

}  // namespace tandem
