// Drafters propose the tokens a speculative step verifies. A drafter sees only final tokens (the
// sequence so far) and answers greedy drafts: with a point-mass draft distribution the verifier
// needs no q on the wire (accept x̂ with probability p(x̂), else resample from p without x̂).
//
// Two kinds of draft: Draft() continues the sequence left to right (`spec`); DraftBlock() fills
// undecoded slots of a block in the drafter's own decoding order (`simsd`, SimSD §3.2: the
// draft-induced order). Every drafter answers both: by default DraftBlock() drafts the slots
// after the block's decoded prefix left to right with Draft().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/transformer.h"

namespace tandem {

// Counters over a drafter's lifetime.
struct DrafterStats {
  int64_t calls = 0;
  int64_t forwards = 0;       // drafter model forwards
  int64_t drafted = 0;        // draft tokens returned
  int64_t reused_tokens = 0;  // tokens whose KV was already cached when a call began
  int64_t fed_tokens = 0;     // tokens fed to the drafter model (catch-up and drafts)
};

// A slot of a DraftBlock() block that is not decoded yet.
inline constexpr int32_t kUndecodedSlot = -1;

// Drafts for slots of a block, in the order the drafter decoded them: draft r is `tokens[r]` for
// slot `slots[r]` (offset from the block's first position). Slots are distinct undecoded slots.
struct BlockDraft {
  std::vector<int32_t> slots;
  std::vector<int32_t> tokens;

  int size() const { return static_cast<int>(tokens.size()); }
};

class Drafter {
 public:
  virtual ~Drafter() = default;

  // Up to `gamma` greedy continuation tokens of `tokens` (prompt + generated, all final, not
  // empty); fewer when the drafter's context ends first. Errors mean no drafts this time: the
  // caller takes an AR step.
  virtual absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens,
                                                     int gamma) = 0;
  // Up to `gamma` drafts for the undecoded slots of `block`, the block that follows `tokens`
  // (its slots at sequence indices tokens.size() ..; decoded slots hold their token, the others
  // kUndecodedSlot), in the drafter's decoding order. The default drafts the slots right after
  // the block's decoded prefix with Draft(tokens + prefix, gamma), slots prefix, prefix + 1, ...;
  // when a decoded slot follows an undecoded one it answers no drafts (it drafts left to right
  // only). Errors as for Draft().
  virtual absl::StatusOr<BlockDraft> DraftBlock(std::span<const int32_t> tokens,
                                                std::span<const int32_t> block, int gamma);
  virtual const DrafterStats& stats() const = 0;

  // Drafters conditioned on the target's hidden states (DFlash-style) name the target layers
  // they need (extend hidden-state taps); the verifier then taps them on every forward. Empty:
  // the drafter sees tokens only.
  virtual std::vector<int32_t> HiddenLayers() const { return {}; }
  // The target's hidden states of sequence tokens [start, start + tokens.size()), computed from
  // final KV only (the extend saw nothing but final tokens before them). `hidden`:
  // [HiddenLayers().size(), tokens.size(), hidden_size]. Rows arrive in order; an error means
  // the drafter dropped them (its next drafts may be fewer), never a failed sequence.
  virtual absl::Status AddHidden(int start, std::span<const int32_t> tokens,
                                 std::span<const float> hidden) {
    (void)start;
    (void)tokens;
    (void)hidden;
    return absl::OkStatus();
  }
};

// An AR model in this process drafting with its own KV cache and one sequence. The cache
// follows the caller's sequence incrementally: each call truncates it to the longest common
// prefix of the cached tokens and the new ones, feeds the missing tokens together with the
// first draft's forward, then feeds each draft to get the next (gamma forwards per call). The
// drafts' KV stays cached, so the drafts the verifier accepts cost nothing next call.
//
// Not thread-safe; one sequence at a time (a different sequence just shares no prefix).
class InProcessArDrafter : public Drafter {
 public:
  // `model` is not owned and must outlive the drafter; it may be the target model itself (the
  // drafter only ever uses its own cache). The cache holds `capacity` tokens; drafts stop short
  // of it and of the model's context.
  InProcessArDrafter(Transformer* model, int capacity);

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override;
  const DrafterStats& stats() const override { return stats_; }

 private:
  // Feeds `tokens` after the cached ones, commits them all and returns the greedy next token.
  absl::StatusOr<int32_t> Feed(std::span<const int32_t> tokens);

  Transformer* model_;
  int capacity_;
  KvCache kv_;
  std::vector<int32_t> cached_;  // tokens whose KV is committed in kv_, in order
  DrafterStats stats_;
};

}  // namespace tandem
