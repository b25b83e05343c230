// The OpenAI-compatible API's response side: whole responses, stream chunks, errors and the
// model list in OpenAI's shapes (http_openai.h). Requests: http_openai_request.cc.
#include "services/router/http_openai.h"

#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::http {

namespace {

using nlohmann::json;

const char* ObjectName(Api api, bool chunk) {
  if (api == Api::kCompletions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json Base(Api api, const ResponseMeta& meta, bool chunk) {
  return json{{"id", meta.id},
              {"object", ObjectName(api, chunk)},
              {"created", meta.created},
              {"model", meta.model}};
}

json FinishReason(const std::string& finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
    case 408:
    case 413:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

const char* CodeName(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_argument";
    case 401:
      return "unauthenticated";
    case 403:
      return "permission_denied";
    case 404:
      return "not_found";
    case 408:
      return "request_timeout";
    case 413:
      return "payload_too_large";
    case 429:
      return "resource_exhausted";
    case 499:
      return "cancelled";
    case 503:
      return "unavailable";
    case 504:
      return "deadline_exceeded";
    default:
      return "internal";
  }
}

// Whether `bytes` is well-formed UTF-8.
bool IsUtf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > bytes.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(bytes[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// A token as text: its bytes when they are UTF-8, else "bytes:\xNN..." (OpenAI's spelling of a
// token that is part of a character).
std::string TokenString(std::string_view bytes) {
  if (IsUtf8(bytes)) return std::string(bytes);
  std::string out = "bytes:";
  for (unsigned char c : bytes) absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
  return out;
}

json ByteList(std::string_view bytes) {
  json list = json::array();
  for (unsigned char c : bytes) list.push_back(static_cast<int>(c));
  return list;
}

}  // namespace

std::string NewResponseId(Api api) {
  thread_local std::mt19937_64 random{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = api == Api::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id.push_back(kHex[random() % 16]);
  return id;
}

void Collect(const v1::GenerateResponse& message, Collected* collected) {
  collected->text += message.text();
  collected->logprobs.MergeFrom(message.logprobs());
  collected->prompt_logprobs.MergeFrom(message.prompt_logprobs());
  if (!message.finish_reason().empty()) {
    collected->finish_reason = message.finish_reason();
    collected->usage = message.usage();
  }
  if (!message.mode().empty()) collected->mode = message.mode();
  collected->lossy = collected->lossy || message.lossy();
}

json LogprobsJson(Api api, const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs,
                  int64_t* text_offset) {
  if (api == Api::kChat) {
    json content = json::array();
    for (const v1::TokenLogprob& l : logprobs) {
      json top = json::array();
      for (const v1::TopLogprob& t : l.top()) {
        top.push_back({{"token", TokenString(t.token())},
                       {"logprob", t.logprob()},
                       {"bytes", ByteList(t.token())}});
      }
      content.push_back({{"token", TokenString(l.token())},
                         {"logprob", l.logprob()},
                         {"bytes", ByteList(l.token())},
                         {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array();
  json token_logprobs = json::array();
  json top_logprobs = json::array();
  json offsets = json::array();
  for (const v1::TokenLogprob& l : logprobs) {
    const std::string token = TokenString(l.token());
    tokens.push_back(token);
    if (!l.has_logprob()) {  // an echoed prompt's first token
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
    } else {
      token_logprobs.push_back(l.logprob());
      // The chosen token and the alternatives, as OpenAI's legacy shape (token -> logprob).
      json top = json::object();
      top[token] = l.logprob();
      for (const v1::TopLogprob& t : l.top()) top[TokenString(t.token())] = t.logprob();
      top_logprobs.push_back(std::move(top));
    }
    offsets.push_back(*text_offset);
    *text_offset += static_cast<int64_t>(l.token().size());
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

json UsageJson(const v1::Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens()},
              {"completion_tokens", usage.completion_tokens()},
              {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()},
              {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens()}}}};
}

std::string PromptText(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& prompt) {
  std::string text;
  for (const v1::TokenLogprob& l : prompt) text += l.token();
  return text;
}

double MeanLogprob(const Collected& collected) {
  if (collected.logprobs.empty()) return -std::numeric_limits<double>::infinity();
  double sum = 0;
  for (const v1::TokenLogprob& l : collected.logprobs) sum += l.logprob();
  return sum / collected.logprobs.size();
}

v1::Usage TotalUsage(const std::vector<v1::Usage>& choices) {
  v1::Usage total;
  if (choices.empty()) return total;
  total.set_prompt_tokens(choices[0].prompt_tokens());
  for (const v1::Usage& u : choices) {
    total.set_completion_tokens(total.completion_tokens() + u.completion_tokens());
    total.set_cached_tokens(std::max(total.cached_tokens(), u.cached_tokens()));
  }
  return total;
}

json FinalResponse(Api api, const ResponseMeta& meta, const std::vector<Collected>& choices,
                   const v1::Usage& usage) {
  json response = Base(api, meta, /*chunk=*/false);
  json out = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Collected& collected = choices[i];
    // echo: the prompt's tokens lead the text and the logprobs.
    google::protobuf::RepeatedPtrField<v1::TokenLogprob> logprobs = collected.prompt_logprobs;
    logprobs.MergeFrom(collected.logprobs);
    int64_t text_offset = 0;
    json choice = {
        {"index", i},
        {"logprobs", meta.logprobs ? LogprobsJson(api, logprobs, &text_offset) : json(nullptr)},
        {"finish_reason", FinishReason(collected.finish_reason)}};
    if (api == Api::kChat && meta.tool_calls) {
      ParsedToolCalls parsed = ParseToolCalls(collected.text, meta.tool_syntax);
      json calls = json::array();
      for (const ToolCall& call : parsed.calls) calls.push_back(ToolCallJson(call));
      choice["message"] = {
          {"role", "assistant"},
          {"content", parsed.content.empty() ? json(nullptr) : json(parsed.content)}};
      if (!calls.empty()) {
        choice["message"]["tool_calls"] = std::move(calls);
        if (collected.finish_reason == "stop") choice["finish_reason"] = "tool_calls";
      }
    } else if (api == Api::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", collected.text}};
    } else {
      choice["text"] = PromptText(collected.prompt_logprobs) + collected.text;
    }
    out.push_back(std::move(choice));
  }
  response["choices"] = std::move(out);
  response["usage"] = UsageJson(usage);
  // Tandem's own: the decoding mode that served the request, and whether it is lossy.
  if (!choices.empty()) {
    response["tandem"] = {{"mode", choices[0].mode}, {"lossy", choices[0].lossy}};
  }
  return response;
}

json ContentChunk(Api api, const ResponseMeta& meta, const std::string& content,
                  const std::string& finish_reason, bool include_usage, json logprobs, int index) {
  json chunk = Base(api, meta, /*chunk=*/true);
  json choice = {{"index", index},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", FinishReason(finish_reason)}};
  if (api == Api::kChat) {
    choice["delta"] =
        content.empty() && !finish_reason.empty() ? json::object() : json{{"content", content}};
  } else {
    choice["text"] = content;
  }
  chunk["choices"] = json::array({std::move(choice)});
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json DeltaChunk(const ResponseMeta& meta, json delta, bool include_usage, json logprobs,
                int index) {
  json chunk = Base(Api::kChat, meta, /*chunk=*/true);
  chunk["choices"] = json::array({json{{"index", index},
                                       {"delta", std::move(delta)},
                                       {"logprobs", std::move(logprobs)},
                                       {"finish_reason", nullptr}}});
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json RoleChunk(const ResponseMeta& meta, bool include_usage, int index) {
  json chunk = Base(Api::kChat, meta, /*chunk=*/true);
  chunk["choices"] = json::array({json{{"index", index},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json UsageChunk(Api api, const ResponseMeta& meta, const v1::Usage& usage) {
  json chunk = Base(api, meta, /*chunk=*/true);
  chunk["choices"] = json::array();
  chunk["usage"] = UsageJson(usage);
  return chunk;
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SseEvent(const json& data) { return absl::StrCat("data: ", Dump(data), "\n\n"); }

int HttpStatusFor(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

json ErrorBody(int http_status, const std::string& message, const std::string& param,
               const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", ErrorType(http_status)},
                {"param", param.empty() ? json(nullptr) : json(param)},
                {"code", code.empty() ? CodeName(http_status) : code}}}};
}

json ModelsList(const v1::ListModelsResponse& models, int64_t created) {
  json data = json::array();
  for (const v1::ModelInfo& model : models.models()) {
    data.push_back(
        {{"id", model.id()},
         {"object", "model"},
         {"created", created},
         {"owned_by", "tandem"},
         {"modes", std::vector<std::string>(model.modes().begin(), model.modes().end())},
         {"max_context", model.max_context()},
         {"tool_call_syntax",
          model.tool_call_syntax().empty() ? std::string("hermes") : model.tool_call_syntax()}});
  }
  return json{{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace tandem::http
