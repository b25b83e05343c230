// `simsd`: speculative decoding of a block-diffusion target (SimSD §3). LOSSY: the output
// follows the target's block-diffusion pathway as SimSD approximates it, not the target's AR
// distribution (lossless() is false).
//
// The target decodes block by block like `diffusion` (NLD §3.2): a block of `block_size`
// positions starts masked and its tokens join the sequence once every slot is decoded. Within
// a block, while R >= γ positions remain undecoded, a step is SPECULATIVE (§3.2):
//
//   drafts    (o_1, x̂_1) .. (o_γ, x̂_γ) = drafter.DraftBlock(tokens, block state, γ): draft r is
//             token x̂_r for undecoded slot o_r, in the drafter's decoding order (the
//             draft-induced order; a block-diffusion drafter unmasks its most confident slot per
//             draft step, an AR drafter answers the slots after a decoded prefix left to right).
//             Decoded slots need not be a prefix: the drafter sees the block as it stands.
//   labels    temporal step τ per slot: decoded-before slots 0, slot o_r gets r, the slots left
//             undrafted γ + 1 (masked through the whole step).
//   extend    [pending | data: decoded slots (slot order), x̂_1..x̂_γ | masks: o_1..o_γ,
//             undrafted slots (slot order)]
//             data and mask of one slot share its RoPE position (RoPE copy). Among the block's
//             rows (eq. 1): data a sees data b iff τ(b) <= τ(a) and mask b iff τ(b) > τ(a);
//             mask a sees data b iff τ(b) < τ(a) and mask b iff τ(b) >= τ(a). Every block row
//             sees the committed prefix and the pending tokens; pending rows are causal.
//   outputs   the drafts' mask slots: row r is p^(r), the target's prediction of slot o_r in
//             the block state of denoising step r (decoded slots and x̂_1..x̂_{r-1} at
//             o_1..o_{r-1} as tokens, the rest masked).
//   verify    eq. 2 along the draft order with a point-mass q (VerifyDraft: accept x̂_r with
//             probability p^(r)(x̂_r); greedy: iff it is the argmax); at the first rejection slot
//             o_r takes the resampled token (greedy: the argmax) and the rest are dropped. All
//             accepted: the γ drafts are decoded, no bonus token (the paper's rule).
//
// Otherwise (R < γ, no drafts, or a drafter error) the step is a COMPLETION step: one vanilla
// block-diffusion forward (block rows see every slot of the block), unmasking each slot whose
// top-1 probability reaches `threshold` (at least the most confident one) — the target
// completes the block itself, whichever slots are decoded. With γ = block_size (the default) a
// block takes one speculative step and, unless every draft is accepted, completion steps for
// the rest.
//
// Under a constraint (structured output, DecodeState::constraint) a block fills left to right,
// as `diffusion` does: drafts count only while their slots continue the decoded prefix in order
// (the first out-of-order draft and those after it are dropped), each verification row is
// masked to what the constraint allows after the slots before it, and a completion step
// unmasks the first undecoded slot, then each next one while its confidence among the tokens
// the constraint allows reaches `threshold`.
//
// What is exact: each verification slot's DIRECT attention (its visible set of (token,
// position) entries) equals that of the sequential denoising step it stands for. Deeper layers
// read keys that were computed in the same forward (data rows carry the state of their own
// step, mask rows see later drafts), so for a multi-layer target this is SimSD's approximation
// (§4.3, "not an exact lossless replay"); for a one-layer target the logits, and so the greedy
// output, equal the sequential speculative decode (one denoising forward per draft).
//
// KV: block rows are never kept. A finished block joins the sequence without KV, so its
// tokens are the next step's pending tokens and get their clean causal KV in that step's
// forward (the fused refresh of `diffusion`). A block ends early at an end-of-sequence token
// decoded with every slot before it decoded; budget truncates the appended tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/drafter.h"

namespace tandem {

struct SimSdOptions {
  int block_size = 8;
  int gamma = 8;  // drafts per speculative step, in [1, block_size]
  int32_t mask_token = 0;
  float threshold = 0.9f;  // completion steps, in [0, 1]
  std::vector<int32_t> eos_tokens;
};

absl::Status ValidateSimSdOptions(const SimSdOptions& options, int vocab_size);

struct SimSdStats {
  int64_t speculative_steps = 0;
  int64_t completion_steps = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t drafter_failures = 0;
  absl::Status last_drafter_error;
};

class SimSdMode : public DecodingMode {
 public:
  // `max_positions`: the target's context (0 = no limit).
  SimSdMode(SimSdOptions options, std::unique_ptr<Drafter> drafter, int vocab_size,
            int max_positions);

  std::string_view name() const override { return "simsd"; }
  bool lossless() const override { return false; }
  StepPlan Plan(const DecodeState& state) override;
  // Internal when the logits do not match the plan.
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

  const SimSdStats& stats() const { return stats_; }
  // Whether the last Plan asked the drafter (a speculative step was due), drafts or not.
  bool asked_drafter() const { return asked_drafter_; }
  const Drafter& drafter() const { return *drafter_; }
  const DrafterStats* drafter_stats() const override { return &drafter_->stats(); }
  // Completion steps draft nothing by design.
  bool last_plan_wanted_drafts() const override { return asked_drafter_; }
  // Lossy: other drafts give other text, not just another speed.
  bool drafts_decide_output() const override { return true; }

 private:
  bool IsEos(int32_t token) const;
  int FinishedLength() const;
  // The first undecoded slot of the block (its size when none).
  int FirstMasked() const;
  // The verification layout of drafts_ / draft_slots_.
  void PlanSpeculative(int pending, StepPlan* plan);
  void PlanCompletion(int pending, StepPlan* plan);
  absl::StatusOr<StepResult> ConsumeSpeculative(const DecodeState& state, const ExtendOutput& out,
                                                StepResult result);
  absl::StatusOr<StepResult> ConsumeCompletion(const DecodeState& state, const StepPlan& plan,
                                               const ExtendOutput& out, StepResult result);
  // A completion step under a constraint: left to right.
  absl::StatusOr<StepResult> CompleteInOrder(const DecodeState& state, const StepPlan& plan,
                                             const ExtendOutput& out, StepResult result);

  SimSdOptions options_;
  std::unique_ptr<Drafter> drafter_;
  int vocab_size_;
  int max_positions_;
  std::vector<int32_t> block_;   // current block's slots; mask_token while undecoded
  std::vector<uint8_t> masked_;  // [block_.size()]
  int block_start_ = 0;          // sequence position of block_[0]
  // The planned step: the drafts and the block slots they fill, in draft order (empty for a
  // completion step).
  std::vector<int32_t> drafts_;
  std::vector<int> draft_slots_;
  bool asked_drafter_ = false;
  SimSdStats stats_;
};

}  // namespace tandem
