// A drafter that denoises a block with the block-diffusion pathway of a model in this process
// (a tri-mode / block-diffusion checkpoint with a <|mask|> token, as models/tandem-drafter), in
// its own order: the draft-induced order of SimSD §3.2.
//
// DraftBlock: the block's slots follow the sequence, decoded slots as their tokens and the
// undecoded ones as <|mask|>; every block row sees the sequence's causal KV and every slot of
// the block (the layout the model was trained on, as in `diffusion`). Each draft step is one
// forward over the block; the undecoded slot with the highest confidence (top-1 probability
// without <|mask|>; the lowest slot on a tie) takes its greedy token and counts as decoded in
// the next step. So draft r is decoded at draft step r, and the answer lists the slots in that
// order: a deterministic function of the sequence and the block's decoded slots, and decoding
// the first k drafts' slots with their tokens leaves the rest of the order unchanged.
//
// The sequence's causal KV is cached and follows the caller incrementally (the longest common
// prefix is kept; the missing tokens ride on the first draft step's forward); block rows are
// never kept. Draft() (left to right) drafts the next `gamma` positions as one block of masks,
// read in position order.
//
// Not thread-safe; one sequence at a time (a different sequence just shares no prefix).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/drafter.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/transformer.h"

namespace tandem {

class DiffusionDrafter : public Drafter {
 public:
  // `model` is not owned and must outlive the drafter; `mask_token` is its <|mask|> id. The
  // cache holds `capacity` tokens; blocks stop short of it and of the model's context (slots
  // past either are not drafted).
  DiffusionDrafter(Transformer* model, int32_t mask_token, int capacity);

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override;
  absl::StatusOr<BlockDraft> DraftBlock(std::span<const int32_t> tokens,
                                        std::span<const int32_t> block, int gamma) override;
  const DrafterStats& stats() const override { return stats_; }

 private:
  Transformer* model_;
  int32_t mask_token_;
  int capacity_;
  KvCache kv_;
  std::vector<int32_t> cached_;  // tokens whose causal KV is committed in kv_, in order
  DrafterStats stats_;
};

}  // namespace tandem
