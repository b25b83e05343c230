// `nsp`: next sequence prediction on an SDLM checkpoint (SDLM §3.2-3.4).
//
// An SDLM model predicts a block of D tokens from a noise block [x[T-1], <|mask|> x (D-1)]
// placed at positions T-1 .. T+D-2 after a sequence of T tokens: the block's rows attend to the
// committed prefix x[0..T-1) and bidirectionally to each other, and ("shifted prediction", as
// AR logits) the row at position p predicts the token at p + 1, so the D rows predict
// x[T .. T+D-1]. The block's first token is a copy of the last token, which also sits among
// the pending tokens in causal form (whose KV is kept); the block rows do not read that causal
// copy, and the block's own KV is dropped. One extend per step:
//   [pending (causal, KV kept) | x[T-1] copy at T-1, <|mask|> at T .. T+D-2 (block, dropped)]
// (the layout tools/train/sdlm.py trains).
//
// Two variants:
//  * Longest prefix decoding (verify = false), LOSSY: the step keeps the longest prefix of the
//    block's tokens whose product of confidences is >= tau, and at least one token (eq. 7).
//    Confidence is the decoded token's softmax probability (eq. 8) or entropy-normalised,
//    1 - H(p) / log |V| (eq. 9). The output is the block pathway's, not the AR distribution.
//    Under a constraint (structured output) row k is masked to what the constraint allows after
//    the block's first k tokens before its token is drawn, so the prefix kept is one it accepts.
//  * Self-speculative (verify = true), LOSSLESS: the block's D tokens are drafts that the
//    causal (AR) pathway verifies, as in linear self-speculation. The draft forward also
//    returns the last pending row, the AR prediction v0 of x[T], which checks the first draft
//    there; when it holds, a verify forward [v0 (pending) | d1..dm (causal)] accepts the longest
//    prefix of d1..dm the AR pathway reproduces plus one more token (greedy: token for token;
//    sampling: point-mass p/q verification). SDLM §3.4 verifies with a second forward of the
//    block model; verifying with the causal pathway instead makes the output the model's AR
//    output exactly.
// Draft accounting: longest prefix decoding reports the block's D-1 tokens after the first as a
// step's drafts and the kept tokens after the first as accepted; the self-speculative variant
// reports a cycle's drafts and accepted drafts as self_spec does.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/verify.h"

namespace tandem {

enum class NspConfidence {
  kLogit,    // softmax probability of the decoded token (SDLM eq. 8)
  kEntropy,  // 1 - H(softmax) / log |V| (SDLM eq. 9)
};

struct NspOptions {
  int block_size = 4;      // D: tokens predicted per step (the model's training block)
  int32_t mask_token = 0;  // the checkpoint's <|mask|> id
  float tau = 0.9f;        // longest prefix decoding: keep while the product is >= tau
  NspConfidence confidence = NspConfidence::kLogit;
  bool verify = false;  // self-speculative verification by the AR pathway (lossless)
  // Longest prefix decoding ends a step's tokens after the first of these.
  std::vector<int32_t> eos_tokens;
};

absl::Status ValidateNspOptions(const NspOptions& options, int vocab_size);

// SDLM eq. 7: the largest j in 1..size with confidences[0] * ... * confidences[j-1] >= tau,
// or 1 when there is none (at least one token per step). `confidences` is not empty.
int LongestConfidentPrefix(std::span<const float> confidences, float tau);

// Confidence of one row's decoded token; `logits` has the <|mask|> entry already removed
// (set to -inf).
float NspTokenConfidence(std::span<const float> logits, int32_t token, NspConfidence kind);

class NspMode : public DecodingMode {
 public:
  NspMode(NspOptions options, int vocab_size, int max_positions)
      : options_(std::move(options)), vocab_size_(vocab_size), max_positions_(max_positions) {}

  std::string_view name() const override { return "nsp"; }
  bool lossless() const override { return options_.verify; }
  StepPlan Plan(const DecodeState& state) override;
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

 private:
  StepPlan PlanBlock(const DecodeState& state);
  absl::StatusOr<StepResult> ConsumePrefix(const DecodeState& state, const StepPlan& plan,
                                           const ExtendOutput& out);
  absl::StatusOr<StepResult> ConsumeDraft(const DecodeState& state, const StepPlan& plan,
                                          const ExtendOutput& out);
  bool IsEos(int32_t token) const;

  NspOptions options_;
  int vocab_size_;
  int max_positions_;
  SelfSpecCycle cycle_;     // the self-speculative variant's draft-then-verify cycle
  std::vector<float> row_;  // scratch: one row of logits
};

}  // namespace tandem
