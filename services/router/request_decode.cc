#include "services/router/request_decode.h"

#include "common/status_macros.h"
#include "services/common/logit_adjust_proto.h"
#include "services/common/proto_decode.h"

namespace tandem {

absl::StatusOr<v1::GenerateRequest> DecodeGenerateRequest(const grpc::ByteBuffer& buffer,
                                                          size_t max_bytes) {
  v1::GenerateRequest request;
  TANDEM_RETURN_IF_ERROR(DecodeProto(buffer, max_bytes, "router", &request));
  return request;
}

router::RouterRequest ToRouterRequest(const v1::GenerateRequest& request) {
  using Input = router::RouterRequest::Input;
  router::RouterRequest out;
  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt:
      out.input = Input::kPrompt;
      out.input_size = request.prompt().size();
      break;
    case v1::GenerateRequest::kChat:
      out.input = Input::kChat;
      out.input_size = static_cast<size_t>(request.chat().messages_size());
      break;
    case v1::GenerateRequest::kTokenIds:
      out.input = Input::kTokenIds;
      out.input_size = static_cast<size_t>(request.token_ids().ids_size());
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  out.model = request.model();
  out.mode = request.mode();
  out.max_tokens = request.max_tokens();
  out.temperature = request.sampling().temperature();
  out.top_k = request.sampling().top_k();
  out.top_p = request.sampling().top_p();
  out.min_p = request.sampling().min_p();
  out.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  out.adjust = ToLogitAdjust(request);
  out.logprobs = request.logprobs();
  out.top_logprobs = request.top_logprobs();
  out.echo = request.echo();
  out.response_format = request.response_format().type();
  out.response_schema_bytes = request.response_format().schema().size();
  return out;
}

}  // namespace tandem
