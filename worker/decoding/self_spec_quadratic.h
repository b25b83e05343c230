// `self_spec_quadratic`: quadratic self-speculation on a tri-mode (AR + block diffusion) target,
// NLD §3.4 and Appendix C. Drafting and verification share ONE forward per step.
//
// Between steps the mode holds drafts e_0..e_{m-1} for positions L..L+m-1 (L = sequence
// length; m <= k - 1). A step's extend interleaves, as in the paper's Eq. 11,
//   [pending | G_0 | e_0 | G_1 | e_1 | ... | e_{m-1} | G_m]
// where G_a is a group of k <|mask|> tokens at positions L+a..L+a+k-1 that sees the committed
// prefix, the pending tokens, e_0..e_{a-1} and the masks of G_a (itself included): exactly the
// linear mode's draft pass for the sequence that has accepted e_0..e_{a-1}. Pending tokens and
// drafts are causal among themselves; masks are seen by no token outside their group.
//   - The last pending row and the rows of e_0..e_{m-1} are the AR pathway: row i predicts
//     position L+i and verifies e_i (greedy: token for token; sampling: point-mass p/q).
//   - With a drafts accepted, the token at L+a (correction or bonus) comes from AR row a, and
//     the masks 1..k-1 of G_a ("same_position": the mask at p predicts the token at p) are the
//     next step's drafts for L+a+1..L+a+k-1. Mask 0 of G_a predicts L+a itself: the diffusion
//     verifier of App. C for the token AR row a decides.
// There are m + 1 groups (one per acceptance length 0..m, k(m+1) <= k² masks), so every outcome
// has its next drafts ready. KV kept: the pending tokens and the accepted drafts. The first
// step has no drafts: its extend is [pending | G_0], the linear draft pass.
//
// Ensemble verifier (App. C): with lambda > 0 every verification (and the correction/bonus
// token) uses p = (1 - lambda) softmax(AR row a) + lambda softmax(mask 0 of G_a). The paper
// writes the same mixture with lambda on the AR term; here lambda = 0 is pure AR and lossless,
// and any lambda > 0 is lossy (the output follows the mixture, not the AR model).
//
// SDLM blocks (`shifted`, the quadratic form of `nsp`'s self-speculative variant): an SDLM model
// predicts with shifted blocks (worker/decoding/nsp.h), so group a is [the chain token at
// L+a-1 (the last pending token for a = 0, e_{a-1} after), <|mask|> x (k-1)] at positions
// L+a-1..L+a+k-2, seeing the chain before that token and its own group; its row r predicts
// position L+a+r. Row r of a shifted group thus predicts what mask r of a plain group does, and
// everything after the layout (verification, the next drafts from rows 1..k-1) is the same.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"

namespace tandem {

struct SelfSpecQuadraticOptions {
  int draft_len = 8;       // k: <|mask|> tokens per group (NLD: the block size)
  int32_t mask_token = 0;  // the checkpoint's <|mask|> id
  float lambda = 0.0f;     // weight of the diffusion verifier in [0, 1]; 0 = AR only (lossless)
  // Run the model's LoRA adapter on the <|mask|> rows (NLD §3.3's LoRA drafter): no row outside
  // a group sees its masks, so the AR rows and the kept KV stay the base model's.
  bool lora_masks = false;
  // SDLM blocks (see above): the layout of `nsp` with verification; the mode is named "nsp".
  bool shifted = false;
};

absl::Status ValidateSelfSpecQuadraticOptions(const SelfSpecQuadraticOptions& options,
                                              int vocab_size);

class SelfSpecQuadraticMode : public DecodingMode {
 public:
  SelfSpecQuadraticMode(const SelfSpecQuadraticOptions& options, int vocab_size, int max_positions)
      : options_(options), vocab_size_(vocab_size), max_positions_(max_positions) {}

  std::string_view name() const override {
    return options_.shifted ? "nsp" : "self_spec_quadratic";
  }
  bool lossless() const override { return options_.lambda == 0.0f; }
  StepPlan Plan(const DecodeState& state) override;
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

  // The drafts the next step verifies and the sequence length they start at.
  std::span<const int32_t> drafts() const { return drafts_; }
  int drafts_start() const { return drafts_start_; }
  // Replaces the carried drafts (they apply when the sequence length is `start`).
  void SetDraftsForTest(std::vector<int32_t> drafts, int start) {
    drafts_ = std::move(drafts);
    drafts_start_ = start;
  }

 private:
  // Where a planned step's rows sit, for Consume. Output row of AR row i: ar_rows_[i]
  // (i = 0..m); output rows of group a: group_rows_[a] .. + group_sizes_[a] - 1.
  struct Layout {
    int pending = 0;
    std::vector<int> draft_index;  // [m] plan index of e_i
    std::vector<int> ar_rows;      // [m + 1]
    std::vector<int> group_rows;   // [m + 1]
    std::vector<int> group_sizes;  // [m + 1]
  };

  // The verifier logits for the token at position L + a: AR row a, mixed with mask 0 of
  // group a when lambda > 0 (written to `mixed_`).
  std::span<const float> VerifierLogits(const ExtendOutput& out, int a);
  SelfSpecQuadraticOptions options_;
  int vocab_size_;
  int max_positions_;
  std::vector<int32_t> drafts_;
  int drafts_start_ = -1;
  Layout layout_;
  std::vector<float> probs_;  // scratch
  std::vector<float> mixed_;  // scratch: ensemble logits
};

}  // namespace tandem
