// libFuzzer target for the router's HTTP front parser (services/router/http_openai.h): the first
// byte picks /v1/completions or /v1/chat/completions, the rest is the request body. Parsing may
// refuse (InvalidArgument naming the parameter), never crash or hang. A body that parses becomes
// a GenerateRequest that the router's checks take as they take a gRPC request, and that
// survives the wire: serialised and decoded as the router's raw Generate method decodes it
// (services/router/request_decode.h), it is the same message. The body is also read as a
// completion's text for tool calls (services/router/http_tools.h) in every syntax, whole and
// streamed in two pieces: both must find the same calls.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "router/request_check.h"
#include "services/router/http_openai.h"
#include "services/router/http_tools.h"
#include "services/router/request_decode.h"

namespace {

const tandem::router::ModelDescription& Model() {
  static const tandem::router::ModelDescription model{
      .id = "tandem-target", .modes = {"ar", "spec", "jacobi"}, .max_context = 4096};
  return model;
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "openai_request_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const tandem::http::Api api =
      data[0] % 2 == 0 ? tandem::http::Api::kCompletions : tandem::http::Api::kChat;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  for (const tandem::ToolCallSyntax syntax : tandem::kToolCallSyntaxes) {
    const tandem::http::ParsedToolCalls calls = tandem::http::ParseToolCalls(body, syntax);
    tandem::http::ToolCallStream stream(syntax);
    size_t streamed = 0;
    const size_t half = body.size() / 2;
    for (const std::string_view piece : {body.substr(0, half), body.substr(half)}) {
      for (const nlohmann::json& delta : stream.Push(piece)) {
        streamed += delta.contains("tool_calls") ? delta["tool_calls"].size() : 0;
      }
    }
    for (const nlohmann::json& delta : stream.Finish()) {
      streamed += delta.contains("tool_calls") ? delta["tool_calls"].size() : 0;
    }
    if (streamed != calls.calls.size()) {
      Fail("streamed tool calls differ from whole",
           std::string(tandem::ToolCallSyntaxName(syntax)) + ": " + std::to_string(streamed) +
               " vs " + std::to_string(calls.calls.size()));
    }
  }

  absl::StatusOr<tandem::http::ParsedRequest> parsed = tandem::http::ParseRequest(api, body);
  if (!parsed.ok()) {
    if (!absl::IsInvalidArgument(parsed.status())) {
      Fail("a refusal that is not InvalidArgument", parsed.status().ToString());
    }
    (void)tandem::http::ParamOf(parsed.status());
    return 0;
  }
  if (parsed->n < 1 || parsed->best_of < parsed->n || parsed->best_of > tandem::http::kMaxChoices) {
    Fail("choices out of range",
         std::to_string(parsed->n) + " of " + std::to_string(parsed->best_of));
  }
  if (parsed->tools.has_value()) {
    for (const tandem::ToolCallSyntax syntax : tandem::kToolCallSyntaxes) {
      tandem::v1::GenerateRequest constrained = parsed->request;
      const absl::Status status =
          tandem::http::ConstrainToTools(*parsed->tools, syntax, &constrained);
      if (!status.ok() && !absl::IsInvalidArgument(status)) {
        Fail("a tools refusal that is not InvalidArgument", status.ToString());
      }
    }
    (void)tandem::http::ConstrainToTools(*parsed->tools, tandem::ToolCallSyntax::kHermes,
                                         &parsed->request);
  }
  (void)tandem::router::CheckRequest(tandem::ToRouterRequest(parsed->request), Model());

  std::string wire;
  if (!parsed->request.SerializeToString(&wire)) Fail("not serialisable", "");
  grpc::Slice slice(wire.data(), wire.size());
  const grpc::ByteBuffer buffer(&slice, 1);
  absl::StatusOr<tandem::v1::GenerateRequest> decoded = tandem::DecodeGenerateRequest(buffer);
  if (!decoded.ok()) Fail("does not decode as the router decodes", decoded.status().ToString());
  if (decoded->SerializeAsString() != wire) Fail("decodes to another message", "");
  return 0;
}
