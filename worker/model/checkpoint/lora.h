// PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint/model_config.h"

namespace tandem {

// Projections an adapter may target, in HF module names.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };

struct LoraPair {
  int rank = 0;
  std::vector<float> a;  // [rank, in_features]   (lora_A.weight)
  std::vector<float> b;  // [out_features, rank]  (lora_B.weight)
};

struct LoraAdapter {
  std::string name;
  float scale = 1.0f;  // lora_alpha / r (or alpha / sqrt(r) with use_rslora)
  // layer index -> target -> weights; absent entries are not adapted.
  std::vector<std::map<LoraTarget, LoraPair>> layers;
};

// Loads a PEFT adapter directory for a model of `config`. Shapes are checked against the model;
// unsupported options (DoRA, bias != "none", modules we do not know) are InvalidArgument.
absl::StatusOr<LoraAdapter> LoadLoraAdapter(const std::string& dir, const ModelConfig& config);

}  // namespace tandem
