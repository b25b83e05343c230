#include "worker/model/checkpoint/model_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/internal/json_file.h"

namespace tandem {
namespace {

using checkpoint_internal::ReadJsonObject;
using checkpoint_internal::ReadTextFile;
using Json = nlohmann::json;

constexpr char kSupported[] =
    "supported: model_type llama, mistral, qwen2, qwen3, sdar, or an architectures entry "
    "naming Llama, Mistral, Qwen2 or Qwen3";

// Typed access to one JSON object; errors name the origin and the field. A field that is
// absent or null takes the default, as transformers' config classes do.
class Fields {
 public:
  Fields(const Json& object, std::string origin) : object_(object), origin_(std::move(origin)) {}

  // Present, possibly null.
  bool Contains(const char* key) const { return object_.contains(key); }
  // Present and not null.
  bool Has(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  const Json* Get(const char* key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::Status Error(const char* key, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(origin_, ": field \"", key, "\" ", what));
  }

  absl::StatusOr<int> Int(const char* key) const {
    const Json* value = Get(key);
    if (value == nullptr) return Error(key, "is required");
    return ToInt(key, *value);
  }
  absl::StatusOr<int> IntOr(const char* key, int fallback) const {
    const Json* value = Get(key);
    return value == nullptr ? fallback : ToInt(key, *value);
  }
  absl::StatusOr<double> Number(const char* key) const {
    const Json* value = Get(key);
    if (value == nullptr) return Error(key, "is required");
    if (!value->is_number()) return Error(key, "must be a number");
    return value->get<double>();
  }
  absl::StatusOr<double> NumberOr(const char* key, double fallback) const {
    return Has(key) ? Number(key) : fallback;
  }
  absl::StatusOr<std::optional<double>> OptionalNumber(const char* key) const {
    if (!Has(key)) return std::optional<double>();
    TANDEM_ASSIGN_OR_RETURN(double value, Number(key));
    return std::optional<double>(value);
  }
  absl::StatusOr<bool> BoolOr(const char* key, bool fallback) const {
    const Json* value = Get(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) return Error(key, "must be true or false");
    return value->get<bool>();
  }
  absl::StatusOr<std::string> StringOr(const char* key, const std::string& fallback) const {
    const Json* value = Get(key);
    if (value == nullptr) return fallback;
    if (!value->is_string()) return Error(key, "must be a string");
    return value->get<std::string>();
  }
  // An int or a list of ints (eos_token_id); null or absent gives `fallback`.
  absl::StatusOr<std::vector<int>> IntListOr(const char* key, std::vector<int> fallback) const {
    const Json* value = Get(key);
    if (value == nullptr) return fallback;
    std::vector<int> result;
    if (value->is_array()) {
      for (const Json& item : *value) {
        TANDEM_ASSIGN_OR_RETURN(int id, ToInt(key, item));
        result.push_back(id);
      }
      return result;
    }
    TANDEM_ASSIGN_OR_RETURN(int id, ToInt(key, *value));
    return std::vector<int>{id};
  }

 private:
  absl::StatusOr<int> ToInt(const char* key, const Json& value) const {
    double number = 0;
    if (value.is_number_integer()) {
      const int64_t v = value.get<int64_t>();
      if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
        return Error(key, "is out of range");
      }
      return static_cast<int>(v);
    }
    // Some exporters write integral values as floats (e.g. 4096.0).
    if (value.is_number_float()) {
      number = value.get<double>();
      if (number == std::floor(number) && std::fabs(number) <= std::numeric_limits<int>::max()) {
        return static_cast<int>(number);
      }
    }
    return Error(key, "must be an integer");
  }

  const Json& object_;
  std::string origin_;
};

// Names that contain a supported family but are a different model (MoE, multimodal, hybrid).
bool NamesOtherModel(const std::string& lower) {
  for (absl::string_view marker :
       {"moe", "vl", "vision", "next", "omni", "audio", "mllama", "conditionalgeneration"}) {
    if (absl::StrContains(lower, marker)) return true;
  }
  return false;
}

// Finds `family` in an architectures name, not followed by a version suffix ("Llama4",
// "Qwen3_5" are other models).
bool NamesFamily(const std::string& lower, std::string_view family) {
  for (size_t pos = lower.find(family); pos != std::string::npos;
       pos = lower.find(family, pos + 1)) {
    const size_t next = pos + family.size();
    const bool versioned =
        next < lower.size() && (std::isdigit(static_cast<unsigned char>(lower[next])) ||
                                (lower[next] == '_' && next + 1 < lower.size() &&
                                 std::isdigit(static_cast<unsigned char>(lower[next + 1]))));
    if (!versioned) return true;
  }
  return false;
}

absl::StatusOr<Arch> DetectArch(const std::string& origin, const std::string& model_type,
                                const std::vector<std::string>& architectures) {
  struct Known {
    std::string_view model_type;
    Arch arch;
  };
  // "sdar" (SDAR block-diffusion models, also the base of I-DLM) is Qwen3's block layout.
  static constexpr Known kModelTypes[] = {{"llama", Arch::kLlama},
                                          {"mistral", Arch::kMistral},
                                          {"qwen2", Arch::kQwen2},
                                          {"qwen3", Arch::kQwen3},
                                          {"sdar", Arch::kQwen3}};
  for (const Known& known : kModelTypes) {
    if (model_type == known.model_type) return known.arch;
  }
  // Unknown model_type (custom diffusion / speculative checkpoints): trust the class name.
  // Qwen3 is tested before Qwen2 only for clarity; neither name contains the other.
  static constexpr Known kFamilies[] = {{"qwen3", Arch::kQwen3},
                                        {"qwen2", Arch::kQwen2},
                                        {"mistral", Arch::kMistral},
                                        {"llama", Arch::kLlama}};
  for (const std::string& name : architectures) {
    const std::string lower = absl::AsciiStrToLower(name);
    if (NamesOtherModel(lower)) continue;
    for (const Known& family : kFamilies) {
      if (NamesFamily(lower, family.model_type)) return family.arch;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      origin, ": unsupported architecture model_type=\"", model_type, "\" architectures=[",
      absl::StrJoin(architectures, ", "), "] (", kSupported, ")"));
}

absl::StatusOr<RopeScaling::Kind> ParseRopeKind(const std::string& origin,
                                                const std::string& type) {
  if (type == "default" || type.empty()) return RopeScaling::Kind::kNone;
  if (type == "linear") return RopeScaling::Kind::kLinear;
  if (type == "dynamic") return RopeScaling::Kind::kDynamic;
  if (type == "yarn") return RopeScaling::Kind::kYarn;
  if (type == "llama3") return RopeScaling::Kind::kLlama3;
  return absl::InvalidArgumentError(
      absl::StrCat(origin, ": unsupported rope type \"", type,
                   "\" (supported: default, linear, dynamic, yarn, llama3)"));
}

// rope_theta and rope scaling, from the legacy "rope_scaling" dict or transformers v5
// "rope_parameters" (which also holds rope_theta). Precedence follows transformers:
// a non-empty rope_scaling wins over rope_parameters; rope_theta inside the dict wins over the
// top-level field; "rope_type" wins over the legacy "type".
absl::Status ParseRope(const Fields& top, const std::string& origin, ModelConfig* config) {
  const Json* rope = top.Get("rope_scaling");
  if (rope != nullptr && rope->is_object() && rope->empty()) rope = nullptr;
  if (rope == nullptr) rope = top.Get("rope_parameters");
  if (rope != nullptr && !rope->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": \"rope_scaling\" / \"rope_parameters\" must be an object"));
  }
  // Per-layer-type rope parameters: our families use full attention everywhere.
  if (rope != nullptr) {
    auto full = rope->find("full_attention");
    if (full != rope->end() && full->is_object()) rope = &*full;
  }
  const Json empty = Json::object();
  const Fields params(rope != nullptr ? *rope : empty, absl::StrCat(origin, ": rope parameters"));

  TANDEM_ASSIGN_OR_RETURN(double top_theta, top.NumberOr("rope_theta", 10000.0));
  TANDEM_ASSIGN_OR_RETURN(double theta, params.NumberOr("rope_theta", top_theta));
  if (!(theta > 1.0) || !std::isfinite(theta)) {
    return top.Error("rope_theta", "must be a finite number greater than 1");
  }
  config->rope_theta = static_cast<float>(theta);

  TANDEM_ASSIGN_OR_RETURN(double top_partial, top.NumberOr("partial_rotary_factor", 1.0));
  TANDEM_ASSIGN_OR_RETURN(double partial, params.NumberOr("partial_rotary_factor", top_partial));
  if (partial != 1.0) {
    return top.Error("partial_rotary_factor", "other than 1.0 is not supported");
  }

  TANDEM_ASSIGN_OR_RETURN(std::string legacy_type, params.StringOr("type", "default"));
  TANDEM_ASSIGN_OR_RETURN(std::string type, params.StringOr("rope_type", legacy_type));
  RopeScaling& scaling = config->rope_scaling;
  TANDEM_ASSIGN_OR_RETURN(scaling.kind, ParseRopeKind(origin, type));
  if (scaling.kind == RopeScaling::Kind::kNone) return absl::OkStatus();

  // llama3 and yarn need the pre-training context: a top-level field wins (Phi-3 style),
  // then the dict, then max_position_embeddings.
  if (scaling.kind == RopeScaling::Kind::kLlama3 || scaling.kind == RopeScaling::Kind::kYarn) {
    TANDEM_ASSIGN_OR_RETURN(int dict_original, params.IntOr("original_max_position_embeddings",
                                                            config->max_position_embeddings));
    TANDEM_ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                            top.IntOr("original_max_position_embeddings", dict_original));
    if (scaling.original_max_position_embeddings <= 0) {
      return params.Error("original_max_position_embeddings", "must be positive");
    }
  }

  if (scaling.kind == RopeScaling::Kind::kYarn) {
    // A missing factor is the context extension ratio (DeepSeek-V3 style configs).
    TANDEM_ASSIGN_OR_RETURN(
        double factor,
        params.NumberOr("factor", static_cast<double>(config->max_position_embeddings) /
                                      scaling.original_max_position_embeddings));
    scaling.factor = static_cast<float>(factor);
    // transformers uses `value or default`, so 0 also means "use the default".
    TANDEM_ASSIGN_OR_RETURN(double beta_fast, params.NumberOr("beta_fast", 32.0));
    TANDEM_ASSIGN_OR_RETURN(double beta_slow, params.NumberOr("beta_slow", 1.0));
    scaling.beta_fast = static_cast<float>(beta_fast != 0 ? beta_fast : 32.0);
    scaling.beta_slow = static_cast<float>(beta_slow != 0 ? beta_slow : 1.0);
    for (auto [key, field] : {std::pair{"mscale", &scaling.mscale},
                              std::pair{"mscale_all_dim", &scaling.mscale_all_dim},
                              std::pair{"attention_factor", &scaling.attention_factor}}) {
      TANDEM_ASSIGN_OR_RETURN(std::optional<double> value, params.OptionalNumber(key));
      if (value.has_value()) *field = static_cast<float>(*value);
    }
    TANDEM_ASSIGN_OR_RETURN(scaling.truncate, params.BoolOr("truncate", true));
  } else {
    TANDEM_ASSIGN_OR_RETURN(double factor, params.Number("factor"));
    scaling.factor = static_cast<float>(factor);
  }
  if (!(scaling.factor > 0.0f) || !std::isfinite(scaling.factor)) {
    return params.Error("factor", "must be a positive number");
  }

  if (scaling.kind == RopeScaling::Kind::kLlama3) {
    TANDEM_ASSIGN_OR_RETURN(double low, params.Number("low_freq_factor"));
    TANDEM_ASSIGN_OR_RETURN(double high, params.Number("high_freq_factor"));
    if (!(high > low) || !(low > 0)) {
      return params.Error("high_freq_factor",
                          "must exceed low_freq_factor, which must be positive");
    }
    scaling.low_freq_factor = static_cast<float>(low);
    scaling.high_freq_factor = static_cast<float>(high);
  }
  if (scaling.kind == RopeScaling::Kind::kDynamic && config->max_position_embeddings <= 0) {
    return top.Error("max_position_embeddings", "must be positive for dynamic rope scaling");
  }
  return absl::OkStatus();
}

// transformers' per-family defaults for fields a config.json may omit.
struct FamilyDefaults {
  int num_kv_heads;  // 0: same as num_attention_heads
  int head_dim;      // 0: hidden_size / num_attention_heads
  int max_position_embeddings;
  std::optional<int> bos;
  std::vector<int> eos;
};

FamilyDefaults DefaultsFor(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return {0, 0, 2048, 1, {2}};
    case Arch::kMistral:
      return {8, 0, 4096 * 32, 1, {2}};
    case Arch::kQwen2:
      return {32, 0, 32768, std::nullopt, {}};
    case Arch::kQwen3:
      return {32, 128, 32768, std::nullopt, {}};
  }
  return {};
}

absl::Status ParseAttentionLayout(const Fields& f, const FamilyDefaults& defaults, ModelConfig* c) {
  TANDEM_ASSIGN_OR_RETURN(c->num_heads, f.Int("num_attention_heads"));
  if (c->num_heads <= 0) return f.Error("num_attention_heads", "must be positive");
  // Absent takes the class default; an explicit null means "same as num_attention_heads".
  int kv_default = defaults.num_kv_heads;
  if (kv_default == 0 || f.Contains("num_key_value_heads")) kv_default = c->num_heads;
  TANDEM_ASSIGN_OR_RETURN(c->num_kv_heads, f.IntOr("num_key_value_heads", kv_default));
  if (c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0) {
    return f.Error("num_key_value_heads",
                   absl::StrCat("(", c->num_kv_heads, ") must divide num_attention_heads (",
                                c->num_heads, ")"));
  }
  if (f.Has("head_dim")) {
    TANDEM_ASSIGN_OR_RETURN(c->head_dim, f.Int("head_dim"));
  } else if (defaults.head_dim != 0) {
    c->head_dim = defaults.head_dim;
  } else {
    if (c->hidden_size % c->num_heads != 0) {
      return f.Error("hidden_size", absl::StrCat("(", c->hidden_size,
                                                 ") is not a multiple of num_attention_heads (",
                                                 c->num_heads, ") and there is no head_dim"));
    }
    c->head_dim = c->hidden_size / c->num_heads;
  }
  if (c->head_dim <= 0 || c->head_dim % 2 != 0) {
    return f.Error("head_dim", absl::StrCat("(", c->head_dim, ") must be positive and even"));
  }
  return absl::OkStatus();
}

absl::Status ParseSlidingWindow(const Fields& f, ModelConfig* c) {
  if (c->arch == Arch::kMistral) {
    // MistralConfig defaults to a 4096 window on every layer; configs disable it with null.
    TANDEM_ASSIGN_OR_RETURN(c->sliding_window,
                            f.IntOr("sliding_window", f.Contains("sliding_window") ? 0 : 4096));
    if (c->sliding_window < 0) return f.Error("sliding_window", "must not be negative");
    return absl::OkStatus();
  }
  c->sliding_window = 0;
  if (c->arch == Arch::kLlama) return absl::OkStatus();
  // Qwen slides only with use_sliding_window, and then only on layers named by layer_types
  // (default: index >= max_window_layers). One window for some layers is not expressible here.
  TANDEM_ASSIGN_OR_RETURN(bool use_sliding, f.BoolOr("use_sliding_window", false));
  if (!use_sliding || !f.Has("sliding_window")) return absl::OkStatus();
  bool any_sliding = false;
  if (const Json* types = f.Get("layer_types"); types != nullptr && types->is_array()) {
    for (const Json& type : *types) any_sliding |= type == "sliding_attention";
  } else {
    TANDEM_ASSIGN_OR_RETURN(int max_window_layers, f.IntOr("max_window_layers", 28));
    any_sliding = max_window_layers < c->num_layers;
  }
  if (any_sliding) {
    return f.Error("use_sliding_window", "= true with sliding layers is not supported");
  }
  return absl::OkStatus();
}

absl::Status ParseDiffusion(const Fields& f, ModelConfig* c) {
  if (f.Has("mask_token_id")) {
    TANDEM_ASSIGN_OR_RETURN(int mask, f.Int("mask_token_id"));
    c->diffusion.mask_token_id = mask;
  }
  for (const char* key : {"block_size", "bd_size", "block_length"}) {
    if (!f.Has(key)) continue;
    TANDEM_ASSIGN_OR_RETURN(c->diffusion.block_size, f.Int(key));
    if (c->diffusion.block_size < 0) return f.Error(key, "must not be negative");
    break;
  }
  return absl::OkStatus();
}

// The id of a mask token among tokenizer.json's added_tokens, if any.
absl::StatusOr<std::optional<int>> FindMaskToken(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(Json tokenizer, ReadJsonObject(path));
  auto added = tokenizer.find("added_tokens");
  if (added == tokenizer.end() || !added->is_array()) return std::optional<int>();
  for (const Json& token : *added) {
    if (!token.is_object()) continue;
    auto content = token.find("content");
    auto id = token.find("id");
    if (content == token.end() || !content->is_string() || id == token.end() ||
        !id->is_number_integer()) {
      continue;
    }
    const std::string lower = absl::AsciiStrToLower(content->get<std::string>());
    if (lower == "<|mask|>" || lower == "<mask>" || lower == "[mask]") {
      return std::optional<int>(id->get<int>());
    }
  }
  return std::optional<int>();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& origin) {
  const Json json = Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  }
  try {
    const Fields f(json, origin);
    ModelConfig c;
    TANDEM_ASSIGN_OR_RETURN(c.model_type, f.StringOr("model_type", ""));
    std::vector<std::string> architectures;
    if (const Json* list = f.Get("architectures"); list != nullptr) {
      if (!list->is_array()) return f.Error("architectures", "must be a list of strings");
      for (const Json& name : *list) {
        if (!name.is_string()) return f.Error("architectures", "must be a list of strings");
        architectures.push_back(name.get<std::string>());
      }
    }
    if (!architectures.empty()) c.architecture = architectures.front();
    TANDEM_ASSIGN_OR_RETURN(c.arch, DetectArch(origin, c.model_type, architectures));
    if (f.Has("text_config")) {
      return f.Error("text_config", "is present: multimodal wrappers are not supported");
    }
    for (const char* key : {"num_experts", "num_local_experts"}) {
      TANDEM_ASSIGN_OR_RETURN(int experts, f.IntOr(key, 0));
      if (experts > 0) return f.Error(key, "is set: mixture-of-experts models are not supported");
    }

    const FamilyDefaults defaults = DefaultsFor(c.arch);
    TANDEM_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
    TANDEM_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
    TANDEM_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size"));
    TANDEM_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers"));
    for (auto [key, value] :
         {std::pair{"vocab_size", c.vocab_size}, std::pair{"hidden_size", c.hidden_size},
          std::pair{"intermediate_size", c.intermediate_size},
          std::pair{"num_hidden_layers", c.num_layers}}) {
      if (value <= 0) return f.Error(key, "must be positive");
    }
    TANDEM_RETURN_IF_ERROR(ParseAttentionLayout(f, defaults, &c));

    TANDEM_ASSIGN_OR_RETURN(double eps, f.NumberOr("rms_norm_eps", 1e-6));
    if (!(eps > 0)) return f.Error("rms_norm_eps", "must be positive");
    c.rms_norm_eps = static_cast<float>(eps);
    TANDEM_ASSIGN_OR_RETURN(c.hidden_act, f.StringOr("hidden_act", "silu"));
    TANDEM_ASSIGN_OR_RETURN(c.max_position_embeddings,
                            f.IntOr("max_position_embeddings", defaults.max_position_embeddings));
    TANDEM_RETURN_IF_ERROR(ParseSlidingWindow(f, &c));
    TANDEM_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.BoolOr("tie_word_embeddings", false));

    // Bias and norm layout is fixed per family by the modeling code, not by the config alone.
    switch (c.arch) {
      case Arch::kLlama: {
        TANDEM_ASSIGN_OR_RETURN(bool bias, f.BoolOr("attention_bias", false));
        c.attention_bias = c.o_proj_bias = bias;
        TANDEM_ASSIGN_OR_RETURN(c.mlp_bias, f.BoolOr("mlp_bias", false));
        break;
      }
      case Arch::kMistral:
        break;  // MistralAttention has no biases whatever the config says
      case Arch::kQwen2:
        c.attention_bias = true;  // q/k/v always biased, o_proj never
        break;
      case Arch::kQwen3: {
        TANDEM_ASSIGN_OR_RETURN(bool bias, f.BoolOr("attention_bias", false));
        c.attention_bias = c.o_proj_bias = bias;
        c.qk_norm = true;
        break;
      }
    }

    // An explicit null means "none"; an absent key takes the class default.
    TANDEM_ASSIGN_OR_RETURN(
        c.eos_token_ids, f.IntListOr("eos_token_id", f.Contains("eos_token_id") ? std::vector<int>{}
                                                                                : defaults.eos));
    if (f.Has("bos_token_id")) {
      TANDEM_ASSIGN_OR_RETURN(int bos, f.Int("bos_token_id"));
      c.bos_token_id = bos;
    } else if (!f.Contains("bos_token_id")) {
      c.bos_token_id = defaults.bos;
    }

    TANDEM_RETURN_IF_ERROR(ParseRope(f, origin, &c));
    TANDEM_RETURN_IF_ERROR(ParseDiffusion(f, &c));
    return c;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", e.what()));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(config_path));
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, config_path));

  std::error_code ec;
  const std::string tokenizer_path = (fs::path(dir) / "tokenizer.json").string();
  if (!config.diffusion.mask_token_id.has_value() && fs::exists(tokenizer_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(config.diffusion.mask_token_id, FindMaskToken(tokenizer_path));
  }
  // generate() stops on generation_config.json's eos ids; merge them so stopping agrees.
  const std::string generation_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(generation_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(Json generation, ReadJsonObject(generation_path));
    const Fields f(generation, generation_path);
    TANDEM_ASSIGN_OR_RETURN(std::vector<int> eos, f.IntListOr("eos_token_id", {}));
    for (int id : eos) {
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), id) ==
          config.eos_token_ids.end()) {
        config.eos_token_ids.push_back(id);
      }
    }
  }
  return config;
}

}  // namespace tandem
