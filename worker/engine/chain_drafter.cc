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
  // Branches the sequence has passed can draft nothing more.
  std::erase_if(branches, [&](const Branch& b) {
    return b.from + static_cast<int>(b.tokens.size()) <= static_cast<int>(sequence.size());
  });
  if (chain.branch) {
    if (!chain.slots.empty() || chain.tokens.empty()) return;  // malformed
    if (branches.size() == kMaxKeptBranches) branches.erase(branches.begin());
    branches.push_back(Branch{.from = chain.from, .tokens = std::move(chain.tokens)});
    return;
  }
  if (!chain.slots.empty() || !slots.empty()) {
    // A block draft replaces and is replaced; one with a slot count that does not match its
    // tokens is malformed and dropped (no drafts rather than drafts from garbage).
    from = chain.from;
    if (chain.slots.size() != chain.tokens.size()) {
      tokens.clear();
      slots.clear();
      return;
    }
    tokens = std::move(chain.tokens);
    slots = std::move(chain.slots);
    return;
  }
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

namespace {

// The drafts of a chain of `tokens` from `from` after the sequence `seq`: empty unless the chain
// agrees with `seq` on [from, seq.size()) and goes past it.
std::span<const int32_t> DraftsAfter(int from, std::span<const int32_t> tokens,
                                     std::span<const int32_t> seq) {
  const int t = static_cast<int>(seq.size());
  const int end = from + static_cast<int>(tokens.size());
  if (from > t || end <= t) return {};
  for (int i = from; i < t; ++i) {
    if (tokens[i - from] != seq[i]) return {};
  }
  return tokens.subspan(t - from);
}

}  // namespace

std::span<const int32_t> DraftChainBuffer::Usable(std::span<const int32_t> seq) const {
  if (!enabled || !slots.empty()) return {};
  std::span<const int32_t> drafts = DraftsAfter(from, tokens, seq);
  if (!drafts.empty()) return drafts;
  // Of the branches that agree (the drafter may send several), the one that goes furthest.
  for (const Branch& b : branches) {
    std::span<const int32_t> more = DraftsAfter(b.from, b.tokens, seq);
    if (more.size() > drafts.size()) drafts = more;
  }
  return drafts;
}

bool DraftChainBuffer::UsableFromBranch(std::span<const int32_t> seq) const {
  return enabled && slots.empty() && DraftsAfter(from, tokens, seq).empty() && !Usable(seq).empty();
}

int DraftChainBuffer::Available(std::span<const int32_t> seq) const {
  if (slots.empty()) return static_cast<int>(Usable(seq).size());
  return enabled && from == static_cast<int>(seq.size()) ? static_cast<int>(slots.size()) : 0;
}

absl::StatusOr<BlockDraft> ChainDrafter::DraftBlock(std::span<const int32_t> tokens,
                                                    std::span<const int32_t> block, int gamma) {
  if (buffer_->slots.empty()) return Drafter::DraftBlock(tokens, block, gamma);
  ++stats_.calls;
  if (limit_ >= 0) gamma = std::min(gamma, limit_);
  if (limit_ == 0) return BlockDraft();
  if (!buffer_->enabled) {
    return absl::UnavailableError(
        absl::StrCat("drafting is off for this sequence: ", buffer_->error.ToString()));
  }
  if (buffer_->from != static_cast<int>(tokens.size())) {
    return absl::UnavailableError(
        absl::StrCat("no block draft for the block at sequence index ", tokens.size(), " yet"));
  }
  const int size = static_cast<int>(block.size());
  const int decoded =
      size - static_cast<int>(std::count(block.begin(), block.end(), kUndecodedSlot));
  const int n = static_cast<int>(buffer_->slots.size());
  if (decoded >= n) {
    return absl::UnavailableError("the block draft has no entry past the decoded slots");
  }
  for (int r = 0; r < decoded; ++r) {
    const int32_t slot = buffer_->slots[r];
    if (slot < 0 || slot >= size || block[slot] != buffer_->tokens[r]) {
      return absl::UnavailableError(
          "the block draft disagrees with the block's decoded slots (the drafter would draft "
          "the rest from another state)");
    }
  }
  BlockDraft draft;
  for (int r = decoded; r < n && draft.size() < gamma; ++r) {
    draft.slots.push_back(buffer_->slots[r]);
    draft.tokens.push_back(buffer_->tokens[r]);
  }
  stats_.drafted += draft.size();
  return draft;
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
