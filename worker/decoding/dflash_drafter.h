// A spec drafter that drafts a whole block per call with a DFlash model conditioned on the
// target's hidden states (worker/model/dflash.h).
//
// The verifier hands over the hidden rows of every token once its KV is final (AddHidden); they
// become the drafter's context K/V. A call drafts from the tokens that have no row yet: with a
// spec verifier that is exactly the last token (the bonus or resampled one), a = 1. The block
// holds those a clean tokens then masks; its slots a .. B - 1 are the drafts. More than
// max_anchor tokens without rows (the prefill step) gives no drafts, so that step is an AR
// step that taps the prompt's rows.
//
// Not thread-safe; one sequence at a time (a different sequence shares no prefix and starts
// over).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/drafter.h"
#include "worker/model/dflash.h"

namespace tandem {

class DFlashDrafter : public Drafter {
 public:
  // `model` is not owned and must outlive the drafter.
  explicit DFlashDrafter(const DFlashModel* model) : model_(model) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override;
  const DrafterStats& stats() const override { return stats_; }
  std::vector<int32_t> HiddenLayers() const override { return model_->config().target_layer_ids; }
  absl::Status AddHidden(int start, std::span<const int32_t> tokens,
                         std::span<const float> hidden) override;

  // Tokens whose context rows are cached.
  int context_length() const { return context_.length(); }

 private:
  // Drops cached rows from `length` on.
  void Truncate(int length);

  const DFlashModel* model_;
  DFlashContext context_;
  std::vector<int32_t> context_tokens_;  // the tokens of the cached context rows, in order
  DrafterStats stats_;
};

}  // namespace tandem
