// A deliberately naive dense forward used as the oracle for the paged, batched Transformer:
// every token attends according to an explicit [N, N] mask, no KV cache, double accumulation.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/model/checkpoint/lora.h"
#include "worker/model/checkpoint/model_config.h"
#include "worker/model/weights.h"

namespace tandem::testing {

struct DenseResult {
  std::vector<std::vector<float>> logits;  // [N][vocab]
  // hidden[l][t]: residual stream after l layers at token t, l in [0, num_layers]
  std::vector<std::vector<std::vector<float>>> hidden;
};

// mask[i][j]: token i attends to token j. lora_gate[i]: adapter applied on token i's rows.
DenseResult DenseForward(const ModelConfig& config, const ModelWeights& weights,
                         const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                         const std::vector<std::vector<bool>>& mask,
                         const LoraAdapter* lora = nullptr,
                         const std::vector<bool>& lora_gate = {});

std::vector<std::vector<bool>> CausalMask(int n);

// Max over elements of |a - b| / max(1, |b|).
double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace tandem::testing
