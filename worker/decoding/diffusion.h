// `diffusion`: block-wise denoising on a block-diffusion target, NLD §3.2. LOSSY: the output is
// the diffusion pathway's, not the target's AR distribution (lossless() is false).
//
// Each block starts as `block_size` <|mask|> tokens at the next positions. A forward predicts
// every masked slot ("same_position": the logits at slot i predict the token at i); each
// masked slot whose confidence (top-1 softmax probability) reaches `threshold` is unmasked —
// at least the single most confident one — so a block takes 1..block_size forwards. Block
// rows see the committed prefix, the pending tokens and every slot of their block (masked or
// not) — the inference form of the noisy-stream rows the model was trained on.
//
// KV refresh, fused (I-DLM App. C): a finished block is appended to the sequence without KV
// (its slots were computed as noisy tokens, not as the clean causal tokens later blocks were
// trained to read), so its tokens are the next step's pending tokens. That step's extend is
//   [finished block, causal over the prefix | next block's masks, seeing prefix + block + block]
// so the refresh rides on the next block's first denoising forward instead of costing one of
// its own (which would cap the mode at block_size / 2 tokens per forward). The prompt's
// prefill rides on the first block the same way. `fused_refresh = false` spends the separate
// forward; it exists to test that both give the same KV and logits.
//
// With a trained sampler (diffusion_sampler.h, NLD §3.2) the slots unmasked are the most
// confident one (the serial step) and every slot whose sampler probability of being final
// reaches sampler_threshold.
//
// Under a constraint (structured output, DecodeState::constraint) a block fills left to right:
// a masked slot's row attends to masks on both sides, so only the leftmost masked slot has its
// final left context. Each step unmasks that slot, then each next one while its score reaches
// the threshold, every one drawn from its row masked to what the constraint allows after the
// block so far (without a sampler the score is the confidence among those tokens). The text is
// then one the constraint accepts, at up to as many tokens per forward as the scores allow.
//
// A block ends early once an end-of-sequence token is unmasked with every slot before it
// unmasked; the slots after it are dropped.
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"

namespace tandem {

class DiffusionSampler;

struct DiffusionOptions {
  int block_size = 8;
  int32_t mask_token = 0;
  float threshold = 0.9f;  // in [0, 1]; 0 unmasks a whole block in one forward
  std::vector<int32_t> eos_tokens;
  bool fused_refresh = true;
  // The trained sampler's rule instead of the confidence threshold: unmask the most confident
  // slot and each masked slot whose sampler probability reaches `sampler_threshold`.
  // Not owned; must outlive the mode. Its max_block() must cover block_size.
  const DiffusionSampler* sampler = nullptr;
  float sampler_threshold = 0.5f;  // in (0, 1]
};

absl::Status ValidateDiffusionOptions(const DiffusionOptions& options, int vocab_size);

class DiffusionMode : public DecodingMode {
 public:
  DiffusionMode(DiffusionOptions options, int vocab_size, int max_positions)
      : options_(std::move(options)), vocab_size_(vocab_size), max_positions_(max_positions) {}

  std::string_view name() const override { return "diffusion"; }
  bool lossless() const override { return false; }
  StepPlan Plan(const DecodeState& state) override;
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

 private:
  // A masked slot's prediction in this step.
  struct Slot {
    int index;                  // in the block
    float confidence;           // top-1 probability, <|mask|> excluded
    float score;                // what the threshold is compared with
    std::vector<float> logits;  // the row, <|mask|> at -inf
  };

  bool IsEos(int32_t token) const;
  // Draws `slot`'s token from its logits and unmasks it.
  void Unmask(const DecodeState& state, const Slot& slot);
  // The most confident slot and every slot whose score reaches `threshold`.
  void UnmaskByScore(const DecodeState& state, float threshold, std::span<const Slot> slots);
  // Under a constraint: left to right (see above).
  void UnmaskInOrder(const DecodeState& state, float threshold, std::span<Slot> slots);
  // Slots of the current block that end it: all of them, or up to the first unmasked
  // end-of-sequence token when every slot before it is unmasked; 0 while it is not finished.
  int FinishedLength() const;

  DiffusionOptions options_;
  int vocab_size_;
  int max_positions_;
  std::vector<int32_t> block_;   // current block's slots; mask_token while masked
  std::vector<uint8_t> masked_;  // [block_.size()]
  int block_start_ = 0;          // sequence position of block_[0]
  bool refresh_only_ = false;    // this step is an unfused refresh forward
};

}  // namespace tandem
