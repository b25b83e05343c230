// What the router checks in a client's request before it spends a verifier on it. The service
// layer converts the wire request into RouterRequest at once; the checks here only see native
// types. A failed check is InvalidArgument with a message that names the field and the value.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "router/verifier_pool.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/logit_adjust.h"

namespace tandem::router {

// The fields of a GenerateRequest the router checks.
struct RouterRequest {
  enum class Input { kNone, kPrompt, kChat, kTokenIds };
  Input input = Input::kNone;
  size_t input_size = 0;  // prompt bytes, chat messages or token ids
  std::string model;
  std::string mode;  // "" or "auto": the verifier's default mode
  int max_tokens = 0;
  float temperature = 0;
  int top_k = 0;
  float top_p = 0;
  float min_p = 0;
  std::vector<int32_t> stop_token_ids;  // each checked >= 0; the verifier knows the vocabulary
  LogitAdjust adjust;  // ranges checked; ids only >= 0 (the verifier knows the vocabulary)
  bool logprobs = false;
  int top_logprobs = 0;  // within [0, 20] (also without logprobs: a client's mistake either way)
  bool echo = false;     // the prompt comes back first; max_tokens may then be 0
  std::string response_format;       // "", "text", "json_object", "json_schema" or "structural_tag"
  size_t response_schema_bytes = 0;  // its schema's size: at most kMaxGrammarBytes
};

// Checks `request` against `model` (the description of the model it names): an input that is
// set and not empty, a mode the model serves, 0 < max_tokens < the model's context (0 too with
// echo), sampling
// parameters within their ranges (top_k -1 means off, as 0 does), stop token ids >= 0, and the
// logit bias, penalties and min_tokens (<= max_tokens) within theirs (CheckLogitAdjust).
absl::Status CheckRequest(const RouterRequest& request, const ModelDescription& model);

}  // namespace tandem::router
