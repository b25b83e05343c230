// The verifier's engine: a worker actor that alone owns a model, its KV cache and its
// sequences, and decodes many requests at once by continuous batching across modes.
//
// One thread runs the step loop: drain the mailbox (submits, cancels, draft chains, drain) ->
// schedule (admit queued sequences within the KV and the token budget, chunk prefills,
// preempt the newest sequence when KV runs out) -> plan every scheduled sequence's extend with
// its mode -> one batched Forward -> consume -> commit -> publish events to the sinks.
// Callers on other threads only post messages (Submit, Cancel, Drain) and read Load(); events
// arrive on the engine thread through each request's sink.
//
// Preempted sequences keep their tokens and their mode; they re-enter at the front of the queue
// and recompute their KV by (chunked) prefill. A request never fails for lack of KV.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cost_model.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/token_logprobs.h"
#include "worker/engine/draft_channel.h"
#include "worker/engine/engine_observer.h"
#include "worker/engine/local_generator.h"
#include "worker/kv/kv_cache.h"
#include "worker/sampling/grammar.h"
#include "worker/sampling/logit_adjust.h"
#include "worker/sampling/sampling.h"
#include "worker/sampling/stop.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {

// KV room beyond one full-context sequence that the cache must have: modes overshoot the
// context by up to this many draft tokens within a step.
inline constexpr int kEngineKvHeadroom = 256;

struct EngineOptions {
  int64_t kv_tokens = 65536;  // KV cache capacity in tokens (all sequences together)
  int kv_block_size = 16;
  int max_batch_tokens = 1024;  // token budget of one batched forward
  // The most tokens a request's block-like mode option may ask for (ModeLimits::max_block).
  int max_mode_block = 64;
  int max_running = 64;             // resident sequences at most
  int prefill_chunk = 256;          // longest prefill slice of one sequence per step
  int max_queued = 1024;            // Submit answers ResourceExhausted beyond this
  std::string default_mode = "ar";  // the mode of requests that ask for "auto" or ""
  std::string default_drafter;      // drafter address for `spec` requests that name none
  // Most tokens one sequence spans, prompt included; 0 (or more than the model's
  // max_position_embeddings) = the model's. A shorter context needs a smaller KV cache.
  int context = 0;
  // How long a `spec` sequence waits for its drafter's chain before it takes an AR step.
  absl::Duration draft_timeout = absl::Milliseconds(50);
  // `spec` sequences whose request did not pin γ verify a γ chosen every step from the live
  // batch and the measured step-time curve (gamma_choice.h), up to their requested γ; false =
  // always the requested γ.
  bool adaptive_gamma = true;
  // Prefix caching: the committed KV of full blocks is kept, indexed by its token prefix, for
  // later sequences that begin with the same tokens (worker/kv/kv_cache.h); idle cached blocks
  // are evicted least recently used first when the pool needs them.
  bool prefix_cache = true;
  // Told about steps, drafts, fallbacks and preemptions on the engine thread (metrics); not
  // owned, may be null, must outlive the engine.
  EngineObserver* observer = nullptr;
};

struct SequenceRequest {
  std::string request_id;
  // Exactly one input: text, chat turns (ChatML template) or token ids.
  std::string prompt;
  std::vector<ChatTurn> chat;
  std::string chat_tools;  // with `chat`: the tools, a JSON array (worker/template/chat_tools.h)
  std::vector<int32_t> prompt_ids;
  // Completion tokens already streamed by a previous worker (migration); not streamed again.
  std::vector<int32_t> committed;
  std::string mode;          // a named mode, or "" / "auto" for the engine's default
  ModeOptions mode_options;  // the caller merges its defaults in (0 fields are not special here)
  // The request named spec_gamma itself: every spec step verifies exactly that many drafts (when
  // the chain has them) instead of a γ the engine chooses per step up to it.
  bool spec_gamma_pinned = false;
  SamplingParams sampling;
  int max_tokens = 0;  // > 0
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;              // the model's EOS ids do not stop the sequence
  // Logit bias, penalties and min_tokens (its ban list is the engine's: the stop tokens, so
  // leave min_tokens_ban empty). min_tokens also holds stop strings back until it is reached.
  LogitAdjust adjust;
  // Stream each completion token's log-probability (worker/decoding/token_logprobs.h) with
  // `top_logprobs` (0..kMaxTopLogprobs) alternatives. Lossless modes only.
  bool logprobs = false;
  int top_logprobs = 0;
  // Stream the prompt's tokens first (SequenceEvent::prompt_logprobs), with the logprob of each
  // but the first (and `top_logprobs` alternatives when `logprobs`). Any mode (the prompt's rows
  // are the target's AR rows in every mode); allows max_tokens 0 (score a prompt without
  // generating).
  bool echo = false;
  // Structured output (response_format json_object / json_schema, tool calls): the completion
  // is constrained to the grammar (worker/sampling/grammar.h), and a stop token ends it only
  // where the text is a whole match. Any mode (DecodeState::constraint for the lossy ones).
  std::optional<GrammarSpec> grammar;
  std::string drafter;  // drafter address for `spec`; "" = the engine's default
  absl::Time deadline = absl::InfiniteFuture();
  // Calibration traffic: its steps and starts are measured like any request's, but its
  // lengths do not stand for the requests the verifier serves (CostModel::request_tokens).
  bool synthetic = false;
};

struct SequenceUsage {
  int prompt_tokens = 0;
  int completion_tokens = 0;  // committed tokens, migrated ones excluded
  int forwards = 0;           // batched forwards this sequence took part in (prefill included)
  int drafted = 0;
  int accepted = 0;
  // Steps that could verify drafts (spec with a drafter); of those, the ones whose chain was
  // there when the step loop looked (ready), and the ones whose chain came while it waited. The
  // rest took AR steps (late, or drafting off).
  int draft_steps = 0;
  int drafts_ready = 0;
  int drafts_waited = 0;
  int drafts_from_branch = 0;  // of the steps that verified drafts, those from a branch-ahead chain
  int preemptions = 0;
  int cached_tokens = 0;     // prompt tokens whose KV came from the prefix cache (first admission)
  double queue_seconds = 0;  // submit -> first scheduled
  double ttft_seconds = 0;   // submit -> first token
  double total_seconds = 0;  // submit -> finish
};

// One message to a request's sink. The last one has `finish` set (or a non-OK `error`).
struct SequenceEvent {
  std::vector<int32_t> tokens;         // newly committed completion tokens
  std::vector<TokenLogprob> logprobs;  // one per token when the request asked for logprobs
  std::vector<TokenLogprob>
      prompt_logprobs;  // echo: the next prompt tokens (the first: no logprob)
  std::string text;     // text delta (whole UTF-8 characters; stop strings withheld)
  FinishReason finish = FinishReason::kNone;
  absl::Status error;  // the sequence failed (an engine bug or a lost model)
  std::string mode;
  bool lossless = true;
  SequenceUsage usage;  // on the last event
};

class SequenceSink {
 public:
  virtual ~SequenceSink() = default;
  // Called on the engine thread; must not block.
  virtual void OnEvent(SequenceEvent event) = 0;
  // True while the consumer is behind (e.g. a slow gRPC stream): the engine does not step the
  // sequence until it catches up, so nothing is buffered without bound.
  virtual bool Backlogged() const { return false; }
};

struct EngineLoad {
  int running = 0;
  int queued = 0;
  double kv_usage_ratio = 0;
  int64_t kv_free_tokens = 0;
  int64_t steps = 0;
  double step_seconds_ewma = 0;
  double batch_tokens_ewma = 0;
  int64_t preemptions = 0;
  PrefixCacheStats prefix_cache;
  bool draining = false;
  // How long the engine thread has had work (resident or queued sequences) without coming
  // round its step loop: 0 while it moves or is idle. A step loop stuck for seconds (a runaway
  // step, a hung device) shows here; the verifier's watchdog reads it.
  double stalled_seconds = 0;
  // Measured step time over batch tokens and each mode's tokens per sequence-step over load
  // (calibration and every step since the start).
  CostModel cost;
};

class Engine {
 public:
  // `model` is not owned and must outlive the engine. `drafters` makes channels for `spec`
  // (may be null: `spec` is then refused). InvalidArgument for options that cannot work (e.g.
  // a KV cache smaller than one full-context sequence).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(LoadedModel* model, EngineOptions options,
                                                        DraftChannelFactory drafters);
  // Cancels every sequence (sinks get finish = kCancelled) and joins the engine thread.
  ~Engine();

  // Validates on the caller's thread and queues the request: InvalidArgument for bad input
  // (no or several inputs, empty prompt, unknown mode, max_tokens <= 0, a prompt that leaves
  // no room in the context, token ids outside the vocabulary, sampling a mode cannot honour),
  // FailedPrecondition while draining, ResourceExhausted when the queue is full. On success
  // returns the sequence id; events follow on `sink`.
  absl::StatusOr<uint64_t> Submit(SequenceRequest request, std::shared_ptr<SequenceSink> sink);
  // Ends the sequence between steps (finish = kCancelled); unknown ids are ignored.
  void Cancel(uint64_t id);
  // Stops admitting new requests; running and queued ones finish.
  void Drain();

  EngineLoad Load() const;
  const LoadedModel& model() const;

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
