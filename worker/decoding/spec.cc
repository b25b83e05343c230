#include "worker/decoding/spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/decoding/verify.h"

namespace tandem {

SpecMode::SpecMode(int gamma, std::unique_ptr<Drafter> drafter, int vocab_size, int max_positions)
    : gamma_(gamma),
      drafter_(std::move(drafter)),
      vocab_size_(vocab_size),
      max_positions_(max_positions) {}

StepPlan SpecMode::Plan(const DecodeState& state) {
  const int t = static_cast<int>(state.tokens.size());
  // Drafts past budget - 1 could never be kept; draft positions t .. t + γ - 1 must stay inside
  // the context.
  int gamma = std::min(gamma_, state.budget - 1);
  if (max_positions_ > 0) gamma = std::min(gamma, max_positions_ - t);

  StepPlan plan;
  AppendPending(state, &plan);
  plan.hidden_layers = drafter_->HiddenLayers();
  const int pending = static_cast<int>(plan.tokens.size());
  if (gamma > 0) {
    absl::StatusOr<std::vector<int32_t>> drafts = drafter_->Draft(state.tokens, gamma);
    if (drafts.ok()) {
      const int n = std::min(gamma, static_cast<int>(drafts->size()));
      for (int i = 0; i < n; ++i) {
        const int32_t token = (*drafts)[i];
        if (token < 0 || token >= vocab_size_) break;
        plan.tokens.push_back(token);
        plan.positions.push_back(t + i);
      }
    } else {
      ++stats_.drafter_failures;
      stats_.last_drafter_error = drafts.status();
    }
  }
  for (int i = pending - 1; i < static_cast<int>(plan.tokens.size()); ++i) {
    plan.outputs.push_back(i);
  }
  // The model verifies the drafts (and samples the bonus token, or with γ = 0 the plain AR
  // token) where the logits are; nothing here needs the logits themselves.
  PlanDeviceVerify(state, &plan);
  return plan;
}

void SpecMode::HandOverHidden(const DecodeState& state, const StepPlan& plan,
                              const ExtendOutput& out, int kept) {
  // Only the kept prefix (pending tokens and accepted drafts) saw final tokens alone; the
  // rejected drafts' rows and the new token (no row yet) never reach the drafter.
  const size_t layers = plan.hidden_layers.size(), n = plan.tokens.size();
  const size_t width = out.hidden.size() / (layers * n);
  if (width == 0 || out.hidden.size() != layers * n * width) return;
  std::vector<float> rows(layers * kept * width);
  for (size_t l = 0; l < layers; ++l) {
    std::copy_n(out.hidden.begin() + l * n * width, kept * width, rows.begin() + l * kept * width);
  }
  const std::span<const int32_t> kept_tokens(plan.tokens.data(), static_cast<size_t>(kept));
  absl::Status added = drafter_->AddHidden(state.kv_len, kept_tokens, rows);
  if (!added.ok()) {
    ++stats_.drafter_failures;
    stats_.last_drafter_error = added;
  }
}

absl::StatusOr<StepResult> SpecMode::Consume(const DecodeState& state, const StepPlan& plan,
                                             const ExtendOutput& out) {
  const int pending = state.pending();
  const int gamma = static_cast<int>(plan.tokens.size()) - pending;
  // The step may come back with the model's verdicts (tokens, and accepted flags for the
  // drafts) and no logits.
  const size_t rows = static_cast<size_t>(gamma) + 1;
  const bool verified = out.tokens.size() == rows && (gamma == 0 || out.accepted.size() == rows);
  if (gamma < 0 || plan.outputs.size() != rows ||
      (!verified && out.logits.size() != rows * static_cast<size_t>(vocab_size_))) {
    return absl::InternalError(absl::StrCat("spec: Consume got a plan of ", plan.tokens.size(),
                                            " tokens with ", plan.outputs.size(), " outputs and ",
                                            out.logits.size(), " logits for ", pending,
                                            " pending tokens and a vocabulary of ", vocab_size_));
  }
  const SamplingParams& sampling = *state.sampling;
  const uint64_t t = state.tokens.size();

  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  // Reused across steps: a full-vocabulary buffer per draft is measurable at 150k tokens.
  thread_local std::vector<float> probs;
  int accepted = 0;
  int32_t next = -1;
  for (; accepted < gamma; ++accepted) {
    bool ok = false;
    absl::StatusOr<int32_t> token =
        VerifiedToken(out, accepted, vocab_size_, plan.tokens[pending + accepted], sampling,
                      t + accepted, &ok, &probs);
    if (!token.ok()) return token.status();
    next = *token;
    if (!ok) break;
  }
  if (accepted == gamma) {
    absl::StatusOr<int32_t> token = OutputToken(out, gamma, vocab_size_, sampling, t + gamma);
    if (!token.ok()) return token.status();
    next = *token;
  }
  for (int i = 0; i < accepted; ++i) {
    result.keep.push_back(pending + i);
    result.append.push_back(plan.tokens[pending + i]);
  }
  result.append.push_back(next);
  if (!plan.hidden_layers.empty()) HandOverHidden(state, plan, out, pending + accepted);
  result.drafted = gamma;
  result.accepted = accepted;
  ++stats_.steps;
  stats_.drafted += gamma;
  stats_.accepted += accepted;
  return result;
}

}  // namespace tandem
