#include "worker/decoding/ar.h"

namespace tandem {

StepPlan ArMode::Plan(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  plan.outputs = {static_cast<int32_t>(plan.tokens.size()) - 1};
  // Only the sampled token is needed: the model samples it where the logits are.
  PlanDeviceSample(state, &plan);
  return plan;
}

absl::StatusOr<StepResult> ArMode::Consume(const DecodeState& state, const StepPlan& plan,
                                           const ExtendOutput& out) {
  StepResult result;
  for (int i = 0; i < static_cast<int>(plan.tokens.size()); ++i) result.keep.push_back(i);
  // The token's RNG key is its index in the sequence, so seeded runs do not depend on steps.
  const uint64_t position = state.tokens.size();
  absl::StatusOr<int32_t> token = OutputToken(out, 0, vocab_size_, *state.sampling, position);
  if (!token.ok()) return token.status();
  result.append.push_back(*token);
  return result;
}

}  // namespace tandem
