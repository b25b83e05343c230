#include "worker/decoding/nsp.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/decoding/verify.h"

namespace tandem {

absl::Status ValidateNspOptions(const NspOptions& options, int vocab_size) {
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nsp block size must be >= 1, got ", options.block_size));
  }
  if (options.mask_token < 0 || options.mask_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("nsp mask token ", options.mask_token,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  if (!(options.tau >= 0.0f && options.tau <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("nsp tau must be in [0, 1], got ", options.tau));
  }
  return absl::OkStatus();
}

int LongestConfidentPrefix(std::span<const float> confidences, float tau) {
  double product = 1.0;
  int j = 0;
  for (float c : confidences) {
    product *= static_cast<double>(c);
    if (product < static_cast<double>(tau)) break;
    ++j;
  }
  return std::max(j, 1);
}

float NspTokenConfidence(std::span<const float> logits, int32_t token, NspConfidence kind) {
  float top = -std::numeric_limits<float>::infinity();
  for (float x : logits) top = std::max(top, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - top);
  if (kind == NspConfidence::kLogit) {
    return static_cast<float>(std::exp(static_cast<double>(logits[token]) - top) / sum);
  }
  // H = -sum p log p with log p = x - top - log(sum); entries at -inf contribute nothing.
  const double log_sum = std::log(sum);
  double entropy = 0;
  for (float x : logits) {
    if (!std::isfinite(x)) continue;
    const double log_p = static_cast<double>(x) - top - log_sum;
    entropy -= std::exp(log_p) * log_p;
  }
  const double normalised = entropy / std::log(static_cast<double>(logits.size()));
  return static_cast<float>(std::clamp(1.0 - normalised, 0.0, 1.0));
}

bool NspMode::IsEos(int32_t token) const {
  return std::find(options_.eos_tokens.begin(), options_.eos_tokens.end(), token) !=
         options_.eos_tokens.end();
}

StepPlan NspMode::Plan(const DecodeState& state) {
  return cycle_.verify_next() ? cycle_.PlanVerify(state) : PlanBlock(state);
}

absl::StatusOr<StepResult> NspMode::Consume(const DecodeState& state, const StepPlan& plan,
                                            const ExtendOutput& out) {
  if (state.pending() < 1) {
    return absl::InternalError("nsp needs a pending token to anchor its block");
  }
  // A verify step may come back with the model's verdicts and no logits (VerifyDraftRun reads
  // either and checks them itself).
  if (cycle_.verify_next()) return cycle_.ConsumeVerify(state, plan, out, vocab_size_);
  if (static_cast<int>(plan.outputs.size()) * vocab_size_ != static_cast<int>(out.logits.size())) {
    return absl::InternalError("nsp: logits do not match the planned outputs");
  }
  return options_.verify ? ConsumeDraft(state, plan, out) : ConsumePrefix(state, plan, out);
}

StepPlan NspMode::PlanBlock(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  const int length = static_cast<int>(state.tokens.size());
  // The block sits at positions length-1 .. length+size-2; only the context shortens it. The
  // self-speculative variant skips it (an AR step) when the budget leaves nothing to draft.
  int size = std::max(1, std::min(options_.block_size, max_positions_ - length + 1));
  if (options_.verify && state.budget < 2) size = 0;
  if (pending == 0) size = 0;  // nothing to anchor on; Consume reports the broken invariant
  for (int i = 0; i < size; ++i) {
    plan.tokens.push_back(i == 0 ? state.tokens[length - 1] : options_.mask_token);
    plan.positions.push_back(length - 1 + i);
  }
  const int n = pending + size;
  plan.visible = Visibility::Explicit(n);
  for (int i = 0; i < pending; ++i) {
    for (int j = 0; j <= i; ++j) plan.visible.Allow(i, j);
  }
  // Block rows: the prefix before the anchor (the committed KV and the pending tokens but the
  // last, whose copy heads the block) and every row of the block.
  for (int i = pending; i < n; ++i) {
    for (int j = 0; j < pending - 1; ++j) plan.visible.Allow(i, j);
    for (int j = pending; j < n; ++j) plan.visible.Allow(i, j);
  }
  // Self-speculative: row 0 is the AR prediction of position `length`. Then the block rows.
  if (options_.verify && pending > 0) plan.outputs.push_back(pending - 1);
  for (int i = pending; i < n; ++i) plan.outputs.push_back(i);
  return plan;
}

absl::StatusOr<StepResult> NspMode::ConsumePrefix(const DecodeState& state, const StepPlan& plan,
                                                  const ExtendOutput& out) {
  const int pending = state.pending();
  const int size = static_cast<int>(plan.outputs.size());
  if (size < 1) return absl::InternalError("nsp: the step planned no block");
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  std::vector<int32_t> tokens;
  std::vector<float> confidences;
  for (int k = 0; k < size; ++k) {
    const std::span<const float> row = LogitsRow(out, k, vocab_size_);
    row_.assign(row.begin(), row.end());
    // <|mask|> is never a prediction.
    row_[options_.mask_token] = -std::numeric_limits<float>::infinity();
    // Under a constraint each row is masked to what it allows after the block's tokens so far:
    // the driver masked only row 0, the one whose context is final.
    if (state.constraint != nullptr && !state.constraint->MaskAfter(tokens, row_) && k > 0) break;
    const int32_t token = SampleToken(row_, *state.sampling, length + k);
    tokens.push_back(token);
    confidences.push_back(NspTokenConfidence(row_, token, options_.confidence));
  }
  int take = LongestConfidentPrefix(confidences, options_.tau);
  take = std::min(take, static_cast<int>(tokens.size()));
  take = std::min(take, state.budget);
  for (int k = 0; k < take; ++k) {
    result.append.push_back(tokens[k]);
    if (IsEos(tokens[k])) break;
  }
  // The first token is always taken (as a verifier's own token would be); the other D-1 are the
  // step's drafts, of which the prefix rule accepted append.size() - 1.
  result.drafted = size - 1;
  result.accepted = static_cast<int>(result.append.size()) - 1;
  return result;
}

absl::StatusOr<StepResult> NspMode::ConsumeDraft(const DecodeState& state, const StepPlan& plan,
                                                 const ExtendOutput& out) {
  const int pending = state.pending();
  const int size = static_cast<int>(plan.outputs.size()) - 1;  // block rows after the AR row
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  const std::span<const float> ar = LogitsRow(out, 0, vocab_size_);
  if (size <= 0) {
    result.append.push_back(SampleToken(ar, *state.sampling, length));
    return result;
  }
  std::vector<int32_t> drafts;
  for (int k = 0; k < size; ++k) drafts.push_back(Argmax(LogitsRow(out, 1 + k, vocab_size_)));
  // d1..dm: the drafts the verify forward can check without overrunning the budget or the
  // context (it appends the accepted ones plus one more token after v0).
  const int m = std::max(
      0, std::min({size - 1, state.budget - 2, max_positions_ - static_cast<int>(length) - 1}));
  cycle_.ConsumeDraft(state, ar, std::move(drafts), m, &result);
  return result;
}

}  // namespace tandem
