// `jacobi`: greedy Jacobi fixed-point decoding of an AR target (pcLLM §2.1), with rejection
// recycling and multi-block decoding (pcLLM §3.2, Algorithm 1). Lossless: the output equals
// greedy AR decoding token for token.
//
// The mode keeps a chain of guesses for the tokens after the sequence, at sequence indices
// T, T+1, ... (T = sequence length). The chain is cut into blocks of n tokens: the real-active
// block RA, whose span [ra_start, ra_start + n) holds T, and up to K-1 pseudo-active blocks on
// the spans after it. One step is one extend:
//
//   [pending tokens | chain: RA window (n) | pseudo-active blocks ... | candidate 1 | ...]
//    causal            causal over everything before it               each sees the pending
//                                                                     tokens and itself only
//
// The RA window is the first n chain tokens, positions T..T+n-1 (it may run into the next
// block's span once RA has accepted some tokens). Candidates sit at the same positions as the
// RA window: recycled n-grams from the pool keyed by the last sequence token, plus, with
// `prompt_lookup`, the tokens that followed the latest earlier occurrence of the sequence's
// last two tokens.
//
// Verification (greedy): g0 = argmax after the last pending token is always right. For the RA
// window and each candidate ("branch"), the accepted length k is the longest prefix whose
// drafts equal the argmax after their predecessor; the branch with the largest k wins (ties:
// the RA window, then earlier candidates). The sequence gains the k drafts plus the bonus token
// (argmax after the last accepted one); the KV kept is the pending tokens plus those k drafts,
// whose KV was computed seeing exactly the sequence before them. Pseudo-active blocks never
// commit: their drafts are conditioned on unverified drafts. StepResult::drafted counts the RA
// window (candidates are alternatives for the same positions); accepted is k.
//
// Update (Jacobi iteration): every chain token after the accepted ones becomes the model's
// prediction at its position (from the winning branch where it covers the position), except
// the frozen prefix of a pseudo-active block: tokens that matched their prediction
// ("pseudo-accepted", stationary) are fed again unchanged, without logits, until the block is
// promoted. The chain is then padded to cover the RA window and every block span: each new
// guess continues the last token with what followed its latest earlier occurrence in the
// sequence after the same token (bigram prompt lookup), else with the freshest pool
// continuation of it, else with what followed any earlier occurrence of it, else by repeating
// it. The first draft of a sequence is such a padding of the empty chain (deterministic).
//
// Blocks: a pseudo-active block spawns (one per step, at most K blocks in all) when RA has
// accepted >= ceil(r n) tokens of its span or a pseudo-active block has pseudo-accepted as
// many; when RA's span is complete the next block is promoted to RA (its pseudo-accepted
// tokens become ordinary RA drafts, verified again), or a fresh RA starts after it.
//
// Pool (rejection recycling; kept when pool_size and candidates are both > 0): after each step
// the rejected tail of the RA window is recorded as n-grams: each rejected draft token keyed by
// its predecessor, continued by the drafts after it in the window.
//
// Limits: drafts never exceed budget - 1 (so a step gains at most `budget` tokens) and no
// position reaches max_positions; near either limit the chain is cut, down to an AR step.
// A step with more than 256 pending tokens (a prefill) verifies no candidates: their explicit
// mask is quadratic in the extend.
//
// One instance decodes one sequence at a time; it notices a different or restarted sequence
// (length or last token not what its last step left) and starts over, pool included.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/ngram_pool.h"

namespace tandem {

struct JacobiOptions {
  int block_size = 16;       // n: draft tokens verified per step (the RA window)
  int blocks = 1;            // K: blocks in flight (1 = plain Jacobi)
  float spawn_ratio = 0.5f;  // r: spawn threshold ceil(r n) accepted tokens
  int pool_size = 64;        // n-gram pool entries (0 = no rejection recycling)
  int candidates = 2;        // recycled candidates verified per step (0 = none)
  // One more candidate per step: the tokens that followed the latest earlier occurrence of the
  // sequence's last two tokens (prompt lookup). Not part of pcLLM; off by default.
  bool prompt_lookup = false;
};

// Draft tokens one step may add to its extend: (blocks + candidates + prompt_lookup) *
// block_size. Callers size the KV cache with this much headroom past the sequence.
inline constexpr int kMaxJacobiDraftTokens = 256;

// InvalidArgument naming the option when out of range.
absl::Status ValidateJacobiOptions(const JacobiOptions& options);

// Counters over the instance's lifetime, for tests and tuning.
struct JacobiStats {
  int64_t steps = 0;
  int64_t candidates_verified = 0;  // candidate branches put in extends
  int64_t candidate_wins = 0;       // steps where a candidate beat the RA window
  int64_t spawns = 0;               // pseudo-active blocks spawned
  int64_t promotions = 0;           // pseudo-active blocks promoted to RA
  int64_t frozen_fed = 0;           // pseudo-accepted tokens fed without logits
};

class JacobiMode : public DecodingMode {
 public:
  // `max_positions`: the model's max_position_embeddings (0 = no limit).
  JacobiMode(const JacobiOptions& options, int vocab_size, int max_positions);

  std::string_view name() const override { return "jacobi"; }
  bool lossless() const override { return true; }
  StepPlan Plan(const DecodeState& state) override;
  // InvalidArgument for non-greedy sampling; Internal when `plan` is not the last Plan().
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

  const JacobiStats& stats() const { return stats_; }

 private:
  struct PseudoBlock {
    int start = 0;     // sequence index of the block's first token
    int accepted = 0;  // pseudo-accepted (frozen) prefix length
  };
  struct Candidate {
    int offset = 0;  // plan index of its first token
    std::vector<int32_t> tokens;
  };
  // The step between Plan and Consume.
  struct Layout {
    int size = 0;     // plan tokens
    int pending = 0;  // plan indices [0, pending)
    int chain = 0;    // chain tokens planned, at plan indices [pending, pending + chain)
    int window = 0;   // of those, the RA window: min(n, chain)
    std::vector<uint8_t> frozen;  // [chain] fed without re-prediction
    std::vector<int> row;         // [size] logits row of each plan index, -1 = none
    std::vector<Candidate> candidates;
  };

  void Reset(const DecodeState& state);
  bool Frozen(int chain_index) const;  // against base_ and pseudo_
  void Pad(std::span<const int32_t> tokens, size_t length);
  void RecordRejected(int32_t last_token, int accepted);
  void UpdateBlocks();

  JacobiOptions options_;
  int vocab_size_;
  int max_positions_;
  int spawn_threshold_;  // ceil(r n)

  int base_ = -1;  // sequence length the chain starts at; -1 before the first step
  int32_t last_token_ = 0;
  int ra_start_ = 0;
  std::vector<PseudoBlock> pseudo_;  // contiguous spans after RA's, in order
  std::vector<int32_t> chain_;       // guesses for sequence indices base_, base_ + 1, ...
  NgramPool pool_;
  Layout layout_;
  JacobiStats stats_;
};

}  // namespace tandem
