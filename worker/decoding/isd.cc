#include "worker/decoding/isd.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

int32_t VerifyProposal(std::span<const float> p, std::span<const float> q, int32_t token, float tau,
                       double u_accept, double u_resample, bool* accepted,
                       std::vector<float>* scratch) {
  const double p_token = p[token];
  const double q_token = q.empty() ? 1.0 : q[token];
  const double ratio = q_token > 0 ? (1.0 + tau) * p_token / q_token : 1.0;
  *accepted = u_accept < std::min(1.0, ratio);
  if (*accepted) return token;
  std::vector<float>& residual = *scratch;
  residual.assign(p.begin(), p.end());
  if (q.empty()) {
    residual[token] = 0.0f;
  } else {
    for (size_t i = 0; i < residual.size(); ++i) residual[i] = std::max(0.0f, p[i] - q[i]);
  }
  const int32_t resampled = SampleFromDistribution(residual, u_resample);
  // An empty residual (p <= q everywhere, i.e. p = q up to rounding) means the rejection
  // could only come from rounding: p itself is then the distribution to draw from.
  return resampled >= 0 ? resampled : SampleFromDistribution(p, u_resample);
}

absl::Status ValidateIsdOptions(const IsdOptions& options, int vocab_size) {
  if (options.stride < 2 || options.stride > kMaxIsdStride) {
    return absl::InvalidArgumentError(
        absl::StrCat("isd stride must be in [2, ", kMaxIsdStride, "], got ", options.stride));
  }
  if (!(options.tau >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("isd tau must be >= 0 (0 = exact p/q acceptance), got ", options.tau));
  }
  if (options.mask_token < 0 || options.mask_token >= vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("isd mask token ", options.mask_token,
                                                   " is outside the vocabulary of ", vocab_size));
  }
  if (options.verifier == nullptr) {
    return absl::InvalidArgumentError("isd needs an acceptance rule");
  }
  return absl::OkStatus();
}

StepPlan IsdMode::Plan(const DecodeState& state) {
  StepPlan plan;
  AppendPending(state, &plan);
  const int length = static_cast<int>(state.tokens.size());
  const int room = max_positions_ > 0 ? max_positions_ - length : kMaxIsdStride * 2;
  // Drafts verified: each accepted one plus the resampled or bonus token must fit the budget.
  const int m = std::max(
      0, std::min({static_cast<int>(drafts_.size()), state.budget - 1, std::max(0, room)}));
  // Masks pay only when the next step can verify at least one of their proposals (budget left
  // after this step's m + 1 tokens >= 2) and they fit in the context.
  int masks = 0;
  if (state.budget - (m + 1) >= 2) {
    masks = std::max(0, std::min(options_.stride - 1, room - m));
  }
  for (int i = 0; i < m; ++i) {
    plan.tokens.push_back(drafts_[i]);
    plan.positions.push_back(length + i);
  }
  for (int j = 0; j < masks; ++j) {
    plan.tokens.push_back(options_.mask_token);
    plan.positions.push_back(length + m + j);
  }
  plan.visible = Visibility::Causal();
  const int pending = state.pending();
  if (options_.lora_masks && masks > 0) {
    plan.lora_gate.assign(plan.tokens.size(), 0);
    std::fill(plan.lora_gate.end() - masks, plan.lora_gate.end(), 1);
  }
  for (int i = pending - 1; i < static_cast<int>(plan.tokens.size()); ++i) {
    plan.outputs.push_back(i);
  }
  planned_drafts_ = m;
  planned_masks_ = masks;
  return plan;
}

absl::StatusOr<StepResult> IsdMode::Consume(const DecodeState& state, const StepPlan& plan,
                                            const ExtendOutput& out) {
  const int pending = state.pending();
  const int m = planned_drafts_;
  const int masks = planned_masks_;
  if (pending < 1) return absl::InternalError("isd needs a pending token to predict from");
  if (static_cast<int>(plan.tokens.size()) != pending + m + masks ||
      out.logits.size() != static_cast<size_t>(1 + m + masks) * vocab_size_) {
    return absl::InternalError(absl::StrCat("isd planned ", 1 + m + masks,
                                            " output rows but got logits for ",
                                            out.logits.size() / std::max(1, vocab_size_)));
  }
  const SamplingParams& sampling = *state.sampling;
  const bool greedy = sampling.greedy();
  const uint64_t length = state.tokens.size();
  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);

  // Introspection: row i is the anchor of index length + i.
  int accepted = 0;
  for (; accepted < m; ++accepted) {
    const int i = accepted;
    const std::span<const float> anchor = LogitsRow(out, i, vocab_size_);
    const uint64_t index = length + i;
    int32_t token;
    bool ok;
    if (greedy) {
      token = Argmax(anchor);
      ok = token == drafts_[i];
    } else {
      SamplingDistribution(anchor, sampling, &p_);
      const std::span<const float> q =
          options_.argmax_proposals
              ? std::span<const float>()
              : std::span<const float>(draft_q_.data() + static_cast<size_t>(i) * vocab_size_,
                                       vocab_size_);
      token = options_.verifier(
          p_, q, drafts_[i], options_.tau, UniformRandom(sampling.seed, index, RngPurpose::kAccept),
          UniformRandom(sampling.seed, index, RngPurpose::kResample), &ok, &scratch_);
    }
    result.append.push_back(token);
    if (!ok) break;
    result.keep.push_back(pending + i);
  }
  result.drafted = m;
  result.accepted = accepted;
  drafts_.clear();
  draft_q_.clear();
  if (accepted < m) return result;  // the next step proposes afresh

  // Stride: the exact token of this step and the masks' proposals after it.
  const uint64_t bonus_index = length + m;
  result.append.push_back(SampleToken(LogitsRow(out, m, vocab_size_), sampling, bonus_index));
  for (int j = 0; j < masks; ++j) {
    const std::span<const float> row = LogitsRow(out, m + 1 + j, vocab_size_);
    const uint64_t index = bonus_index + 1 + j;
    if (greedy || options_.argmax_proposals) {
      drafts_.push_back(Argmax(row));
      continue;
    }
    SamplingDistribution(row, sampling, &p_);
    drafts_.push_back(
        SampleFromDistribution(p_, UniformRandom(sampling.seed, index, RngPurpose::kDraft)));
    draft_q_.insert(draft_q_.end(), p_.begin(), p_.end());
  }
  return result;
}

}  // namespace tandem
