#include "router/request_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::router {

absl::Status CheckRequest(const RouterRequest& request, const ModelDescription& model) {
  using Input = RouterRequest::Input;
  switch (request.input) {
    case Input::kNone:
      return absl::InvalidArgumentError("the request has no input: set prompt, chat or token_ids");
    case Input::kPrompt:
      if (request.input_size == 0) return absl::InvalidArgumentError("prompt is empty");
      break;
    case Input::kChat:
      if (request.input_size == 0) return absl::InvalidArgumentError("chat has no messages");
      break;
    case Input::kTokenIds:
      if (request.input_size == 0) return absl::InvalidArgumentError("token_ids is empty");
      break;
  }
  if (!request.mode.empty() && request.mode != "auto" &&
      std::find(model.modes.begin(), model.modes.end(), request.mode) == model.modes.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown mode '", request.mode, "' for model '",
                                                   model.id, "'; it serves: auto, ",
                                                   absl::StrJoin(model.modes, ", ")));
  }
  if (request.max_tokens < 0 || (request.max_tokens == 0 && !request.echo)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be at least 1 (0 only with echo), got ", request.max_tokens));
  }
  if (request.max_tokens >= model.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens ", request.max_tokens, " does not fit the context of model '", model.id, "' (",
        model.max_context, " tokens, prompt included); ask for fewer"));
  }
  // The negated comparisons also catch NaN.
  if (!(request.temperature >= 0) || std::isinf(request.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature must be a finite number >= 0 (0 = greedy), got ",
                     request.temperature));
  }
  if (request.top_k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_k must be >= 0 (0 or -1 = off), got ", request.top_k));
  }
  if (!(request.top_p >= 0 && request.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be within [0, 1] (0 or 1 = off), got ", request.top_p));
  }
  if (!(request.min_p >= 0 && request.min_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.min_p must be within [0, 1] (0 = off), got ", request.min_p));
  }
  for (const int32_t id : request.stop_token_ids) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids must hold token ids (>= 0), got ", id));
    }
  }
  if (absl::Status adjust = CheckLogitAdjust(request.adjust, 0); !adjust.ok()) return adjust;
  const std::string& format = request.response_format;
  if (!format.empty() && format != "text") {
    if (absl::StatusOr<GrammarSpec::Kind> kind = GrammarKindOf(format); !kind.ok()) {
      return kind.status();
    }
  }
  if (request.response_schema_bytes > kMaxGrammarBytes) {
    return absl::InvalidArgumentError(absl::StrCat("response_format's schema has ",
                                                   request.response_schema_bytes,
                                                   " bytes; at most ", kMaxGrammarBytes));
  }
  if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_logprobs must be within [0, ", kMaxTopLogprobs, "], got ", request.top_logprobs));
  }
  if (request.adjust.min_tokens > request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens ", request.adjust.min_tokens,
                                                   " exceeds max_tokens ", request.max_tokens));
  }
  return absl::OkStatus();
}

}  // namespace tandem::router
