// A decoding mode is pure host logic over the extend/commit primitive: each step it plans one
// extend for its sequence, then consumes that extend's outputs and says which new tokens'
// KV to keep and which tokens the sequence gains. Modes never touch the model or the cache;
// the runner (or the worker's scheduler, batching many sequences) does.
//
// Invariant between steps: the sequence's first `kv_len` tokens have their KV in the cache; the
// rest (usually the last sampled token, or the whole prompt at the start) are "pending" and
// must be the first tokens of the next extend, at positions kv_len, kv_len + 1, ... and
// visible causally among themselves.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/extend.h"
#include "worker/sampling/sampling.h"

namespace tandem {

struct DrafterStats;

// A constraint on the text a sequence may gain (structured output, worker/sampling/grammar.h).
// The driver masks every output row whose context is final (the sequence, then drafts on the
// row's path) before a mode sees it; a mode that picks tokens from other rows (a masked slot
// whose left neighbours are still masks, a block's later rows) asks the constraint itself.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets to -inf each logit of `row` that may not follow the sequence's generated tokens and
  // then `then`. False, `row` untouched, when the constraint refuses `then` itself.
  virtual bool MaskAfter(std::span<const int32_t> then, std::span<float> row) = 0;
};

// What a mode sees of its sequence.
struct DecodeState {
  std::span<const int32_t> tokens;  // prompt + generated tokens, all final
  int prompt_len = 0;
  int kv_len = 0;  // leading tokens whose KV is committed
  int budget = 0;  // most tokens the sequence may still gain (> 0)
  const SamplingParams* sampling = nullptr;
  // Null without one. Every token a mode appends must be one the constraint allows; modes whose
  // tokens come only from rows with final context (every lossless mode) need not read it.
  TokenConstraint* constraint = nullptr;

  int pending() const { return static_cast<int>(tokens.size()) - kv_len; }
};

// One step's extend, owned by the mode until the step is consumed.
struct StepPlan {
  std::vector<int32_t> tokens;     // [n], starting with the pending tokens
  std::vector<int32_t> positions;  // [n]
  Visibility visible;
  std::vector<int32_t> outputs;    // indices of tokens whose logits are needed
  std::vector<uint8_t> lora_gate;  // [n] or empty
  std::vector<int32_t> hidden_layers;
  // [outputs.size()] or empty: tokens the model samples from the output rows on its device
  // (Extend::samples), or draft tokens it verifies there. A driver may ignore them and return
  // logits instead, so a mode that plans samples reads them with OutputToken (drafts:
  // VerifiedToken, worker/decoding/verify.h), which falls back to the host sampler.
  std::vector<SampleRequest> samples;
  // False when the mode needs only the sampled tokens (and so planned `samples`). A mode that
  // reuses another mode's Plan but reads the logits itself must set it back to true.
  bool return_logits = true;
};

struct StepResult {
  std::vector<int32_t> keep;    // plan indices whose KV is kept, increasing; starts with every
                                // pending token's index
  std::vector<int32_t> append;  // tokens the sequence gains, in order (may be empty)
  int drafted = 0;              // draft tokens proposed in this step
  int accepted = 0;             // of those, accepted
};

class DecodingMode {
 public:
  virtual ~DecodingMode() = default;

  virtual std::string_view name() const = 0;
  // Lossless modes reproduce the target's AR distribution (and its greedy output exactly).
  virtual bool lossless() const = 0;

  virtual StepPlan Plan(const DecodeState& state) = 0;
  // `out` holds the logits of plan.outputs in order (and hidden states if asked for); when the
  // plan has samples, also their tokens, and then no logits if it set return_logits false.
  virtual absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                             const ExtendOutput& out) = 0;

  // Modes that draft with a Drafter (drafter.h) describe it to their driver; the defaults are
  // those of a mode without one.
  // The drafter's counters; null without a drafter.
  virtual const DrafterStats* drafter_stats() const { return nullptr; }
  // Whether the last Plan was a step meant to verify drafts. False for a step that drafts
  // nothing by design (not a fallback for want of drafts).
  virtual bool last_plan_wanted_drafts() const { return drafter_stats() != nullptr; }
  // Whether the drafts decide the output and not only the speed (a lossy mode that verifies
  // against its own approximation): a driver that gets drafts from elsewhere then waits for a
  // step's full draft rather than going on without one, and a step takes drafts even when the
  // budget has room for one token only.
  virtual bool drafts_decide_output() const { return false; }
};

// The pending tokens as the head of an extend: positions kv_len.., causal.
void AppendPending(const DecodeState& state, StepPlan* plan);

// The step contract every driver of a mode checks after Consume: the plan starts with the
// pending tokens and keeps them first, the KV kept never outruns the sequence, and every kept
// row is the sequence's own next token at its position with the adapter gate off (the KV the
// prefix cache may share). Internal (naming `mode`) when broken.
absl::Status CheckStep(const DecodeState& state, const StepPlan& plan, const StepResult& result,
                       std::string_view mode);

// Plans a plain AR step's draw on the model: output row 0 (the last pending token) sampled
// with the sequence's settings at the next position, exactly the host's SampleToken call, and
// no logits. Sets nothing without sampling settings.
void PlanDeviceSample(const DecodeState& state, StepPlan* plan);

// The token SampleToken(row i, params, position, purpose) picks: the model's sampled token when
// the driver passed the plan's samples, else the host sampler on the row's logits. Internal
// when `out` has neither.
absl::StatusOr<int32_t> OutputToken(const ExtendOutput& out, int i, int vocab,
                                    const SamplingParams& params, uint64_t position,
                                    RngPurpose purpose = RngPurpose::kSample);

// Row `i` of a [rows, vocab] logits buffer.
inline std::span<const float> LogitsRow(const ExtendOutput& out, int i, int vocab) {
  return {out.logits.data() + static_cast<size_t>(i) * vocab, static_cast<size_t>(vocab)};
}

}  // namespace tandem
