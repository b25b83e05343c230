// `self_spec`: linear self-speculation on a tri-mode (AR + block diffusion) target, NLD §3.3.
// Lossless: the AR pathway verifies every draft token (greedy: token for token; sampling:
// point-mass p/q verification).
//
// A cycle is a draft forward and, when its first draft survives, a verify forward:
//   draft:  [pending (causal) | k <|mask|> at positions T..T+k-1]   T = sequence length
//           The masks see the pending tokens, the committed prefix and each other; their
//           argmax at slot i drafts the token AT position T+i ("same_position" convention).
//           The last pending row is the AR pathway's prediction v0 of position T, so the first
//           draft d0 is verified here already: v0 (= d0 when accepted) is appended.
//   verify: [v0 (pending) | d1..dm (causal)]: row j predicts position T+j+1; accept the
//           longest prefix of d1..dm that the AR pathway reproduces, then one more token (the
//           correction at the first mismatch, or the bonus after the last draft).
// When d0 is rejected the drafts after it are dropped (they were proposed for a sequence that
// starts with d0) and the cycle ends after one forward: it cost what an AR step costs. Tokens,
// cycles and acceptances are those of the two-forward reference decode (the drafts of
// tools/train/evaluate.py); only its verify forwards that could accept nothing are skipped.
//
// The next cycle's masks are not fused into the verify forward: they would have to follow the
// bonus token, which that forward produces, and masks placed after the drafts instead see
// rejected drafts and a mask where the bonus belongs — a different (and not as trained) draft.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/verify.h"

namespace tandem {

struct SelfSpecOptions {
  int draft_len = 8;       // k: <|mask|> tokens per draft forward (NLD: the block size)
  int32_t mask_token = 0;  // the checkpoint's <|mask|> id
  // NLD §3.3 LoRA-enhanced drafter: the model's LoRA adapter runs on the draft forward's
  // <|mask|> rows only. The pending rows (whose KV is kept and whose AR row verifies d0) and
  // the whole verify forward keep the base weights and never attend to a mask: lossless.
  bool lora_masks = false;
};

absl::Status ValidateSelfSpecOptions(const SelfSpecOptions& options, int vocab_size);

class SelfSpecMode : public DecodingMode {
 public:
  SelfSpecMode(const SelfSpecOptions& options, int vocab_size, int max_positions)
      : options_(options), vocab_size_(vocab_size), max_positions_(max_positions) {}

  std::string_view name() const override { return "self_spec"; }
  bool lossless() const override { return true; }
  StepPlan Plan(const DecodeState& state) override;
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

 private:
  StepPlan PlanDraft(const DecodeState& state);
  absl::StatusOr<StepResult> ConsumeDraft(const DecodeState& state, const StepPlan& plan,
                                          const ExtendOutput& out);
  SelfSpecOptions options_;
  int vocab_size_;
  int max_positions_;
  SelfSpecCycle cycle_;
};

}  // namespace tandem
