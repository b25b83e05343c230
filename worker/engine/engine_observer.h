// An optional observer of an engine's steps, for metrics. The engines (Engine, DraftEngine) call
// it on their own thread after the work it describes, so an implementation must be cheap and
// must not block (update atomics or metric objects; never call back into the engine). The
// engines know nothing of how the numbers are exported.
//
// Thread-safety: every method is called on the engine thread only; an observer shared by
// several engines must be thread-safe itself.
#pragma once

#include <string_view>

namespace tandem {

class EngineObserver {
 public:
  virtual ~EngineObserver() = default;

  // One batched forward: its wall time (plan, forward, consume, commit) and its tokens.
  virtual void OnStep(double /*seconds*/, int /*batch_tokens*/) {}
  // A verification step of one sequence that checked `drafted` > 0 draft tokens, of which the
  // leading `accepted` were accepted.
  virtual void OnDraftVerified(std::string_view /*mode*/, int /*drafted*/, int /*accepted*/) {}
  // A `spec` step that could have verified drafts took an AR step instead: "late" (no usable
  // chain by the draft timeout) or "drafter_down" (drafting is off for the sequence).
  virtual void OnFallback(std::string_view /*reason*/) {}
  // A `spec` step verified drafts from a chain that was there when the step loop looked
  // (`waited` false: drafting hid behind the previous step) or that came while it waited.
  virtual void OnChainArrival(bool /*waited*/) {}
  // A sequence lost its KV and will be recomputed.
  virtual void OnPreemption() {}
};

}  // namespace tandem
