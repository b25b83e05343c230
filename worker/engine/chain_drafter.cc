#include "worker/engine/chain_drafter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

void DraftChainBuffer::Merge(DraftChain chain, std::span<const int32_t> sequence) {
  if (!chain.error.ok()) {
    enabled = false;
    error = std::move(chain.error);
    tokens.clear();
    return;
  }
  if (chain.from < 0) return;  // malformed: ignore rather than draft from garbage
  const int end = from + static_cast<int>(tokens.size());
  bool agrees = true;
  for (int i = from; i < std::min(end, static_cast<int>(sequence.size())); ++i) {
    if (tokens[i - from] != sequence[i]) {
      agrees = false;
      break;
    }
  }
  if (!tokens.empty() && chain.from == end && agrees) {
    tokens.insert(tokens.end(), chain.tokens.begin(), chain.tokens.end());
    return;
  }
  from = chain.from;
  tokens = std::move(chain.tokens);
}

std::span<const int32_t> DraftChainBuffer::Usable(std::span<const int32_t> seq) const {
  const int t = static_cast<int>(seq.size());
  const int end = from + static_cast<int>(tokens.size());
  if (!enabled || from > t || end <= t) return {};
  for (int i = from; i < t; ++i) {
    if (tokens[i - from] != seq[i]) return {};
  }
  return std::span<const int32_t>(tokens).subspan(t - from);
}

absl::StatusOr<std::vector<int32_t>> ChainDrafter::Draft(std::span<const int32_t> tokens,
                                                         int gamma) {
  ++stats_.calls;
  if (limit_ >= 0) gamma = std::min(gamma, limit_);
  if (limit_ == 0) return std::vector<int32_t>();
  if (!buffer_->enabled) {
    return absl::UnavailableError(
        absl::StrCat("drafting is off for this sequence: ", buffer_->error.ToString()));
  }
  const std::span<const int32_t> usable = buffer_->Usable(tokens);
  if (usable.empty() || gamma <= 0) {
    return absl::UnavailableError(
        absl::StrCat("no draft chain covers sequence index ", tokens.size(), " yet"));
  }
  const size_t n = std::min(usable.size(), static_cast<size_t>(gamma));
  stats_.drafted += static_cast<int64_t>(n);
  return std::vector<int32_t>(usable.begin(), usable.begin() + static_cast<std::ptrdiff_t>(n));
}

}  // namespace tandem
