// Speed-of-light (SOL) analysis of a block-diffusion pathway, NLD §4.1: how many tokens per
// forward any diffusion sampler could reach on a block, measured against the block the model
// converges to when it commits one token per forward.
//
// Every function here decodes one block of `block_size` slots that starts all masked, through
// a BlockDenoiser (one forward of the pathway on the block, with the prefix fixed):
// - SerialDenoise: the oracle target t. Each forward commits the single most confident masked
//   slot (its argmax), so it takes exactly block_size forwards.
// - ThresholdDenoise: the `diffusion` mode's rule (DiffusionMode): each forward commits the
//   most confident masked slot and every masked slot whose score (its confidence, or a trained
//   sampler's probability) reaches the threshold.
// - GreedyAcceptance: each forward commits every masked slot whose argmax equals t, or, when
//   none does, the most confident slot's argmax (which leaves t: the run is then not exact).
// - DynamicCompaction (recursive dynamic compaction): each forward ranks the slots whose argmax
//   equals t by confidence and commits the longest prefix of that ranking that is *safe* — from
//   which the scheme one level shallower (depth - 1; depth 0 is greedy acceptance) still ends at
//   t — found by binary search. The top match is taken as safe. The safety checks are
//   simulations: their forwards ("probes") are not the scheme's forwards, they draw on a budget
//   per block, and a check that runs out of it counts as unsafe.
// A scheme's tokens per forward on the block is block_size / forwards.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct SlotPrediction {
  int32_t token = -1;       // argmax of the row with <|mask|> excluded
  float confidence = 0.0f;  // its softmax probability, <|mask|> excluded
  // What ThresholdDenoise compares with its threshold: the confidence, or a trained sampler's
  // probability that `token` is final (diffusion_sampler.h).
  float score = 0.0f;
};

// The prediction the `diffusion` mode reads from a masked slot's logits row (score =
// confidence).
SlotPrediction PredictSlot(std::span<const float> logits, int32_t mask_token);

// One forward of the pathway on `block` (masked slots hold the mask token): a prediction for
// every slot (only the masked slots' are read).
using BlockDenoiser =
    std::function<absl::StatusOr<std::vector<SlotPrediction>>(std::span<const int32_t> block)>;

struct BlockRun {
  std::vector<int32_t> tokens;  // the block once no slot is masked
  int forwards = 0;             // forwards that committed slots
  int probes = 0;               // DynamicCompaction: forwards of its safety checks
  bool over_budget = false;     // DynamicCompaction: a safety check ran out of probes
  bool exact = true;            // tokens == the target (the schemes given one)
};

absl::StatusOr<BlockRun> SerialDenoise(const BlockDenoiser& denoise, int block_size,
                                       int32_t mask_token);

absl::StatusOr<BlockRun> ThresholdDenoise(const BlockDenoiser& denoise, int block_size,
                                          int32_t mask_token, float threshold);

absl::StatusOr<BlockRun> GreedyAcceptance(const BlockDenoiser& denoise,
                                          std::span<const int32_t> target, int32_t mask_token);

struct CompactionOptions {
  int depth = 1;      // >= 1; each level's safety checks run the level below
  int probes = 5000;  // safety-check forwards per block (NLD §4.1's simulation budget)
};

absl::StatusOr<BlockRun> DynamicCompaction(const BlockDenoiser& denoise,
                                           std::span<const int32_t> target, int32_t mask_token,
                                           const CompactionOptions& options);

}  // namespace tandem
