#include "worker/decoding/self_spec_quadratic.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/decoding/verify.h"

namespace tandem {

namespace {

// Softmax of `logits` in double, into `probs` (resized).
void Softmax(std::span<const float> logits, std::vector<double>* probs) {
  probs->resize(logits.size());
  float top = -std::numeric_limits<float>::infinity();
  for (float x : logits) top = std::max(top, x);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    (*probs)[i] = std::exp(static_cast<double>(logits[i]) - top);
    total += (*probs)[i];
  }
  for (double& p : *probs) p /= total;
}

}  // namespace

absl::Status ValidateSelfSpecQuadraticOptions(const SelfSpecQuadraticOptions& options,
                                              int vocab_size) {
  if (options.draft_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("self_spec_quadratic draft length must be >= 1, got ", options.draft_len));
  }
  if (options.mask_token < 0 || options.mask_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("self_spec_quadratic mask token ",
                                                   options.mask_token,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  if (!(options.lambda >= 0.0f && options.lambda <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "self_spec_quadratic lambda (diffusion verifier weight) must be in [0, 1], got ",
        options.lambda));
  }
  return absl::OkStatus();
}

StepPlan SelfSpecQuadraticMode::Plan(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  const int length = static_cast<int>(state.tokens.size());
  // Drafts made for another length (none yet, or the sequence changed) are dropped. A step
  // gains at most m + 1 tokens, and every draft needs a position inside the context.
  int m = drafts_start_ == length ? static_cast<int>(drafts_.size()) : 0;
  m = std::max(0, std::min({m, state.budget - 1, max_positions_ - length}));
  // A shifted group starts one position earlier, on a copy of the chain token there (without a
  // pending token there is none: Consume reports the broken invariant).
  const int shift = options_.shifted ? 1 : 0;
  // With one token of budget left no drafts can follow: the step is an AR step.
  const bool groups = state.budget >= 2 && pending >= shift;

  layout_ = Layout{};
  layout_.pending = pending;
  // Plan indices: the causal chain (pending tokens then drafts) and each group's masks.
  std::vector<int> chain;
  for (int i = 0; i < pending; ++i) chain.push_back(i);
  std::vector<int> group_start;
  for (int a = 0; a <= m; ++a) {
    if (a > 0) {
      layout_.draft_index.push_back(static_cast<int>(plan.tokens.size()));
      chain.push_back(static_cast<int>(plan.tokens.size()));
      plan.tokens.push_back(drafts_[a - 1]);
      plan.positions.push_back(length + a - 1);
    }
    const int first = length + a - shift;  // the group's first position
    const int size = groups ? std::max(0, std::min(options_.draft_len, max_positions_ - first)) : 0;
    group_start.push_back(static_cast<int>(plan.tokens.size()));
    layout_.group_sizes.push_back(size);
    for (int r = 0; r < size; ++r) {
      const int32_t token =
          shift == 1 && r == 0 ? plan.tokens[chain[pending - 1 + a]] : options_.mask_token;
      plan.tokens.push_back(token);
      plan.positions.push_back(first + r);
    }
  }

  const int n = static_cast<int>(plan.tokens.size());
  plan.visible = Visibility::Explicit(n);
  for (size_t i = 0; i < chain.size(); ++i) {
    for (size_t j = 0; j <= i; ++j) plan.visible.Allow(chain[i], chain[j]);
  }
  for (int a = 0; a <= m; ++a) {
    // Group a sees the pending tokens and e_0..e_{a-1}: the first pending + a chain entries;
    // a shifted group all but the last of them, whose copy heads the group.
    const int prefix = pending + a - shift;
    for (int r = 0; r < layout_.group_sizes[a]; ++r) {
      const int row = group_start[a] + r;
      for (int j = 0; j < prefix; ++j) plan.visible.Allow(row, chain[j]);
      for (int s = 0; s < layout_.group_sizes[a]; ++s) plan.visible.Allow(row, group_start[a] + s);
    }
  }

  // Like `self_spec`, a step without masks (the last token of the budget) carries no gate.
  if (options_.lora_masks && n > static_cast<int>(chain.size())) {
    plan.lora_gate.assign(static_cast<size_t>(n), 0);
    for (int a = 0; a <= m; ++a) {
      std::fill_n(plan.lora_gate.begin() + group_start[a], layout_.group_sizes[a], 1);
    }
  }

  // Outputs in plan order: the last pending row, then each group and draft as they come.
  plan.outputs.push_back(pending - 1);
  layout_.ar_rows.push_back(0);
  for (int a = 0; a <= m; ++a) {
    if (a > 0) {
      layout_.ar_rows.push_back(static_cast<int>(plan.outputs.size()));
      plan.outputs.push_back(layout_.draft_index[a - 1]);
    }
    layout_.group_rows.push_back(static_cast<int>(plan.outputs.size()));
    for (int r = 0; r < layout_.group_sizes[a]; ++r) plan.outputs.push_back(group_start[a] + r);
  }
  return plan;
}

std::span<const float> SelfSpecQuadraticMode::VerifierLogits(const ExtendOutput& out, int a) {
  const std::span<const float> ar = LogitsRow(out, layout_.ar_rows[a], vocab_size_);
  // Near the context end a group may have no mask 0; AR alone verifies there.
  if (options_.lambda == 0.0f || layout_.group_sizes[a] == 0) return ar;
  std::vector<double> p_ar, p_diff;
  Softmax(ar, &p_ar);
  Softmax(LogitsRow(out, layout_.group_rows[a], vocab_size_), &p_diff);
  // Log-probabilities of the mixture serve as logits, so temperature, top-k and top-p apply
  // to the ensemble exactly as they would to a model's logits. A token the AR row rules out
  // (-inf: a grammar's mask, a stop token min_tokens holds back) stays out: the diffusion row's
  // context holds masks, so the driver could not mask it.
  mixed_.resize(vocab_size_);
  const double lambda = options_.lambda;
  for (int v = 0; v < vocab_size_; ++v) {
    const bool allowed = ar[v] != -std::numeric_limits<float>::infinity();
    const double p = allowed ? (1 - lambda) * p_ar[v] + lambda * p_diff[v] : 0.0;
    mixed_[v] = p > 0 ? static_cast<float>(std::log(p)) : -std::numeric_limits<float>::max();
  }
  return mixed_;
}

absl::StatusOr<StepResult> SelfSpecQuadraticMode::Consume(const DecodeState& state,
                                                          const StepPlan& plan,
                                                          const ExtendOutput& out) {
  const int pending = state.pending();
  if (pending < 1 || pending != layout_.pending) {
    return absl::InternalError("self_spec_quadratic: the step consumed is not the one planned");
  }
  const int m = static_cast<int>(layout_.draft_index.size());
  const size_t rows = plan.outputs.size();
  if (out.logits.size() != rows * static_cast<size_t>(vocab_size_)) {
    return absl::InternalError(absl::StrCat("self_spec_quadratic expected logits for ", rows,
                                            " rows, got ", out.logits.size(), " values"));
  }
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  int a = 0;
  bool rejected = false;
  for (; a < m; ++a) {
    bool accepted = false;
    const int32_t token = VerifyDraft(VerifierLogits(out, a), plan.tokens[layout_.draft_index[a]],
                                      *state.sampling, length + a, &accepted, &probs_);
    result.append.push_back(token);
    if (!accepted) {
      rejected = true;
      break;
    }
    result.keep.push_back(layout_.draft_index[a]);
  }
  if (!rejected) {
    result.append.push_back(SampleToken(VerifierLogits(out, m), *state.sampling, length + m));
  }
  result.drafted = m;
  result.accepted = a;

  // The next drafts: masks 1.. of the group that follows the accepted prefix.
  drafts_.clear();
  for (int r = 1; r < layout_.group_sizes[a]; ++r) {
    drafts_.push_back(Argmax(LogitsRow(out, layout_.group_rows[a] + r, vocab_size_)));
  }
  drafts_start_ = static_cast<int>(length) + a + 1;
  return result;
}

}  // namespace tandem
