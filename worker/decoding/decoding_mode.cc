#include "worker/decoding/decoding_mode.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {

void AppendPending(const DecodeState& state, StepPlan* plan) {
  for (int i = state.kv_len; i < static_cast<int>(state.tokens.size()); ++i) {
    plan->tokens.push_back(state.tokens[i]);
    plan->positions.push_back(i);
  }
}

void PlanDeviceSample(const DecodeState& state, StepPlan* plan) {
  if (state.sampling == nullptr || plan->outputs.size() != 1) return;
  // The token at sequence index tokens.size(): the RNG key the host sampler uses for it.
  plan->samples = {SampleRequest{.params = *state.sampling, .position = state.tokens.size()}};
  plan->return_logits = false;
}

absl::StatusOr<int32_t> OutputToken(const ExtendOutput& out, int i, int vocab,
                                    const SamplingParams& params, uint64_t position,
                                    RngPurpose purpose) {
  if (i < static_cast<int>(out.tokens.size())) return out.tokens[i];
  if (vocab <= 0 || out.logits.size() < static_cast<size_t>(i + 1) * vocab) {
    return absl::InternalError(absl::StrCat("output row ", i, " has neither a sampled token nor ",
                                            "logits (", out.logits.size(), " logits for a ",
                                            "vocabulary of ", vocab, ")"));
  }
  return SampleToken(LogitsRow(out, i, vocab), params, position, purpose);
}

absl::Status CheckStep(const DecodeState& state, const StepPlan& plan, const StepResult& result,
                       std::string_view mode) {
  const int pending = state.pending();
  for (int i = 0; i < pending; ++i) {
    if (i >= static_cast<int>(plan.tokens.size()) ||
        plan.tokens[i] != state.tokens[state.kv_len + i] ||
        i >= static_cast<int>(result.keep.size()) || result.keep[i] != i) {
      return absl::InternalError(absl::StrCat("mode ", std::string(mode),
                                              " must plan and keep its ", pending,
                                              " pending tokens first"));
    }
  }
  const size_t kv_after = state.kv_len + result.keep.size();
  if (kv_after > state.tokens.size() + result.append.size()) {
    return absl::InternalError(absl::StrCat("mode ", std::string(mode), " kept KV of ", kv_after,
                                            " tokens but the sequence has only ",
                                            state.tokens.size() + result.append.size()));
  }
  // Kept KV is that of the sequence's own next tokens, at their positions, with the adapter
  // gate off: the KV a causal forward of the committed tokens gives (what the prefix cache
  // shares).
  for (size_t j = 0; j < result.keep.size(); ++j) {
    const int32_t index = result.keep[j];
    const size_t at = state.kv_len + j;
    const int32_t token =
        at < state.tokens.size() ? state.tokens[at] : result.append[at - state.tokens.size()];
    const bool in_plan = index >= 0 && index < static_cast<int32_t>(plan.tokens.size()) &&
                         index < static_cast<int32_t>(plan.positions.size());
    const bool gated = in_plan && index < static_cast<int32_t>(plan.lora_gate.size()) &&
                       plan.lora_gate[index] != 0;
    if (!in_plan || plan.tokens[index] != token ||
        plan.positions[index] != static_cast<int32_t>(at) || gated) {
      return absl::InternalError(
          absl::StrCat("mode ", std::string(mode), " kept the KV of plan token ", index,
                       " as the sequence's token ", at,
                       ", but it is not that token at that position with the "
                       "adapter off"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
