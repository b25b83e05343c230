// Runs one sequence with one decoding mode to completion on an in-process model: the
// single-request loop behind `tandem generate` and the modes' tests. (The services batch many
// sequences through the worker's scheduler instead; the per-step contract is the same.)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/transformer.h"
#include "worker/sampling/logit_adjust.h"
#include "worker/sampling/stop.h"

namespace tandem {

struct RunStats {
  std::vector<int32_t> tokens;  // generated tokens (the prompt excluded)
  FinishReason finish = FinishReason::kNone;
  int forwards = 0;  // target forwards, prefill included
  int steps_with_drafts = 0;
  int drafted = 0;
  int accepted = 0;

  double TokensPerForward() const {
    return forwards > 0 ? static_cast<double>(tokens.size()) / forwards : 0.0;
  }
};

struct RunOptions {
  int max_tokens = 0;  // > 0
  SamplingParams sampling;
  // Logit bias and penalties, applied to every step's rows (logit_adjust_step.h); the caller
  // fills min_tokens_ban. Checked like the engine does (CheckLogitAdjust).
  LogitAdjust adjust;
  // Called for each new token in order; returns true to end the sequence there (a stop token
  // or stop string was reached). The token passed is already counted in RunStats::tokens.
  std::function<bool(int32_t)> on_token;
  // Checked before every step; true ends the sequence with kCancelled.
  std::function<bool()> cancelled;
};

// `seq` must not be in `kv` yet; it is added and removed again. KV shortage is
// ResourceExhausted; a mode breaking the step contract is Internal.
absl::StatusOr<RunStats> RunSequence(Transformer& model, KvCache& kv, SeqId seq, DecodingMode& mode,
                                     std::span<const int32_t> prompt, const RunOptions& options);

}  // namespace tandem
