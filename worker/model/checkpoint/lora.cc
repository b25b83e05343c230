#include "worker/model/checkpoint/lora.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/checkpoint.h"
#include "worker/model/checkpoint/internal/json_file.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct TargetInfo {
  LoraTarget target;
  absl::string_view module;  // path below model.layers.{i}
};

constexpr TargetInfo kTargets[] = {
    {LoraTarget::kQ, "self_attn.q_proj"}, {LoraTarget::kK, "self_attn.k_proj"},
    {LoraTarget::kV, "self_attn.v_proj"}, {LoraTarget::kO, "self_attn.o_proj"},
    {LoraTarget::kGate, "mlp.gate_proj"}, {LoraTarget::kUp, "mlp.up_proj"},
    {LoraTarget::kDown, "mlp.down_proj"},
};

absl::string_view ModuleName(LoraTarget target) {
  for (const TargetInfo& info : kTargets) {
    if (info.target == target) return info.module;
  }
  return "";
}

// The base model's module path, as PEFT matches target_modules against it.
std::string ModuleKey(int layer, absl::string_view module) {
  return absl::StrCat("model.layers.", layer, ".", module);
}

// [in_features, out_features] of a projection.
std::pair<int64_t, int64_t> Features(const ModelConfig& c, LoraTarget target) {
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  switch (target) {
    case LoraTarget::kQ:
      return {c.hidden_size, q_width};
    case LoraTarget::kK:
    case LoraTarget::kV:
      return {c.hidden_size, kv_width};
    case LoraTarget::kO:
      return {q_width, c.hidden_size};
    case LoraTarget::kGate:
    case LoraTarget::kUp:
      return {c.hidden_size, c.intermediate_size};
    case LoraTarget::kDown:
      return {c.intermediate_size, c.hidden_size};
  }
  return {0, 0};
}

// Which (layer, module) pairs PEFT would adapt, per target_modules. A list entry matches a
// module whose key equals it or ends with "." + entry; a string is a regex over the whole key
// ("all-linear" means every projection).
class TargetSelector {
 public:
  static absl::StatusOr<TargetSelector> FromConfig(const Json& config, const std::string& origin,
                                                   int num_layers) {
    TargetSelector selector;
    const auto it = config.find("target_modules");
    if (it == config.end() || it->is_null()) {
      // PEFT's default for the llama / mistral / qwen families.
      selector.entries_ = {"q_proj", "v_proj"};
    } else if (it->is_string()) {
      const std::string pattern = it->get<std::string>();
      if (pattern == "all-linear") {
        selector.all_ = true;
      } else {
        try {
          selector.regex_.emplace(pattern, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
          return absl::InvalidArgumentError(absl::StrCat(
              origin, ": target_modules regex \"", pattern, "\" is not supported: ", e.what()));
        }
      }
    } else if (it->is_array()) {
      for (const Json& entry : *it) {
        if (!entry.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(origin, ": target_modules must be a string or a list of strings"));
        }
        selector.entries_.push_back(entry.get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": target_modules must be a string or a list of strings"));
    }
    // Every list entry must name a projection we can adapt (not lm_head, embed_tokens, ...).
    for (const std::string& entry : selector.entries_) {
      bool known = false;
      for (int layer = 0; layer < num_layers && !known; ++layer) {
        for (const TargetInfo& info : kTargets) {
          if (MatchesEntry(ModuleKey(layer, info.module), entry)) known = true;
        }
      }
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            origin, ": target_modules entry \"", entry,
            "\" is not a supported module (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
            "down_proj)"));
      }
    }
    return selector;
  }

  bool Selects(int layer, LoraTarget target) const {
    const std::string key = ModuleKey(layer, ModuleName(target));
    if (all_) return true;
    if (regex_.has_value()) {
      try {
        return std::regex_match(key, *regex_);
      } catch (const std::regex_error&) {
        return false;
      }
    }
    for (const std::string& entry : entries_) {
      if (MatchesEntry(key, entry)) return true;
    }
    return false;
  }

 private:
  static bool MatchesEntry(const std::string& key, const std::string& entry) {
    return key == entry || absl::EndsWith(key, absl::StrCat(".", entry));
  }

  bool all_ = false;
  std::optional<std::regex> regex_;
  std::vector<std::string> entries_;
};

// Rejects adapter options whose math the engine does not implement.
absl::Status CheckSupportedOptions(const Json& config, const std::string& origin) {
  const auto fail = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", what, " is not supported"));
  };
  const auto is_true = [&](const char* key) {
    auto it = config.find(key);
    return it != config.end() && it->is_boolean() && it->get<bool>();
  };
  const auto non_empty = [&](const char* key) {
    auto it = config.find(key);
    return it != config.end() && !it->is_null() && !it->empty();
  };
  if (auto it = config.find("peft_type"); it != config.end() && *it != "LORA") {
    return fail(absl::StrCat("peft_type ", it->dump()));
  }
  if (is_true("use_dora")) return fail("use_dora = true (DoRA)");
  if (is_true("fan_in_fan_out")) return fail("fan_in_fan_out = true");
  if (is_true("lora_bias")) return fail("lora_bias = true");
  if (auto it = config.find("bias"); it != config.end() && !it->is_null() && *it != "none") {
    return fail(absl::StrCat("bias = ", it->dump(), " (only \"none\")"));
  }
  for (const char* key : {"rank_pattern", "alpha_pattern", "modules_to_save", "layer_replication",
                          "target_parameters"}) {
    if (non_empty(key)) return fail(absl::StrCat("a non-empty \"", key, "\""));
  }
  return absl::OkStatus();
}

// A parsed adapter tensor name:
// [base_model.model.]model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}[.{adapter}].weight
struct LoraTensorName {
  int layer = 0;
  LoraTarget target = LoraTarget::kQ;
  bool is_a = false;
};

std::optional<LoraTensorName> ParseTensorName(absl::string_view name) {
  absl::ConsumePrefix(&name, "base_model.model.");
  absl::ConsumePrefix(&name, "model.");
  if (!absl::ConsumePrefix(&name, "layers.")) return std::nullopt;
  if (!absl::ConsumeSuffix(&name, ".weight")) return std::nullopt;
  const size_t dot = name.find('.');
  if (dot == absl::string_view::npos) return std::nullopt;
  LoraTensorName parsed;
  if (!absl::SimpleAtoi(name.substr(0, dot), &parsed.layer) || parsed.layer < 0)
    return std::nullopt;
  name.remove_prefix(dot + 1);
  for (const TargetInfo& info : kTargets) {
    absl::string_view rest = name;
    if (!absl::ConsumePrefix(&rest, info.module)) continue;
    if (absl::ConsumePrefix(&rest, ".lora_A")) {
      parsed.is_a = true;
    } else if (absl::ConsumePrefix(&rest, ".lora_B")) {
      parsed.is_a = false;
    } else {
      return std::nullopt;
    }
    // Optional PEFT adapter name (".default"), one component.
    if (!rest.empty() &&
        (rest.front() != '.' || rest.find('.', 1) != absl::string_view::npos || rest.size() == 1)) {
      return std::nullopt;
    }
    parsed.target = info.target;
    return parsed;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<LoraAdapter> LoadLoraAdapter(const std::string& dir, const ModelConfig& config) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  TANDEM_ASSIGN_OR_RETURN(const Json adapter_config,
                          checkpoint_internal::ReadJsonObject(config_path));
  TANDEM_RETURN_IF_ERROR(CheckSupportedOptions(adapter_config, config_path));

  const auto r = adapter_config.find("r");
  if (r == adapter_config.end() || !r->is_number_integer() || r->get<int64_t>() <= 0 ||
      r->get<int64_t>() > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": \"r\" must be a positive integer"));
  }
  const int rank = r->get<int>();
  double alpha = 8.0;  // PEFT's LoraConfig default
  if (auto it = adapter_config.find("lora_alpha"); it != adapter_config.end() && !it->is_null()) {
    if (!it->is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": \"lora_alpha\" must be a number"));
    }
    alpha = it->get<double>();
  }
  bool rslora = false;
  if (auto it = adapter_config.find("use_rslora"); it != adapter_config.end() && it->is_boolean()) {
    rslora = it->get<bool>();
  }
  TANDEM_ASSIGN_OR_RETURN(
      TargetSelector selector,
      TargetSelector::FromConfig(adapter_config, config_path, config.num_layers));

  std::error_code ec;
  if (!fs::exists(weights_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(weights_path,
                     ": missing (only safetensors adapters are supported, not adapter_model.bin)"));
  }
  TANDEM_ASSIGN_OR_RETURN(auto weights, Checkpoint::OpenFiles({weights_path}));

  // Pair up lora_A / lora_B tensor names per (layer, target).
  struct PairNames {
    std::string a;
    std::string b;
  };
  std::map<std::pair<int, LoraTarget>, PairNames> pairs;
  for (const std::string& name : weights->TensorNames()) {
    const std::optional<LoraTensorName> parsed = ParseTensorName(name);
    if (!parsed.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          weights_path, ": tensor '", name,
          "' is not a LoRA weight of a supported projection (expected "
          "base_model.model.model.layers.N.{self_attn,mlp}.X_proj.lora_{A,B}.weight)"));
    }
    if (parsed->layer >= config.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": tensor '", name,
                                                     "' adapts layer ", parsed->layer,
                                                     " but the model has ", config.num_layers));
    }
    if (!selector.Selects(parsed->layer, parsed->target)) {
      return absl::InvalidArgumentError(
          absl::StrCat(weights_path, ": tensor '", name,
                       "' adapts a module not selected by target_modules in ", config_path));
    }
    std::string& slot = parsed->is_a ? pairs[{parsed->layer, parsed->target}].a
                                     : pairs[{parsed->layer, parsed->target}].b;
    if (!slot.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": tensors '", slot, "' and '",
                                                     name, "' are the same LoRA weight"));
    }
    slot = name;
  }
  if (pairs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(weights_path, ": contains no LoRA weights"));
  }

  LoraAdapter adapter;
  fs::path dir_path = fs::path(dir).lexically_normal();
  if (!dir_path.has_filename()) dir_path = dir_path.parent_path();  // "adapters/x/" -> x
  adapter.name = dir_path.filename().string();
  adapter.scale =
      static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / rank);
  adapter.layers.resize(static_cast<size_t>(config.num_layers));
  for (const auto& [key, names] : pairs) {
    const auto [layer, target] = key;
    const std::string where = absl::StrCat("layer ", layer, " ", ModuleName(target));
    if (names.a.empty() || names.b.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(weights_path, ": ", where, " has only '",
                                                     names.a.empty() ? names.b : names.a,
                                                     "'; lora_A and lora_B come in pairs"));
    }
    const auto [in_features, out_features] = Features(config, target);
    LoraPair pair;
    pair.rank = rank;
    auto a = weights->LoadF32(names.a, {rank, in_features});
    if (!a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " lora_A (rank ", rank,
                                                     " x in_features ", in_features,
                                                     "): ", a.status().message()));
    }
    auto b = weights->LoadF32(names.b, {out_features, rank});
    if (!b.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " lora_B (out_features ", out_features,
                                                     " x rank ", rank,
                                                     "): ", b.status().message()));
    }
    pair.a = std::move(*a);
    pair.b = std::move(*b);
    adapter.layers[static_cast<size_t>(layer)].emplace(target, std::move(pair));
  }
  return adapter;
}

}  // namespace tandem
