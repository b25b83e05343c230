// The OpenAI-compatible API's request side: a completions or chat body parsed and checked
// into a GenerateRequest, each refusal naming its parameter (http_openai.h).
#include <cmath>
#include <limits>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/router/http_openai.h"
#include "services/router/http_tools.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/logit_adjust.h"

namespace tandem::http {

namespace {
constexpr char kParamPayload[] = "tandem.http/param";
}  // namespace

absl::Status BadParam(const std::string& param, const std::string& message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

namespace {

using nlohmann::json;

// A present, non-null member, or nullptr.
const json* Member(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<double>> NumberParam(const json& body, const char* name) {
  const json* value = Member(body, name);
  if (value == nullptr) return std::optional<double>();
  if (!value->is_number()) return BadParam(name, absl::StrCat(name, " must be a number"));
  const double number = value->get<double>();
  if (!std::isfinite(number)) return BadParam(name, absl::StrCat(name, " must be finite"));
  return std::optional<double>(number);
}

// An integer within int32 (a float with no fraction, as some clients send, is accepted).
absl::StatusOr<std::optional<int64_t>> IntegerParam(const json& body, const char* name, int64_t min,
                                                    int64_t max) {
  const json* value = Member(body, name);
  if (value == nullptr) return std::optional<int64_t>();
  int64_t integer = 0;
  if (value->is_number_integer()) {
    if (value->is_number_unsigned() &&
        value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return BadParam(name, absl::StrCat(name, " is out of range"));
    }
    integer = value->get<int64_t>();
  } else if (value->is_number_float() && std::trunc(value->get<double>()) == value->get<double>() &&
             std::abs(value->get<double>()) < 9e15) {
    integer = static_cast<int64_t>(value->get<double>());
  } else {
    return BadParam(name, absl::StrCat(name, " must be an integer"));
  }
  if (integer < min || integer > max) {
    return BadParam(name,
                    absl::StrCat(name, " must be between ", min, " and ", max, ", got ", integer));
  }
  return std::optional<int64_t>(integer);
}

absl::StatusOr<std::optional<std::string>> StringParam(const json& body, const char* name) {
  const json* value = Member(body, name);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) return BadParam(name, absl::StrCat(name, " must be a string"));
  return std::optional<std::string>(value->get<std::string>());
}

bool IsTokenIdArray(const json& value) {
  if (!value.is_array() || value.empty()) return false;
  for (const json& id : value) {
    if (!id.is_number_integer()) return false;
  }
  return true;
}

absl::Status SetTokenIds(const json& ids, v1::GenerateRequest* request) {
  v1::TokenIds* out = request->mutable_token_ids();
  for (const json& id : ids) {
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
      return BadParam("prompt", absl::StrCat("prompt token id ", value, " is out of range"));
    }
    out->add_ids(static_cast<int32_t>(value));
  }
  return absl::OkStatus();
}

// prompt: a string, a list of token ids, or a batch of exactly one of those.
absl::Status ParsePrompt(const json& body, v1::GenerateRequest* request) {
  const json* prompt = Member(body, "prompt");
  if (prompt == nullptr) return BadParam("prompt", "prompt is required");
  if (prompt->is_string()) {
    request->set_prompt(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (prompt->is_array() && prompt->empty()) {
    return BadParam("prompt", "prompt is empty");
  }
  if (IsTokenIdArray(*prompt)) return SetTokenIds(*prompt, request);
  if (prompt->is_array()) {
    if (prompt->size() > 1) {
      return BadParam("prompt", absl::StrCat("prompt holds ", prompt->size(),
                                             " prompts; send one prompt per request"));
    }
    const json& only = prompt->front();
    if (only.is_string()) {
      request->set_prompt(only.get<std::string>());
      return absl::OkStatus();
    }
    if (only.is_array() && only.empty()) return BadParam("prompt", "prompt is empty");
    if (IsTokenIdArray(only)) return SetTokenIds(only, request);
  }
  return BadParam("prompt", "prompt must be a string or a list of token ids");
}

// Text content: a string or a list of {"type": "text", "text": ...} parts.
absl::StatusOr<std::string> MessageContent(const json& message, size_t index) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  const json* content = Member(message, "content");
  if (content == nullptr) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) return BadParam(param, param + " must be a string or a list of parts");
  std::string text;
  for (const json& part : *content) {
    const json* type = part.is_object() ? Member(part, "type") : nullptr;
    const json* part_text = part.is_object() ? Member(part, "text") : nullptr;
    if (type == nullptr || *type != "text" || part_text == nullptr || !part_text->is_string()) {
      return BadParam(param, param +
                                 ": only text parts ({\"type\": \"text\", \"text\": ...}) "
                                 "are supported");
    }
    text += part_text->get<std::string>();
  }
  return text;
}

absl::Status ParseMessages(const json& body, v1::GenerateRequest* request) {
  const json* messages = Member(body, "messages");
  if (messages == nullptr) return BadParam("messages", "messages is required");
  if (!messages->is_array()) return BadParam("messages", "messages must be a list");
  if (messages->empty()) return BadParam("messages", "messages is empty");
  v1::ChatMessages* chat = request->mutable_chat();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return BadParam(param, param + " must be an object");
    const json* role = Member(message, "role");
    if (role == nullptr || !role->is_string()) {
      return BadParam(param + ".role", param + ".role must be a string");
    }
    std::string role_name = role->get<std::string>();
    // OpenAI's newer name for the system role.
    if (role_name == "developer") role_name = "system";
    if (role_name != "system" && role_name != "user" && role_name != "assistant" &&
        role_name != "tool") {
      return BadParam(param + ".role",
                      absl::StrCat(param, ".role '", role_name,
                                   "' is not supported; use system, user, assistant or tool"));
    }
    absl::StatusOr<std::string> content = MessageContent(message, i);
    if (!content.ok()) return content.status();
    v1::ChatMessage* out = chat->add_messages();
    // An assistant's earlier calls and a tool's answer, for the chat template.
    if (const json* calls = Member(message, "tool_calls"); calls != nullptr) {
      if (role_name != "assistant" || !calls->is_array()) {
        return BadParam(param + ".tool_calls",
                        param + ".tool_calls must be a list, on an assistant message");
      }
      out->set_tool_calls(calls->dump());
    }
    if (role_name == "tool") {
      const json* id = Member(message, "tool_call_id");
      if (id == nullptr || !id->is_string()) {
        return BadParam(param + ".tool_call_id",
                        param + ".tool_call_id (a string) is required on a tool message");
      }
      out->set_tool_call_id(id->get<std::string>());
    }
    out->set_role(std::move(role_name));
    out->set_content(std::move(*content));
  }
  return absl::OkStatus();
}

// Parameters Tandem does not implement (or not for this API: tools are chat's): refused when
// they ask for something.
absl::Status RefuseUnsupported(Api api, const json& body) {
  std::vector<const char*> names = {"functions", "function_call", "suffix"};
  if (api == Api::kCompletions) names.insert(names.end(), {"tools", "tool_choice"});
  for (const char* name : names) {
    const json* value = Member(body, name);
    if (value == nullptr) continue;
    const bool off = (value->is_boolean() && !value->get<bool>()) ||
                     (value->is_object() && value->empty()) ||
                     (value->is_array() && value->empty()) ||
                     (value->is_string() &&
                      (value->get<std::string>().empty() || value->get<std::string>() == "none" ||
                       value->get<std::string>() == "text"));
    if (!off) {
      return BadParam(name, absl::StrCat(name, " is not supported by Tandem"));
    }
  }
  return absl::OkStatus();
}

// One field of a LogitAdjust, checked alone so that the refusal names its parameter.
absl::Status CheckAdjustParam(const char* name, const LogitAdjust& alone) {
  absl::Status checked = CheckLogitAdjust(alone, 0);
  return checked.ok() ? checked : BadParam(name, std::string(checked.message()));
}

absl::Status ParsePenalty(const json& body, const char* name, float LogitAdjust::*field,
                          v1::SamplingParams* sampling, void (v1::SamplingParams::*set)(float)) {
  absl::StatusOr<std::optional<double>> value = NumberParam(body, name);
  if (!value.ok()) return value.status();
  if (!value->has_value()) return absl::OkStatus();
  LogitAdjust alone;
  alone.*field = static_cast<float>(**value);
  if (absl::Status checked = CheckAdjustParam(name, alone); !checked.ok()) return checked;
  (sampling->*set)(alone.*field);
  return absl::OkStatus();
}

// logit_bias: {"token id": bias, ...} as OpenAI's (the keys are decimal strings).
absl::Status ParseLogitBias(const json& body, v1::SamplingParams* sampling) {
  const json* bias = Member(body, "logit_bias");
  if (bias == nullptr) return absl::OkStatus();
  if (!bias->is_object()) {
    return BadParam("logit_bias", "logit_bias must be an object of token id -> bias");
  }
  if (bias->size() > static_cast<size_t>(kMaxLogitBias)) {
    return BadParam("logit_bias", absl::StrCat("logit_bias has ", bias->size(),
                                               " entries; at most ", kMaxLogitBias));
  }
  LogitAdjust alone;
  for (const auto& [key, value] : bias->items()) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(key, &id) || id < 0) {
      return BadParam("logit_bias", absl::StrCat("logit_bias key '", key, "' is not a token id"));
    }
    if (!value.is_number()) {
      return BadParam("logit_bias", absl::StrCat("logit_bias for token ", id, " must be a number"));
    }
    alone.logit_bias.emplace_back(id, static_cast<float>(value.get<double>()));
  }
  if (absl::Status checked = CheckAdjustParam("logit_bias", alone); !checked.ok()) return checked;
  for (const auto& [id, value] : alone.logit_bias) (*sampling->mutable_logit_bias())[id] = value;
  return absl::OkStatus();
}

// response_format: {"type": "text"} (the default), {"type": "json_object"} (JSON mode),
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}, or the extension
// {"type": "structural_tag", "format": {...}} (xgrammar's structural tag).
absl::Status ParseResponseFormat(const json& body, v1::GenerateRequest* request) {
  const json* format = Member(body, "response_format");
  if (format == nullptr) return absl::OkStatus();
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string()) {
    return BadParam("response_format", "response_format must be {\"type\": ...}");
  }
  const std::string type = (*format)["type"].get<std::string>();
  v1::ResponseFormat* out = request->mutable_response_format();
  if (type == "json_schema") {
    const json* spec = Member(*format, "json_schema");
    const json* schema = spec != nullptr && spec->is_object() ? Member(*spec, "schema") : nullptr;
    if (schema == nullptr || !(schema->is_object() || schema->is_boolean())) {
      return BadParam("response_format.json_schema.schema",
                      "response_format json_schema needs json_schema.schema, a JSON Schema");
    }
    out->set_schema(Dump(*schema));
  } else if (type == "structural_tag") {
    const json* tag_format = Member(*format, "format");
    if (tag_format == nullptr || !tag_format->is_object()) {
      return BadParam("response_format.format",
                      "response_format structural_tag needs format, a structural tag object");
    }
    out->set_schema(Dump(json{{"type", "structural_tag"}, {"format", *tag_format}}));
  } else if (type != "text" && type != "json_object") {
    return BadParam("response_format",
                    absl::StrCat("response_format type '", type,
                                 "' is not supported (text, json_object, json_schema or "
                                 "structural_tag)"));
  }
  if (out->schema().size() > kMaxGrammarBytes) {
    return BadParam("response_format",
                    absl::StrCat("response_format's schema has ", out->schema().size(),
                                 " bytes; at most ", kMaxGrammarBytes));
  }
  out->set_type(type);
  return absl::OkStatus();
}

// Completions: logprobs N (0..20: the chosen token and N alternatives). Chat: logprobs true,
// top_logprobs N.
absl::Status ParseLogprobs(Api api, const json& body, v1::GenerateRequest* request) {
  if (api == Api::kCompletions) {
    if (Member(body, "top_logprobs") != nullptr) {
      return BadParam("top_logprobs",
                      "top_logprobs is a chat parameter; completions take logprobs: N");
    }
    absl::StatusOr<std::optional<int64_t>> logprobs =
        IntegerParam(body, "logprobs", 0, kMaxTopLogprobs);
    if (!logprobs.ok()) return logprobs.status();
    if (logprobs->has_value()) {
      request->set_logprobs(true);
      request->set_top_logprobs(static_cast<int32_t>(**logprobs));
    }
    if (const json* echo = Member(body, "echo"); echo != nullptr) {
      if (!echo->is_boolean()) return BadParam("echo", "echo must be true or false");
      request->set_echo(echo->get<bool>());
    }
    return absl::OkStatus();
  }
  if (const json* echo = Member(body, "echo"); echo != nullptr && *echo != false) {
    return BadParam("echo", "echo is a completions parameter");
  }
  if (const json* logprobs = Member(body, "logprobs"); logprobs != nullptr) {
    if (!logprobs->is_boolean()) return BadParam("logprobs", "logprobs must be true or false");
    request->set_logprobs(logprobs->get<bool>());
  }
  absl::StatusOr<std::optional<int64_t>> top =
      IntegerParam(body, "top_logprobs", 0, kMaxTopLogprobs);
  if (!top.ok()) return top.status();
  if (top->has_value()) {
    if (!request->logprobs()) {
      return BadParam("top_logprobs", "top_logprobs needs logprobs: true");
    }
    request->set_top_logprobs(static_cast<int32_t>(**top));
  }
  return absl::OkStatus();
}

// n (1..kMaxChoices) and, for completions, best_of (n..kMaxChoices, not streamed).
absl::Status ParseChoices(Api api, const json& body, ParsedRequest* parsed) {
  absl::StatusOr<std::optional<int64_t>> n = IntegerParam(body, "n", 1, kMaxChoices);
  if (!n.ok()) return n.status();
  parsed->n = static_cast<int>(n->value_or(1));
  absl::StatusOr<std::optional<int64_t>> best_of = IntegerParam(body, "best_of", 1, kMaxChoices);
  if (!best_of.ok()) return best_of.status();
  parsed->best_of = static_cast<int>(best_of->value_or(parsed->n));
  if (parsed->best_of != parsed->n) {
    if (api == Api::kChat) return BadParam("best_of", "best_of is a completions parameter");
    if (parsed->best_of < parsed->n) {
      return BadParam("best_of", absl::StrCat("best_of (", parsed->best_of,
                                              ") must be at least n (", parsed->n, ")"));
    }
    if (const json* stream = Member(body, "stream"); stream != nullptr && *stream == true) {
      return BadParam("best_of", "best_of cannot be streamed (the best are known at the end)");
    }
  }
  return absl::OkStatus();
}

// presence_penalty, frequency_penalty, repetition_penalty, logit_bias and min_tokens.
absl::Status ParseLogitAdjust(const json& body, v1::GenerateRequest* request) {
  v1::SamplingParams* sampling = request->mutable_sampling();
  for (const auto& [name, field, set] :
       {std::tuple{"presence_penalty", &LogitAdjust::presence_penalty,
                   &v1::SamplingParams::set_presence_penalty},
        std::tuple{"frequency_penalty", &LogitAdjust::frequency_penalty,
                   &v1::SamplingParams::set_frequency_penalty},
        std::tuple{"repetition_penalty", &LogitAdjust::repetition_penalty,
                   &v1::SamplingParams::set_repetition_penalty}}) {
    if (absl::Status parsed = ParsePenalty(body, name, field, sampling, set); !parsed.ok()) {
      return parsed;
    }
  }
  if (absl::Status bias = ParseLogitBias(body, sampling); !bias.ok()) return bias;
  absl::StatusOr<std::optional<int64_t>> min_tokens =
      IntegerParam(body, "min_tokens", 0, std::numeric_limits<int32_t>::max());
  if (!min_tokens.ok()) return min_tokens.status();
  if (min_tokens->has_value()) request->set_min_tokens(static_cast<int32_t>(**min_tokens));
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, v1::GenerateRequest* request) {
  const json* stop = Member(body, "stop");
  if (stop != nullptr) {
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) request->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& item : *stop) {
        if (!item.is_string()) return BadParam("stop", "stop must be a string or strings");
        if (!item.get<std::string>().empty()) request->add_stop(item.get<std::string>());
      }
    } else {
      return BadParam("stop", "stop must be a string or a list of strings");
    }
  }
  const json* ids = Member(body, "stop_token_ids");
  if (ids != nullptr) {
    if (!ids->is_array()) return BadParam("stop_token_ids", "stop_token_ids must be a list");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return BadParam("stop_token_ids", "stop_token_ids must hold token ids");
      }
      request->add_stop_token_ids(id.get<int32_t>());
    }
  }
  return absl::OkStatus();
}

absl::Status ParseBody(Api api, const json& body, ParsedRequest* parsed) {
  if (!body.is_object()) return BadParam("", "the request body must be a JSON object");
  v1::GenerateRequest& request = parsed->request;
  absl::StatusOr<std::optional<std::string>> model = StringParam(body, "model");
  if (!model.ok()) return model.status();
  if (model->has_value()) request.set_model(**model);
  absl::Status input =
      api == Api::kChat ? ParseMessages(body, &request) : ParsePrompt(body, &request);
  if (!input.ok()) return input;
  if (absl::Status refused = RefuseUnsupported(api, body); !refused.ok()) return refused;

  // Chat clients send max_completion_tokens (max_tokens is deprecated there).
  const int32_t int_max = std::numeric_limits<int32_t>::max();
  absl::StatusOr<std::optional<int64_t>> max_tokens = IntegerParam(body, "max_tokens", 0, int_max);
  if (!max_tokens.ok()) return max_tokens.status();
  if (!max_tokens->has_value() && api == Api::kChat) {
    max_tokens = IntegerParam(body, "max_completion_tokens", 0, int_max);
    if (!max_tokens.ok()) return max_tokens.status();
  }
  if (max_tokens->has_value()) {
    request.set_max_tokens(static_cast<int32_t>(**max_tokens));
    parsed->max_tokens_set = true;
  }

  v1::SamplingParams* sampling = request.mutable_sampling();
  absl::StatusOr<std::optional<double>> temperature = NumberParam(body, "temperature");
  if (!temperature.ok()) return temperature.status();
  // OpenAI's default temperature is 1.
  sampling->set_temperature(temperature->has_value() ? static_cast<float>(**temperature) : 1.0f);
  absl::StatusOr<std::optional<double>> top_p = NumberParam(body, "top_p");
  if (!top_p.ok()) return top_p.status();
  if (top_p->has_value()) sampling->set_top_p(static_cast<float>(**top_p));
  absl::StatusOr<std::optional<double>> min_p = NumberParam(body, "min_p");
  if (!min_p.ok()) return min_p.status();
  if (min_p->has_value()) sampling->set_min_p(static_cast<float>(**min_p));
  absl::StatusOr<std::optional<int64_t>> top_k = IntegerParam(body, "top_k", -1, int_max);
  if (!top_k.ok()) return top_k.status();
  // -1 is vLLM's "off".
  if (top_k->has_value() && **top_k > 0) sampling->set_top_k(static_cast<int32_t>(**top_k));
  absl::StatusOr<std::optional<int64_t>> seed =
      IntegerParam(body, "seed", 0, std::numeric_limits<int64_t>::max());
  if (!seed.ok()) return seed.status();
  if (seed->has_value()) sampling->set_seed(static_cast<uint64_t>(**seed));

  if (absl::Status adjust = ParseLogitAdjust(body, &request); !adjust.ok()) return adjust;
  if (absl::Status logprobs = ParseLogprobs(api, body, &request); !logprobs.ok()) return logprobs;
  if (absl::Status choices = ParseChoices(api, body, parsed); !choices.ok()) return choices;
  if (absl::Status format = ParseResponseFormat(body, &request); !format.ok()) return format;
  if (api == Api::kChat) {
    absl::StatusOr<std::optional<ToolRequest>> tools = ParseTools(body, &request);
    if (!tools.ok()) return tools.status();
    parsed->tools = *std::move(tools);
  }
  if (absl::Status stop = ParseStop(body, &request); !stop.ok()) return stop;
  if (const json* ignore_eos = Member(body, "ignore_eos"); ignore_eos != nullptr) {
    if (!ignore_eos->is_boolean())
      return BadParam("ignore_eos", "ignore_eos must be true or false");
    request.set_ignore_eos(ignore_eos->get<bool>());
  }
  absl::StatusOr<std::optional<std::string>> mode = StringParam(body, "mode");
  if (!mode.ok()) return mode.status();
  if (mode->has_value()) request.set_mode(**mode);

  if (const json* stream = Member(body, "stream"); stream != nullptr) {
    if (!stream->is_boolean()) return BadParam("stream", "stream must be true or false");
    parsed->stream = stream->get<bool>();
  }
  if (const json* options = Member(body, "stream_options"); options != nullptr) {
    if (!options->is_object())
      return BadParam("stream_options", "stream_options must be an object");
    if (!parsed->stream) {
      return BadParam("stream_options", "stream_options is only allowed when stream is true");
    }
    if (const json* usage = Member(*options, "include_usage"); usage != nullptr) {
      if (!usage->is_boolean()) {
        return BadParam("stream_options.include_usage", "include_usage must be true or false");
      }
      parsed->include_usage = usage->get<bool>();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Api api, std::string_view body) {
  json parsed_json = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed_json.is_discarded()) {
    // Parse again with exceptions for the position nlohmann reports.
    std::string detail = "it does not parse";
    try {
      json ignored = json::parse(body);
      (void)ignored;
    } catch (const json::exception& error) {  // parse_error, or out_of_range for a number
      detail = error.what();                  // past double's range
    }
    return BadParam("", absl::StrCat("the request body is not valid JSON: ", detail));
  }
  ParsedRequest parsed;
  if (absl::Status status = ParseBody(api, parsed_json, &parsed); !status.ok()) return status;
  if (!parsed.max_tokens_set && api == Api::kCompletions) {
    parsed.request.set_max_tokens(kDefaultCompletionMaxTokens);
  }
  return parsed;
}

std::string ParamOf(const absl::Status& status) {
  auto payload = status.GetPayload(kParamPayload);
  return payload.has_value() ? std::string(*payload) : std::string();
}

}  // namespace tandem::http
