// Logit adjustments written straight from their definitions, recomputed from the whole context
// every time: the oracle the incremental implementation (worker/sampling/logit_adjust.h) and
// the engine's adjusted decoding are tested against.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "worker/sampling/logit_adjust.h"

namespace tandem::testing {

// `row` adjusted for a context of `prompt` followed by `generated`: logit bias, the min_tokens
// ban, then per token the repetition penalty (prompt or generated) and the frequency and
// presence penalties (generated).
inline std::vector<float> ReferenceAdjust(const LogitAdjust& a, std::vector<float> row,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& generated) {
  for (const auto& [id, bias] : a.logit_bias) row[id] += bias;
  if (static_cast<int>(generated.size()) < a.min_tokens) {
    for (int32_t id : a.min_tokens_ban) row[id] = -std::numeric_limits<float>::infinity();
  }
  std::map<int32_t, int> counts;
  for (int32_t t : generated) ++counts[t];
  const std::set<int32_t> in_prompt(prompt.begin(), prompt.end());
  for (size_t t = 0; t < row.size(); ++t) {
    const auto token = static_cast<int32_t>(t);
    const int count = counts.count(token) ? counts[token] : 0;
    if (count > 0 || in_prompt.count(token)) {
      row[t] = row[t] > 0 ? row[t] / a.repetition_penalty : row[t] * a.repetition_penalty;
    }
    if (count > 0) row[t] -= a.frequency_penalty * static_cast<float>(count) + a.presence_penalty;
  }
  return row;
}

}  // namespace tandem::testing
