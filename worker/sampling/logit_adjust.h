// Adjustments a request makes to the target's logits before anything samples from them or
// verifies a draft against them: OpenAI's logit_bias, presence and frequency penalties, the
// repetition penalty (CTRL, as Hugging Face and vLLM define it) and min_tokens. Lossless modes
// stay exact with respect to the adjusted distribution because every output row is adjusted for
// the context that row was computed in (worker/decoding/logit_adjust_step.h).
//
// Order, as vLLM's sampler: the logit bias and the min_tokens ban first, then the repetition
// penalty, then the frequency and presence penalties.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

namespace tandem {

class Grammar;  // worker/sampling/grammar.h

inline constexpr int kMaxLogitBias = 300;         // entries, as OpenAI's limit
inline constexpr float kMaxLogitBiasValue = 100;  // |bias|, as OpenAI's
inline constexpr float kMaxPenalty = 2;           // |presence|, |frequency|, as OpenAI's
inline constexpr float kMaxRepetitionPenalty = 10;
// Alternatives a request may ask for with each token's logprob (worker/decoding/
// token_logprobs.h), as OpenAI's and vLLM's default limit.
inline constexpr int kMaxTopLogprobs = 20;

struct LogitAdjust {
  // Subtracted once from the logit of every token among the generated ones.
  float presence_penalty = 0;
  // Subtracted from a token's logit once per occurrence among the generated tokens.
  float frequency_penalty = 0;
  // 1 = off. A token of the prompt or the generated text has its logit divided by it when
  // positive, multiplied when not.
  float repetition_penalty = 1;
  // (token id, bias) added to the logit; at most kMaxLogitBias entries, each id once.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // While fewer than this many tokens have been generated, the tokens of `min_tokens_ban`
  // (the engine fills in its stop tokens) cannot be drawn.
  int min_tokens = 0;
  std::vector<int32_t> min_tokens_ban;
  // Structured output (response_format json_object / json_schema, tool calls): the compiled
  // constraint (the engine compiles the request's). Each row is first masked to the tokens the
  // grammar allows after the row's context, a stop token only where the text is a whole match
  // (worker/decoding/logit_adjust_step.cc).
  std::shared_ptr<const Grammar> grammar;

  // Whether any adjustment changes a logit.
  bool active() const;
};

// OK when every setting is in range: penalties finite within [-kMaxPenalty, kMaxPenalty], the
// repetition penalty within (0, kMaxRepetitionPenalty], at most kMaxLogitBias bias entries with
// distinct ids in [0, vocab_size) (vocab_size 0: the vocabulary is unknown, ids only >= 0) and
// finite values within [-kMaxLogitBiasValue, kMaxLogitBiasValue], min_tokens >= 0.
// InvalidArgument naming the field otherwise.
absl::Status CheckLogitAdjust(const LogitAdjust& adjust, int vocab_size);

// How often each token occurs in a sequence's generated tokens, and which tokens its prompt
// holds, kept up to date as the sequence grows.
class TokenHistory {
 public:
  // Brings the counts up to `tokens`, whose first `prompt_len` are the prompt. Counts from
  // scratch when the tokens are not those seen so far plus new ones at the end.
  void Sync(std::span<const int32_t> tokens, int prompt_len);

  const absl::flat_hash_map<int32_t, int>& generated() const { return generated_; }
  const absl::flat_hash_set<int32_t>& prompt() const { return prompt_; }

 private:
  absl::flat_hash_map<int32_t, int> generated_;
  absl::flat_hash_set<int32_t> prompt_;
  int prompt_len_ = -1;
  size_t seen_ = 0;
  int32_t last_ = -1;  // the last token seen, a cheap check that the sequence only grew
};

// Adjusts one row of logits. The row's context is the history's sequence with the generated
// tokens `added` appended and `removed` taken away (drafts on the row's path, and tokens the
// sequence holds past the row's position); `generated_before` tokens precede the predicted one.
// The grammar's mask is not applied here (the caller's GrammarCursor does it first).
void AdjustLogits(const LogitAdjust& adjust, const TokenHistory& history,
                  std::span<const int32_t> added, std::span<const int32_t> removed,
                  int generated_before, std::span<float> row);

}  // namespace tandem
