// `isd`: Introspective Strided Decoding (I-DLM §3.2, Algorithm 1) on an I-DLM checkpoint: a
// strictly causal model trained so that the logits of a clean token predict the next token
// (the AR "causal anchor" p) and the logits of the k-th <|mask|> after the clean tail propose
// the token k + 1 places past it (q). Lossless at tau = 0: the output follows the model's AR
// distribution, and under greedy decoding equals `ar` token for token.
//
// Stride N: each step proposes N tokens (one exact, N - 1 drafts) and verifies the previous
// step's drafts in the same forward. With T = sequence length, the sequence's last token y1 is
// pending (it is the exact token of the previous step), d_0 .. d_{m-1} the previous step's
// drafts for indices T .. T+m-1 (m <= N - 1), and M <= N - 1 masks:
//
//   extend   [pending | d_0 .. d_{m-1} | <|mask|> x M]  strictly causal (one 2N-1-token
//            extend when m = M = N - 1), positions kv_len ..
//   outputs  the last pending row and each d_i row: the anchor p_i of index T + i (i = 0..m);
//            mask row j: the proposal q_j for index T + m + 1 + j (logit shift: it sits at
//            T + m + j and is the (j+1)-th mask after the clean tail).
//   verify   for i = 0..m-1 (introspection): accept d_i with probability
//            min(1, (1 + tau) p_i(d_i) / q_i(d_i)) (UniformRandom(seed, T + i, kAccept)); on
//            rejection draw index T + i from normalize(max(0, p_i - q_i)) (kResample), drop
//            the rest and the masks' proposals (they assumed d_i).
//   stride   all m accepted: the bonus token, index T + m, is drawn from p_m (kSample, as AR
//            draws it) — the next step's exact token — and the masks' proposals become the
//            next step's drafts (argmax of q_j, or a draw from q_j with kDraft).
//   commit   KV of the pending tokens and the accepted drafts; the sequence gains the accepted
//            drafts and the resampled or bonus token.
//
// A step after a rejection (or the first step) has no drafts: [pending | N - 1 masks], an
// "NP" step of I-DLM Appendix B that yields the exact token and proposals only. Over many
// steps the tokens per forward are TPF_N = (2 + P_1 + ... + P_{N-2}) / (2 - P_{N-1}), P_k the
// probability that the first k drafts of a step are all accepted (I-DLM eq. 3 / Appendix B).
//
// Proposals: argmax of q (the I-DLM serving choice, which maximises acceptance; q is then a
// point mass, and the rule is spec's) or, with argmax_proposals = false, draws from q under the
// request's sampling parameters with the full p/q rule. Either way the accepted or resampled
// token follows p. Greedy requests: accept iff d_i = argmax p_i, else argmax p_i; tau then
// changes nothing (p is a point mass), so greedy ISD equals `ar` for every tau.
//
// tau > 0 (I-DLM's relaxed acceptance, its Table 4): the acceptance ratio is multiplied by
// (1 + tau), so more drafts pass and the tokens per forward rise, but accepted tokens are then
// over-represented relative to p: sampling is no longer lossless (the mode says so).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/decoding/decoding_mode.h"

namespace tandem {

inline constexpr int kMaxIsdStride = 16;

// p/q verification of `token`, a proposal drawn from `q` (empty = a point mass at `token`),
// against the anchor `p` (both normalised, vocabulary-sized): accepted when
// u_accept < min(1, (1 + tau) p(token) / q(token)), else the returned token is drawn with
// u_resample from normalize(max(0, p - q)) (p itself if that is empty). `scratch` is reused.
int32_t VerifyProposal(std::span<const float> p, std::span<const float> q, int32_t token, float tau,
                       double u_accept, double u_resample, bool* accepted,
                       std::vector<float>* scratch);

using IsdVerifier = int32_t (*)(std::span<const float> p, std::span<const float> q, int32_t token,
                                float tau, double u_accept, double u_resample, bool* accepted,
                                std::vector<float>* scratch);

struct IsdOptions {
  int stride = 4;                // N: tokens proposed per step (one exact + N - 1 drafts), >= 2
  float tau = 0.0f;              // relaxation; 0 = exact p/q
  int32_t mask_token = 0;        // the checkpoint's <|mask|> id
  bool argmax_proposals = true;  // drafts are argmax q (point mass) rather than draws from q
  // R-ISD (I-DLM §3.2, Appendix G): the model's LoRA adapter runs on the <|mask|> rows only.
  // The pending token and the drafts under introspection keep the base weights, and under
  // strict causality they never attend to a mask, so the anchors p (and the KV kept) are the
  // base model's bit for bit: decoding stays lossless, the adapter only changes proposals.
  bool lora_masks = false;
  // The sampling-mode acceptance rule; tests substitute a broken one to show that the
  // distribution tests can fail. Greedy requests do not call it.
  IsdVerifier verifier = &VerifyProposal;
};

absl::Status ValidateIsdOptions(const IsdOptions& options, int vocab_size);

class IsdMode : public DecodingMode {
 public:
  // `max_positions`: the model's max_position_embeddings (0 = no limit).
  IsdMode(const IsdOptions& options, int vocab_size, int max_positions)
      : options_(options), vocab_size_(vocab_size), max_positions_(max_positions) {}

  std::string_view name() const override { return "isd"; }
  bool lossless() const override { return options_.tau == 0.0f; }
  StepPlan Plan(const DecodeState& state) override;
  // Internal when the logits do not match the plan.
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override;

 private:
  IsdOptions options_;
  int vocab_size_;
  int max_positions_;
  // The drafts for the indices after the sequence's last token, and (sampled proposals) their
  // proposal distributions q, [drafts, vocab].
  std::vector<int32_t> drafts_;
  std::vector<float> draft_q_;
  // The plan of the step in flight: drafts verified and masks appended.
  int planned_drafts_ = 0;
  int planned_masks_ = 0;
  std::vector<float> p_;        // scratch: an anchor distribution
  std::vector<float> scratch_;  // scratch for the verifier
};

}  // namespace tandem
