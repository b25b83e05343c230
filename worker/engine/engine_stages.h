// Internal to the engine: the parts of a step that need no engine state, each with its own
// contract and tests (tests/worker/engine/engine_stages_test.cc). Engine::Impl::Step
// (engine.cc) runs a step as plan → reserve → forward → consume/commit → emit → account; the
// stages that touch the KV cache, the running set or the drafter channels are Impl's methods,
// and the pure parts they are built from live here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cost_model.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/sampling/stop.h"

namespace tandem {

struct EngineSequence;  // engine_impl.h

// Plan: the engine's own prefill slice of a sequence with `pending` = tokens.size() - kv_len
// tokens whose KV is not built, when that is more than one step may take (`chunk_limit`, ≥ 1):
// the next min(chunk_limit, pending - 1) tokens at their positions, leaving the last pending
// token for the mode's own extend. nullopt when the mode plans the step itself (pending ≤ 1 or
// pending ≤ chunk_limit).
std::optional<StepPlan> PrefillSlice(std::span<const int32_t> tokens, int kv_len, int chunk_limit);

// Plan: the engine's prefill slice of a sequence that asked for its prompt's logprobs (echo):
// the next tokens of the prompt but its last (at most chunk_limit and kMaxEchoRows), every row
// an output, since row i predicts prompt token i + 1. nullopt once only the last prompt token
// is left (the mode's first step takes it, and its row predicts the first completion token).
inline constexpr int kMaxEchoRows = 64;  // rows of vocabulary-sized logits one slice returns
std::optional<StepPlan> EchoSlice(std::span<const int32_t> tokens, int kv_len, int chunk_limit,
                                  int prompt_len);

// Plan: PrefillSlice for a sequence that arrived with completion tokens decoded elsewhere
// (migration): tokens[prompt_len, end) were decoded one by one on another verifier. Their KV is
// rebuilt in the shapes their first run gave it, so that it is the same bit for bit on a backend
// whose extends of up to `exact_tokens` tokens are batch invariant (ModelBackend::
// ExactExtendTokens): the prompt in PrefillSlice's chunks and then, as the mode's first step
// took it, the rest of the prompt in one extend; the migrated tokens in extends of at most
// `exact_tokens`, the last pending token left to the mode. With `exact_tokens` 0 or no migrated
// tokens, PrefillSlice itself.
std::optional<StepPlan> ReplaySlice(std::span<const int32_t> tokens, int kv_len, int chunk_limit,
                                    int prompt_len, int exact_tokens);

// Reserve: the sequence to preempt so that `seq` gets KV: the newest in `running` (ordered
// oldest first) that is neither `seq` nor in this step's batch; nullptr when there is none.
std::shared_ptr<EngineSequence> PickVictim(
    std::span<const std::shared_ptr<EngineSequence>> running, const EngineSequence* seq,
    const std::function<bool(const EngineSequence*)>& in_batch);

// Consume: the output a mode sees when the engine added the drafter's layers to the mode's own
// taps: the logits (moved out of `out`), tokens and verdicts, and the hidden states of the
// first `mode_layers` taps only. `out.hidden` is left intact for the drafter's rows.
ExtendOutput ModeView(ExtendOutput& out, size_t mode_layers, size_t tokens, int hidden_size);

// Emit: what one step's new tokens add to a sequence's stream.
struct Emitted {
  int offset = 0;               // where the new tokens start in the sequence
  std::vector<int32_t> tokens;  // the tokens appended, up to and including a finishing one
  std::string text;             // their text, less what a possible stop string holds back
  FinishReason finish = FinishReason::kNone;
  absl::Status error;  // the detokeniser failed: the sequence ends with this error
};

// Appends `append` to `s.tokens` one token at a time through the sequence's detokeniser and
// stop checker, counting each in `s.generated`; stops at the first token that finishes the
// sequence (a stop token or string, or the completion budget) or fails to detokenise.
Emitted AppendTokens(EngineSequence& s, std::span<const int32_t> append);

// Account: one sequence's decode step, for the cost model once the step's time is known.
struct SequenceObservation {
  std::string mode;
  int gained = 0;   // completion tokens gained
  int extend = 0;   // tokens the sequence put into the step
  double wait = 0;  // seconds since the sequence's previous step ended
  // > 0: the step that took the last of the request's prompt, this many seconds after its
  // submission when the step started; a start, not a decode step (gained, extend and wait are
  // not the mode's).
  double start = 0;
};

// Feeds the step's sequence observations to `cost`. A mode's load is its resident sequences
// when the step started (`residents`, by mode), in the step or not: a spec sequence sitting a
// step out still loads its drafter. The step's time is a mode's own only when every resident
// sequence runs that one mode; otherwise it belongs to the mix and is not passed. A start
// observation ends at the step's end: its start plus `step_seconds`.
void ObserveSequenceSteps(CostModelBuilder& cost,
                          const std::map<std::string, int, std::less<>>& residents,
                          std::span<const SequenceObservation> observed, double step_seconds);

}  // namespace tandem
