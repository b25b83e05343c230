#include "worker/decoding/diffusion.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/decoding/diffusion_sampler.h"
#include "worker/decoding/diffusion_sol.h"

namespace tandem {

absl::Status ValidateDiffusionOptions(const DiffusionOptions& options, int vocab_size) {
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("diffusion block size must be >= 1, got ", options.block_size));
  }
  if (options.mask_token < 0 || options.mask_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("diffusion mask token ", options.mask_token,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  if (!(options.threshold >= 0.0f && options.threshold <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("diffusion threshold must be in [0, 1], got ", options.threshold));
  }
  if (options.sampler != nullptr) {
    if (!(options.sampler_threshold > 0.0f && options.sampler_threshold <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "diffusion sampler threshold must be in (0, 1], got ", options.sampler_threshold));
    }
    if (options.block_size > options.sampler->max_block()) {
      return absl::InvalidArgumentError(
          absl::StrCat("diffusion block size ", options.block_size,
                       " is longer than the trained sampler's blocks (at most ",
                       options.sampler->max_block(), ")"));
    }
  }
  return absl::OkStatus();
}

bool DiffusionMode::IsEos(int32_t token) const {
  return std::find(options_.eos_tokens.begin(), options_.eos_tokens.end(), token) !=
         options_.eos_tokens.end();
}

int DiffusionMode::FinishedLength() const {
  for (size_t i = 0; i < block_.size(); ++i) {
    if (masked_[i]) return 0;
    if (IsEos(block_[i])) return static_cast<int>(i) + 1;
  }
  return static_cast<int>(block_.size());
}

void DiffusionMode::Unmask(const DecodeState& state, const Slot& slot) {
  block_[slot.index] =
      SampleToken(slot.logits, *state.sampling, static_cast<uint64_t>(block_start_ + slot.index));
  masked_[slot.index] = 0;
}

void DiffusionMode::UnmaskByScore(const DecodeState& state, float threshold,
                                  std::span<const Slot> slots) {
  // The most confident slot is always unmasked (the serial step), and with it every slot whose
  // score reaches the threshold.
  const Slot* best = &slots[0];
  for (const Slot& s : slots) {
    if (s.confidence > best->confidence) best = &s;
  }
  for (const Slot& s : slots) {
    if (s.score >= threshold || &s == best) Unmask(state, s);
  }
}

void DiffusionMode::UnmaskInOrder(const DecodeState& state, float threshold,
                                  std::span<Slot> slots) {
  // The block is its unmasked prefix then masks, so the slots come in block order from the
  // first masked one. Each row is masked to what the constraint allows after the block so far;
  // without a sampler its score is the confidence among those tokens.
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots[i];
    if (s.index != slots[0].index + static_cast<int>(i)) break;
    const std::span<const int32_t> before(block_.data(), static_cast<size_t>(s.index));
    // A refused prefix cannot come from this loop; the first slot is still unmasked so the
    // step makes progress, and the engine's check of the step's tokens reports it.
    if (!state.constraint->MaskAfter(before, s.logits) && i > 0) break;
    if (options_.sampler == nullptr)
      s.score = PredictSlot(s.logits, options_.mask_token).confidence;
    if (i > 0 && s.score < threshold) break;
    Unmask(state, s);
    if (IsEos(block_[s.index])) break;
  }
}

StepPlan DiffusionMode::Plan(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  refresh_only_ = !options_.fused_refresh && pending > 0;
  if (refresh_only_) return plan;  // causal, no outputs: only the pending tokens' KV
  const int length = static_cast<int>(state.tokens.size());
  if (block_.empty()) {
    // Full blocks (the model's training layout) even when the budget ends inside one; only the
    // context limit shortens the last block.
    block_.assign(std::max(1, std::min(options_.block_size, max_positions_ - length)),
                  options_.mask_token);
    masked_.assign(block_.size(), 1);
    block_start_ = length;
  }
  const int size = static_cast<int>(block_.size());
  for (int i = 0; i < size; ++i) {
    plan.tokens.push_back(block_[i]);
    plan.positions.push_back(block_start_ + i);
  }
  const int n = pending + size;
  plan.visible = Visibility::Explicit(n);
  for (int i = 0; i < pending; ++i) {
    for (int j = 0; j <= i; ++j) plan.visible.Allow(i, j);
  }
  for (int i = pending; i < n; ++i) {
    for (int j = 0; j < n; ++j) plan.visible.Allow(i, j);
  }
  for (int i = 0; i < size; ++i) {
    if (masked_[i]) plan.outputs.push_back(pending + i);
  }
  return plan;
}

absl::StatusOr<StepResult> DiffusionMode::Consume(const DecodeState& state, const StepPlan& plan,
                                                  const ExtendOutput& out) {
  StepResult result;
  const int pending = state.pending();
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  if (refresh_only_) return result;
  if (static_cast<int>(plan.outputs.size()) * vocab_size_ != static_cast<int>(out.logits.size())) {
    return absl::InternalError("diffusion: logits do not match the planned outputs");
  }
  // Confidence of each masked slot: top-1 probability of softmax(logits) (the temperature
  // only shapes the draw, not which slots are ready). <|mask|> itself is never a prediction,
  // so an unmasked slot always holds a real token.
  std::vector<Slot> slots;
  std::vector<SlotSummary> summaries;  // with a sampler: its input, whose prob[0] is the confidence
  for (size_t r = 0; r < plan.outputs.size(); ++r) {
    const std::span<const float> row = LogitsRow(out, static_cast<int>(r), vocab_size_);
    float confidence = 0;
    if (options_.sampler != nullptr) {
      summaries.push_back(SummarizeSlot(row, options_.mask_token));
      confidence = summaries.back().prob[0];
    } else {
      confidence = PredictSlot(row, options_.mask_token).confidence;
    }
    std::vector<float> logits(row.begin(), row.end());
    logits[options_.mask_token] = -std::numeric_limits<float>::infinity();
    slots.push_back({plan.outputs[r] - pending, confidence, 0.0f, std::move(logits)});
  }
  if (slots.empty()) return absl::InternalError("diffusion: no masked slot in the block");
  // Each slot's score: its confidence, or the trained sampler's probability.
  float threshold = options_.threshold;
  if (options_.sampler != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> p, options_.sampler->Score(block_, summaries));
    for (Slot& s : slots) s.score = p[s.index];
    threshold = options_.sampler_threshold;
  } else {
    for (Slot& s : slots) s.score = s.confidence;
  }
  if (state.constraint != nullptr) {
    UnmaskInOrder(state, threshold, slots);
  } else {
    UnmaskByScore(state, threshold, slots);
  }
  const int finished = FinishedLength();
  if (finished > 0) {
    const int keep = std::min(finished, state.budget);
    result.append.assign(block_.begin(), block_.begin() + keep);
    block_.clear();
  }
  return result;
}

}  // namespace tandem
