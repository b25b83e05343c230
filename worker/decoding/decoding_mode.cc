#include "worker/decoding/decoding_mode.h"

namespace tandem {

void AppendPending(const DecodeState& state, StepPlan* plan) {
  for (int i = state.kv_len; i < static_cast<int>(state.tokens.size()); ++i) {
    plan->tokens.push_back(state.tokens[i]);
    plan->positions.push_back(i);
  }
}

}  // namespace tandem
