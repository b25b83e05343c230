// The verifier's side of remote drafting: the draft chain a drafter streamed for one sequence,
// and a Drafter that serves SpecMode from it. The engine thread writes the buffer (chains
// arrive through its mailbox) and the mode reads it while planning on the same thread.
//
// Not thread-safe: owned by the engine thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/decoding/drafter.h"
#include "worker/engine/draft_channel.h"

namespace tandem {

// The latest draft chain of one sequence: tokens for sequence indices [from, from + size), or a
// block draft (`slots` not empty): tokens[r] for slot slots[r] of the block starting at `from`,
// in the drafter's decoding order.
struct DraftChainBuffer {
  // Branch-ahead chains kept at once (the newest); more is a drafter's bug or a flood.
  static constexpr size_t kMaxKeptBranches = 8;
  struct Branch {
    int from = 0;
    std::vector<int32_t> tokens;
  };

  int from = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> slots;
  // Alternatives drafted for likely partial acceptances of the chain (DraftChain.branch).
  std::vector<Branch> branches;
  // Off after a chain with an error or a broken channel: the sequence decodes by AR steps.
  bool enabled = true;
  absl::Status error;

  // A chain starting where this one ends extends it, unless this one already disagrees with
  // `sequence` (the sequence's tokens now): a drafter that drafted from a rejected draft's
  // position starts where the old chain ends, but means a new chain. Any other chain replaces
  // it. A block draft always replaces, and is always replaced. A branch joins the branches
  // (those the sequence has passed are dropped). An error turns drafting off.
  void Merge(DraftChain chain, std::span<const int32_t> sequence);
  // Draft tokens usable after `tokens`: the chain must agree with `tokens` on
  // [from, tokens.size()); then the chain's tokens past tokens.size() are drafts. When it does
  // not, the branch that does with the most drafts. Left-to-right chains only (empty for a
  // block draft).
  std::span<const int32_t> Usable(std::span<const int32_t> tokens) const;
  // Whether Usable(tokens) comes from a branch.
  bool UsableFromBranch(std::span<const int32_t> tokens) const;
  // Drafts available for the step after `tokens`: Usable(tokens).size(), or for a block draft
  // its size when its block starts at tokens.size() (else 0).
  int Available(std::span<const int32_t> tokens) const;
};

// Serves SpecMode (Draft) and SimSdMode (DraftBlock) from a DraftChainBuffer that outlives it.
// An error when the chain holds no usable draft (SpecMode then takes an AR step, SimSdMode a
// completion step). DraftBlock from a block draft: the block must start at the sequence's end
// and the draft's first k entries must be exactly the block's k decoded slots with their
// tokens (the drafter's own path so far, which its later entries continue); it answers the
// entries after them. From a left-to-right chain it drafts as Drafter::DraftBlock does.
class ChainDrafter : public Drafter {
 public:
  explicit ChainDrafter(const DraftChainBuffer* buffer) : buffer_(buffer) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override;
  absl::StatusOr<BlockDraft> DraftBlock(std::span<const int32_t> tokens,
                                        std::span<const int32_t> block, int gamma) override;
  const DrafterStats& stats() const override { return stats_; }
  // At most `limit` drafts per call from now on (the engine's γ for the step); 0 answers no
  // drafts without an error, so that SpecMode takes an AR step by choice. < 0 = no limit.
  void set_limit(int limit) { limit_ = limit; }

 private:
  const DraftChainBuffer* buffer_;
  int limit_ = -1;
  DrafterStats stats_;
};

}  // namespace tandem
