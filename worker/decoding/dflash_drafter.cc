#include "worker/decoding/dflash_drafter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

void DFlashDrafter::Truncate(int length) {
  DFlashModel::TruncateContext(context_, length);
  context_tokens_.resize(std::min<size_t>(context_tokens_.size(), std::max(length, 0)));
}

absl::Status DFlashDrafter::AddHidden(int start, std::span<const int32_t> tokens,
                                      std::span<const float> hidden) {
  const int have = static_cast<int>(context_tokens_.size());
  if (start > have) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash drafter: hidden rows from token ", start,
                                                   " but the context holds ", have));
  }
  // Rows for tokens already held replace them (a new sequence, or a repeat).
  if (start < have) Truncate(start);
  absl::Status appended = model_->AppendContext(context_, hidden, static_cast<int>(tokens.size()));
  if (!appended.ok()) {
    Truncate(start);
    return appended;
  }
  context_tokens_.insert(context_tokens_.end(), tokens.begin(), tokens.end());
  stats_.fed_tokens += static_cast<int64_t>(tokens.size());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> DFlashDrafter::Draft(std::span<const int32_t> tokens,
                                                          int gamma) {
  ++stats_.calls;
  if (tokens.empty()) return absl::InvalidArgumentError("drafter got an empty sequence");
  // Keep the context rows of the longest common prefix only.
  size_t common = 0;
  while (common < context_tokens_.size() && common < tokens.size() &&
         context_tokens_[common] == tokens[common]) {
    ++common;
  }
  if (common < context_tokens_.size()) Truncate(static_cast<int>(common));
  stats_.reused_tokens += static_cast<int64_t>(common);
  std::vector<int32_t> drafts;
  const DFlashConfig& config = model_->config();
  const int anchor = static_cast<int>(tokens.size() - common);
  if (gamma <= 0 || anchor < 1 || anchor > config.max_anchor) return drafts;
  TANDEM_ASSIGN_OR_RETURN(drafts, model_->Draft(context_, tokens.subspan(common)));
  ++stats_.forwards;
  if (static_cast<int>(drafts.size()) > gamma) drafts.resize(gamma);
  stats_.drafted += static_cast<int64_t>(drafts.size());
  return drafts;
}

}  // namespace tandem
