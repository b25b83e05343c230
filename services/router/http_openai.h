// The OpenAI-compatible wire format of the router's HTTP front: request JSON (/v1/completions,
// /v1/chat/completions) to tandem.v1.GenerateRequest, and GenerateResponse messages back to
// OpenAI's response objects, stream chunks (server-sent events) and error bodies. No network
// here, so the format is testable on its own; http_front.h serves it.
//
// Extensions beyond OpenAI's parameters: `mode` (a decoding mode: ar, spec, ...), `top_k`, `min_p`
// and `stop_token_ids`, a structural_tag response format. Tools are http_tools.h's. Parameters
// Tandem cannot honour (functions, function_call, suffix) are refused with 400 rather than
// silently ignored (docs/HTTP_API.md lists them all).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "nlohmann/json.hpp"
#include "services/router/http_tools.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::http {

enum class Api { kCompletions, kChat };

// OpenAI's default max_tokens for /v1/completions.
inline constexpr int kDefaultCompletionMaxTokens = 16;

// A parsed request: what goes to Generate, and how to answer.
// Choices one request may ask for (n, and best_of for completions).
inline constexpr int kMaxChoices = 16;

struct ParsedRequest {
  v1::GenerateRequest request;
  int n = 1;        // choices returned
  int best_of = 1;  // completions generated (>= n): the n of highest mean token logprob return
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage: one more chunk with usage
  bool max_tokens_set = false;  // false: the caller picks the default (it knows the context)
  // Tools are in play: the calls to constrain (in the model's syntax, ConstrainToTools once the
  // model is known) and to parse the text for (http_tools.h).
  std::optional<ToolRequest> tools;
};

// Parses a request body. InvalidArgument for malformed JSON, a wrong type or an unsupported
// parameter; the message names the parameter and ParamOf() returns it.
absl::StatusOr<ParsedRequest> ParseRequest(Api api, std::string_view body);

// The parameter an error from ParseRequest is about, "" when none.
std::string ParamOf(const absl::Status& status);
// An InvalidArgument about `param` (ParamOf returns it).
absl::Status BadParam(const std::string& param, const std::string& message);

// What every response object of one request shares.
struct ResponseMeta {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool logprobs = false;  // the request asked for logprobs: choices carry them (else null)
  // Chat with tools: a choice's text becomes content and tool_calls (finish_reason
  // "tool_calls" when a call ended it), read in the model's syntax.
  bool tool_calls = false;
  ToolCallSyntax tool_syntax = ToolCallSyntax::kHermes;
};

// A fresh response id for `api` ("cmpl-" or "chatcmpl-" and 24 random hex digits).
std::string NewResponseId(Api api);

// A whole generation, collected from its stream.
struct Collected {
  std::string text;
  std::string finish_reason;
  v1::Usage usage;
  std::string mode;
  bool lossy = false;
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> logprobs;
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> prompt_logprobs;  // echo
};
void Collect(const v1::GenerateResponse& message, Collected* collected);

// An echoed prompt's text: its tokens' bytes.
std::string PromptText(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& prompt);

// The mean logprob of a collected completion's tokens (best_of's ranking); -inf without tokens.
double MeanLogprob(const Collected& collected);

// The usage of a request's choices: the prompt once (cached tokens: the most any choice took
// from the cache), every choice's completion tokens.
v1::Usage TotalUsage(const std::vector<v1::Usage>& choices);

// The non-streaming response object (text_completion or chat.completion), choice i at index i.
nlohmann::json FinalResponse(Api api, const ResponseMeta& meta,
                             const std::vector<Collected>& choices, const v1::Usage& usage);

// Stream chunks. `content` is the text delta; `finish_reason` is null when empty. Chat's first
// chunk carries only the assistant role (RoleChunk). With include_usage every chunk has
// "usage": null and UsageChunk (no choices) comes last.
nlohmann::json ContentChunk(Api api, const ResponseMeta& meta, const std::string& content,
                            const std::string& finish_reason, bool include_usage,
                            nlohmann::json logprobs = nullptr, int index = 0);
nlohmann::json RoleChunk(const ResponseMeta& meta, bool include_usage, int index = 0);
// A chat chunk with the given delta ({"content": ...} or {"tool_calls": [...]}).
nlohmann::json DeltaChunk(const ResponseMeta& meta, nlohmann::json delta, bool include_usage,
                          nlohmann::json logprobs = nullptr, int index = 0);
nlohmann::json UsageChunk(Api api, const ResponseMeta& meta, const v1::Usage& usage);

// JSON text; invalid UTF-8 (which only a client's own bytes can carry, e.g. quoted in a parse
// error) is replaced rather than thrown on.
std::string Dump(const nlohmann::json& value);

// One server-sent event: "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// The OpenAI "usage" object.
nlohmann::json UsageJson(const v1::Usage& usage);

// A choice's "logprobs" for `logprobs` in `api`'s shape: completions' legacy {tokens,
// token_logprobs, top_logprobs (the chosen token and the alternatives), text_offset (bytes from
// *text_offset on, which advances)}, or chat's {content: [{token, logprob, bytes, top_logprobs}]}.
// A token that is part of a UTF-8 character is spelled "bytes:\xNN...".
nlohmann::json LogprobsJson(Api api,
                            const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs,
                            int64_t* text_offset);

// Errors. HTTP status from a gRPC code: INVALID_ARGUMENT 400, UNAUTHENTICATED 401,
// PERMISSION_DENIED 403, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, CANCELLED 499, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, others 500.
int HttpStatusFor(grpc::StatusCode code);
// {"error": {"message", "type", "param", "code"}}; `param` null when empty, `code` the gRPC
// code's name in lower case unless given.
nlohmann::json ErrorBody(int http_status, const std::string& message, const std::string& param = "",
                         const std::string& code = "");

// GET /v1/models from ListModels: {"object": "list", "data": [{"id", "object": "model",
// "created", "owned_by", "modes", "max_context", "tool_call_syntax"}]}.
nlohmann::json ModelsList(const v1::ListModelsResponse& models, int64_t created);

}  // namespace tandem::http
