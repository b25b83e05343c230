#include "worker/decoding/simsd.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/decoding/verify.h"

namespace tandem {

absl::Status ValidateSimSdOptions(const SimSdOptions& options, int vocab_size) {
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("simsd block size must be >= 1, got ", options.block_size));
  }
  if (options.gamma < 1 || options.gamma > options.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("simsd_gamma must be in [1, block size ",
                                                   options.block_size, "], got ", options.gamma));
  }
  if (options.mask_token < 0 || options.mask_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("simsd mask token ", options.mask_token,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  if (!(options.threshold >= 0.0f && options.threshold <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("simsd completion threshold must be in [0, 1], got ", options.threshold));
  }
  return absl::OkStatus();
}

SimSdMode::SimSdMode(SimSdOptions options, std::unique_ptr<Drafter> drafter, int vocab_size,
                     int max_positions)
    : options_(std::move(options)),
      drafter_(std::move(drafter)),
      vocab_size_(vocab_size),
      max_positions_(max_positions) {}

bool SimSdMode::IsEos(int32_t token) const {
  return std::find(options_.eos_tokens.begin(), options_.eos_tokens.end(), token) !=
         options_.eos_tokens.end();
}

int SimSdMode::FirstMasked() const {
  const auto it = std::find(masked_.begin(), masked_.end(), static_cast<uint8_t>(1));
  return static_cast<int>(it - masked_.begin());
}

int SimSdMode::FinishedLength() const {
  for (size_t i = 0; i < block_.size(); ++i) {
    if (masked_[i]) return 0;
    if (IsEos(block_[i])) return static_cast<int>(i) + 1;
  }
  return static_cast<int>(block_.size());
}

StepPlan SimSdMode::Plan(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  const int length = static_cast<int>(state.tokens.size());
  if (block_.empty()) {
    // Full blocks even when the budget ends inside one (the model's training layout); only the
    // context limit shortens the last block.
    const int room = max_positions_ > 0 ? max_positions_ - length : options_.block_size;
    block_.assign(std::max(1, std::min(options_.block_size, room)), options_.mask_token);
    masked_.assign(block_.size(), 1);
    block_start_ = length;
  }
  drafts_.clear();
  draft_slots_.clear();
  asked_drafter_ = false;
  const int size = static_cast<int>(block_.size());
  const int remaining =
      static_cast<int>(std::count(masked_.begin(), masked_.end(), static_cast<uint8_t>(1)));
  const int gamma = std::min(options_.gamma, size);
  if (remaining >= gamma) {
    // The drafter sees the block as it stands (decoded slots anywhere) and answers its drafts in
    // its own decoding order: that order is the verification order.
    std::vector<int32_t> block(size);
    for (int s = 0; s < size; ++s) block[s] = masked_[s] ? kUndecodedSlot : block_[s];
    asked_drafter_ = true;
    absl::StatusOr<BlockDraft> draft = drafter_->DraftBlock(state.tokens, block, gamma);
    if (draft.ok()) {
      // Drafts stop at the first entry that is no draft of an undecoded slot of this block.
      const int n = std::min(draft->size(), static_cast<int>(draft->slots.size()));
      std::vector<uint8_t> taken(size, 0);
      const int first = FirstMasked();
      for (int r = 0; r < n && static_cast<int>(drafts_.size()) < gamma; ++r) {
        const int32_t slot = draft->slots[r];
        const int32_t token = draft->tokens[r];
        if (slot < 0 || slot >= size || !masked_[slot] || taken[slot]) break;
        if (state.constraint != nullptr && slot != first + r) break;  // left to right
        if (token < 0 || token >= vocab_size_ || token == options_.mask_token) break;
        taken[slot] = 1;
        drafts_.push_back(token);
        draft_slots_.push_back(slot);
      }
    } else {
      ++stats_.drafter_failures;
      stats_.last_drafter_error = draft.status();
    }
  }
  if (drafts_.empty()) {
    PlanCompletion(pending, &plan);
  } else {
    PlanSpeculative(pending, &plan);
  }
  return plan;
}

void SimSdMode::PlanSpeculative(int pending, StepPlan* plan) {
  const int size = static_cast<int>(block_.size());
  const int g = static_cast<int>(drafts_.size());
  // Temporal labels: decoded before this step 0, draft r (1-based) r, undrafted g + 1.
  std::vector<int> label(size, g + 1);
  for (int s = 0; s < size; ++s) {
    if (!masked_[s]) label[s] = 0;
  }
  for (int r = 0; r < g; ++r) label[draft_slots_[r]] = r + 1;
  struct Row {
    int slot;
    bool data;
  };
  std::vector<Row> rows;
  // Data section: the decoded slots in slot order, then the drafts in draft order (the
  // reference tokens).
  for (int s = 0; s < size; ++s) {
    if (!masked_[s]) rows.push_back({s, true});
  }
  const int decoded = static_cast<int>(rows.size());
  for (int r = 0; r < g; ++r) rows.push_back({draft_slots_[r], true});
  // Mask section: the drafts' slots in draft order, then the undrafted slots in slot order,
  // each at its data slot's RoPE position (RoPE copy). Decoded-before slots need no mask row:
  // no row of this step may see it (eq. 1 with τ = 0).
  for (int r = 0; r < g; ++r) rows.push_back({draft_slots_[r], false});
  for (int s = 0; s < size; ++s) {
    if (label[s] == g + 1) rows.push_back({s, false});
  }
  for (const Row& row : rows) {
    plan->tokens.push_back(row.data ? block_[row.slot] : options_.mask_token);
    plan->positions.push_back(block_start_ + row.slot);
  }
  // The drafts' data rows hold the drafts, not the (masked) slots.
  for (int r = 0; r < g; ++r) plan->tokens[pending + decoded + r] = drafts_[r];
  const int n = pending + static_cast<int>(rows.size());
  plan->visible = Visibility::Explicit(n);
  for (int i = 0; i < pending; ++i) {
    for (int j = 0; j <= i; ++j) plan->visible.Allow(i, j);
  }
  for (size_t a = 0; a < rows.size(); ++a) {
    const int i = pending + static_cast<int>(a);
    for (int j = 0; j < pending; ++j) plan->visible.Allow(i, j);
    const int ta = label[rows[a].slot];
    for (size_t b = 0; b < rows.size(); ++b) {
      const int tb = label[rows[b].slot];
      bool sees = false;
      if (rows[a].data) {
        sees = rows[b].data ? tb <= ta : tb > ta;
      } else {
        sees = rows[b].data ? tb < ta : tb >= ta;
      }
      if (sees) plan->visible.Allow(i, pending + static_cast<int>(b));
    }
  }
  // The drafts' mask rows, in draft order: the mask section starts after the data section.
  for (int r = 0; r < g; ++r) plan->outputs.push_back(pending + decoded + g + r);
}

void SimSdMode::PlanCompletion(int pending, StepPlan* plan) {
  const int size = static_cast<int>(block_.size());
  for (int i = 0; i < size; ++i) {
    plan->tokens.push_back(block_[i]);
    plan->positions.push_back(block_start_ + i);
  }
  const int n = pending + size;
  plan->visible = Visibility::Explicit(n);
  for (int i = 0; i < pending; ++i) {
    for (int j = 0; j <= i; ++j) plan->visible.Allow(i, j);
  }
  for (int i = pending; i < n; ++i) {
    for (int j = 0; j < n; ++j) plan->visible.Allow(i, j);
  }
  for (int i = 0; i < size; ++i) {
    if (masked_[i]) plan->outputs.push_back(pending + i);
  }
}

absl::StatusOr<StepResult> SimSdMode::Consume(const DecodeState& state, const StepPlan& plan,
                                              const ExtendOutput& out) {
  StepResult result;
  const int pending = state.pending();
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  if (out.logits.size() != plan.outputs.size() * static_cast<size_t>(vocab_size_) ||
      plan.outputs.empty()) {
    return absl::InternalError(absl::StrCat("simsd: Consume got ", out.logits.size(),
                                            " logits for ", plan.outputs.size(),
                                            " outputs and a vocabulary of ", vocab_size_));
  }
  absl::StatusOr<StepResult> consumed = drafts_.empty()
                                            ? ConsumeCompletion(state, plan, out, std::move(result))
                                            : ConsumeSpeculative(state, out, std::move(result));
  if (!consumed.ok()) return consumed;
  const int finished = FinishedLength();
  if (finished > 0) {
    const int keep = std::min(finished, state.budget);
    consumed->append.assign(block_.begin(), block_.begin() + keep);
    block_.clear();
    masked_.clear();
  }
  return consumed;
}

absl::StatusOr<StepResult> SimSdMode::ConsumeSpeculative(const DecodeState& state,
                                                         const ExtendOutput& out,
                                                         StepResult result) {
  const int g = static_cast<int>(drafts_.size());
  if (out.logits.size() != static_cast<size_t>(g) * vocab_size_) {
    return absl::InternalError(
        absl::StrCat("simsd: ", g, " drafts but ", out.logits.size() / vocab_size_, " rows"));
  }
  // Reused across steps: a vocabulary-sized buffer per draft is measurable at 150k tokens.
  thread_local std::vector<float> row;
  thread_local std::vector<float> scratch;
  int accepted = 0;
  for (int r = 0; r < g; ++r) {
    const std::span<const float> logits = LogitsRow(out, r, vocab_size_);
    row.assign(logits.begin(), logits.end());
    // <|mask|> is never a prediction: p^(r) is over real tokens.
    row[options_.mask_token] = -std::numeric_limits<float>::infinity();
    const int slot = draft_slots_[r];
    // Under a constraint the drafts' slots run left to right from the decoded prefix: the
    // block before `slot` is final text.
    if (state.constraint != nullptr) {
      state.constraint->MaskAfter({block_.data(), static_cast<size_t>(slot)}, row);
    }
    bool ok = false;
    const int32_t token = VerifyDraft(row, drafts_[r], *state.sampling,
                                      static_cast<uint64_t>(block_start_ + slot), &ok, &scratch);
    block_[slot] = ok ? drafts_[r] : token;
    masked_[slot] = 0;
    if (!ok) break;
    ++accepted;
  }
  result.drafted = g;
  result.accepted = accepted;
  ++stats_.speculative_steps;
  stats_.drafted += g;
  stats_.accepted += accepted;
  return result;
}

absl::StatusOr<StepResult> SimSdMode::ConsumeCompletion(const DecodeState& state,
                                                        const StepPlan& plan,
                                                        const ExtendOutput& out,
                                                        StepResult result) {
  const int pending = state.pending();
  if (state.constraint != nullptr) return CompleteInOrder(state, plan, out, std::move(result));
  // Confidence of each masked slot: top-1 probability of softmax(logits) without <|mask|>; the
  // temperature only shapes the draw, not which slots are ready.
  int best = -1;
  float best_confidence = -1.0f;
  std::vector<std::pair<int, float>> confidences;
  for (size_t r = 0; r < plan.outputs.size(); ++r) {
    const float confidence =
        SlotConfidence(LogitsRow(out, static_cast<int>(r), vocab_size_), options_.mask_token);
    confidences.emplace_back(static_cast<int>(r), confidence);
    if (confidence > best_confidence) {
      best_confidence = confidence;
      best = static_cast<int>(r);
    }
  }
  const bool any = best_confidence >= options_.threshold;
  std::vector<float> row;
  for (const auto& [r, confidence] : confidences) {
    if (any ? confidence < options_.threshold : r != best) continue;
    const std::span<const float> logits = LogitsRow(out, r, vocab_size_);
    row.assign(logits.begin(), logits.end());
    row[options_.mask_token] = -std::numeric_limits<float>::infinity();
    const int slot = plan.outputs[r] - pending;
    block_[slot] = SampleToken(row, *state.sampling, static_cast<uint64_t>(block_start_ + slot));
    masked_[slot] = 0;
  }
  ++stats_.completion_steps;
  return result;
}

// Under a constraint: the first undecoded slot, then each next one while its confidence among
// the tokens the constraint allows reaches the threshold (the block is a decoded prefix, then
// undecoded slots, so the outputs come in slot order from the first undecoded one).
absl::StatusOr<StepResult> SimSdMode::CompleteInOrder(const DecodeState& state,
                                                      const StepPlan& plan, const ExtendOutput& out,
                                                      StepResult result) {
  const int pending = state.pending();
  std::vector<float> row;
  for (size_t r = 0; r < plan.outputs.size(); ++r) {
    const int slot = plan.outputs[r] - pending;
    if (slot != plan.outputs[0] - pending + static_cast<int>(r)) break;
    const std::span<const float> logits = LogitsRow(out, static_cast<int>(r), vocab_size_);
    row.assign(logits.begin(), logits.end());
    row[options_.mask_token] = -std::numeric_limits<float>::infinity();
    // The first slot is decoded even if the constraint refused the prefix (it cannot): the
    // step makes progress and the engine's check of the appended tokens reports it.
    if (!state.constraint->MaskAfter({block_.data(), static_cast<size_t>(slot)}, row) && r > 0) {
      break;
    }
    if (r > 0 && SlotConfidence(row, options_.mask_token) < options_.threshold) break;
    block_[slot] = SampleToken(row, *state.sampling, static_cast<uint64_t>(block_start_ + slot));
    masked_[slot] = 0;
    if (IsEos(block_[slot])) break;
  }
  ++stats_.completion_steps;
  return result;
}

}  // namespace tandem
