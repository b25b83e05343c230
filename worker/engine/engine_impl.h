// Internal to the engine: the per-request state and the actor behind Engine, shared by
// engine_submit.cc (a request checked and built into a sequence on the caller's thread),
// engine.cc (admission, the step loop, finishing) and engine_drafting.cc (drafter sessions,
// draft chains and hidden states for `spec`). Everything here is owned by the engine thread
// unless a member's comment says otherwise.
#pragma once

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/logit_adjust_step.h"
#include "worker/engine/actor_mailbox.h"
#include "worker/engine/chain_drafter.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_stages.h"
#include "worker/engine/gamma_choice.h"
#include "worker/engine/mailbox.h"
#include "worker/sampling/grammar.h"

namespace tandem {

// One request inside the engine. Built and validated by Submit on the caller's thread, then
// owned by the engine thread alone.
struct EngineSequence {
  uint64_t id = 0;
  std::shared_ptr<SequenceSink> sink;
  std::unique_ptr<DecodingMode> mode;
  std::string mode_name;
  bool lossless = true;
  SamplingParams sampling;
  LogitAdjust adjust;    // active(): every step returns logits and they are adjusted on the host
  TokenHistory history;  // the counts `adjust` reads
  std::unique_ptr<GrammarCursor> grammar;   // structured output: where the text stands in it
  std::optional<GrammarSpec> grammar_spec;  // and its spec, for the drafter
  // The grammar as the mode's constraint (DecodeState::constraint), and the check of what each
  // step appends.
  std::unique_ptr<GrammarConstraint> constraint;
  int top_logprobs = -1;  // >= 0: each token's logprob and this many alternatives are streamed
  bool echo = false;      // the prompt's tokens and logprobs are streamed first
  int echoed = 0;         // prompt tokens streamed so far (a recomputed prompt is not resent)

  std::vector<int32_t> tokens;  // prompt, migrated tokens, then generated tokens: all final
  int prompt_len = 0;
  int max_new = 0;    // completion tokens this engine may still add in total
  int generated = 0;  // completion tokens added here
  std::unique_ptr<StopChecker> checker;
  std::unique_ptr<IncrementalDetokenizer> detok;
  FinishReason replay_finish = FinishReason::kNone;  // the migrated tokens already ended it
  // Arrived with completion tokens decoded elsewhere: their KV is rebuilt in the shapes they were
  // decoded in (ReplaySlice).
  bool migrated = false;

  absl::Time submitted;
  bool synthetic = false;  // SequenceRequest::synthetic
  absl::Time deadline = absl::InfiniteFuture();
  bool scheduled_once = false;
  bool cancel_requested = false;
  SequenceUsage usage;

  // Scheduling.
  bool resident = false;     // in the KV cache and the running set
  int kv_len = 0;            // leading tokens whose KV is committed
  int64_t admit_order = -1;  // first admission; preempted sequences keep it
  bool counted_queued = true;
  // The mode has run a step since the sequence's KV was (re)built: its steps now measure the
  // mode's decoding, not its prompt.
  bool decoding = false;
  // When the sequence's last step ended: the next step's wait is measured from here.
  absl::Time last_step_end = absl::InfinitePast();

  // spec: the drafter session (session id = sequence id).
  bool spec = false;
  std::string drafter_address;
  int gamma = 0;              // the request's γ: the most drafts a step verifies
  bool gamma_pinned = false;  // the request named γ: every step uses it
  int step_gamma = 0;         // this step's γ (gamma, or the engine's choice up to it)
  int undrafted_steps = 0;    // consecutive steps the engine chose γ = 0 for
  int block_size = 0;         // > 0: the session asks for block drafts of this size (simsd)
  AcceptanceEstimate acceptance;
  ChainDrafter* drafter = nullptr;  // owned by `mode`
  DraftChainBuffer chain;
  std::shared_ptr<DraftChannel> channel;
  bool session_open = false;
  absl::Time last_advance;
  bool chain_waited = false;  // the step loop waited (or sat a step out) for its next chain
  // Target layers whose hidden states the drafter gets (fixed at Open; empty = none), and how
  // many leading tokens' states it has been sent (recomputed KV does not send them again).
  std::vector<int32_t> hidden_layers;
  int hidden_sent = 0;

  int budget() const { return max_new - generated; }
};

// The engine's KV cache options: the model's layout, the engine's size, prefix caching.
KvCacheOptions KvOptions(const Transformer& model, const EngineOptions& options);

class Engine::Impl {
 public:
  Impl(LoadedModel* model, EngineOptions options, DraftChannelFactory drafters, int context)
      : model_(model),
        options_(std::move(options)),
        drafters_(std::move(drafters)),
        context_(context),
        mailbox_(std::make_shared<EngineMailbox>()),
        kv_(KvOptions(*model->model, options_)) {
    const Tokenizer& tokenizer = *model_->tokenizer;
    stop_tokens_ = model_->model->config().eos_token_ids;
    for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
      if (auto id = tokenizer.TokenId(name)) stop_tokens_.push_back(*id);
    }
    PublishLoad();
    thread_ = std::thread([this] { Loop(); });
  }

  ~Impl() {
    mailbox_->Close();
    thread_.join();
  }

  absl::StatusOr<uint64_t> Submit(SequenceRequest request, std::shared_ptr<SequenceSink> sink);
  void Cancel(uint64_t id) { mailbox_->Post(engine_message::Cancel{id}); }
  void Drain() {
    draining_.store(true);
    mailbox_->Post(engine_message::Drain{});
  }
  EngineLoad Load() const {
    EngineLoad load = board_.Get();
    load.queued += mailbox_->pending_submits();
    load.draining = draining_.load();
    if (busy_.load()) {
      const int64_t since = absl::ToUnixNanos(absl::Now()) - heartbeat_ns_.load();
      load.stalled_seconds = std::max(0.0, static_cast<double>(since) * 1e-9);
    }
    return load;
  }
  const LoadedModel& model() const { return *model_; }

 private:
  using SeqPtr = std::shared_ptr<EngineSequence>;

  // One scheduled extend of this step.
  struct Planned {
    SeqPtr seq;
    bool prefill = false;      // an engine-run prefill chunk: the mode is not involved
    bool echo = false;         // a prefill chunk whose every row is an output (EchoSlice)
    bool draft_step = false;   // a spec step that could verify drafts (for fallback metrics)
    bool from_branch = false;  // its drafts come from a branch-ahead chain
    DecodeState state;
    StepPlan plan;
    // When the drafter gets hidden states from this extend: the mode's taps followed by the
    // drafter's layers the mode does not tap, and where each drafter layer is among them.
    std::vector<int32_t> taps;
    std::vector<int> drafter_taps;
  };

  // A step's batch after planning and KV reservation, and the tokens it holds.
  struct StepBatch {
    std::vector<Planned> planned;
    int tokens = 0;
  };
  using ModeCounts = std::map<std::string, int, std::less<>>;

  // Submit's parts (caller's thread; engine_submit.cc).
  absl::StatusOr<std::shared_ptr<EngineSequence>> BuildSequence(const SequenceRequest& request);
  absl::Status SetUpStops(EngineSequence& seq, const SequenceRequest& request);
  absl::StatusOr<uint64_t> Enqueue(std::shared_ptr<EngineSequence> seq);
  absl::StatusOr<std::unique_ptr<DecodingMode>> MakeMode(const std::string& name,
                                                         const SequenceRequest& request,
                                                         EngineSequence* seq) const;

  // Engine thread.
  void Loop();
  void HandleMessages(std::vector<EngineMessage> messages);
  // A chain with a token outside the model's vocabulary (a drafter for another model, or a
  // faulty one) becomes an error chain: the sequence stops drafting, with the reason, and never
  // feeds the forward an out-of-range token.
  void RefuseForeignTokens(const EngineSequence& seq, DraftChain& chain);
  void CheckCancelsAndDeadlines();
  void Admit();
  void OpenSessions(const std::vector<SeqPtr>& candidates);
  void ChooseGammas(const std::vector<SeqPtr>& candidates);
  // The candidates that step now: a spec sequence still waiting for its chain sits the step
  // out while others can step (after a short grace); when every candidate waits, the wait
  // stalls no one and lasts until a chain is due.
  std::vector<SeqPtr> WaitForChains(const std::vector<SeqPtr>& candidates);
  // When `seq`'s missing chain is due, if it waits for one now (none when it steps without).
  // A broken channel turns the sequence's drafting off here.
  std::optional<absl::Time> ChainDue(EngineSequence& seq, absl::Time now);
  // The step and its stages, in order (engine.cc).
  void Step(const std::vector<SeqPtr>& candidates);
  StepBatch PlanStep(const std::vector<SeqPtr>& candidates);
  std::optional<Planned> PlanSequence(const SeqPtr& seq, int room);
  bool ReserveKv(const SeqPtr& seq, int tokens, const std::vector<Planned>& batch);
  std::vector<absl::StatusOr<ExtendOutput>> RunForward(const std::vector<Planned>& batch);
  void CommitPrefill(Planned& p, const ExtendOutput& out);
  void EchoPrompt(EngineSequence& s, const ExtendOutput& out, int kv_before);
  std::optional<SequenceObservation> ConsumeModeStep(Planned& p, ExtendOutput& out,
                                                     absl::Time step_start);
  void Emit(const SeqPtr& seq, std::span<const int32_t> append, const HiddenRows& rows,
            std::vector<TokenLogprob> logprobs);
  void Account(const StepBatch& batch, const ModeCounts& residents,
               std::span<const SequenceObservation> observed, absl::Time step_start);
  void Preempt(const SeqPtr& seq);
  void Finish(const SeqPtr& seq, FinishReason reason, absl::Status error,
              std::vector<int32_t> tokens = {}, std::string text = {},
              std::vector<TokenLogprob> logprobs = {});
  void DisableDrafting(EngineSequence& seq, absl::Status why);
  void PlanHiddenTaps(Planned& p) const;
  // Prefix caching (EngineOptions::prefix_cache): a sequence with no KV takes the longest
  // cached prefix of its tokens; committed KV is published for others.
  void AttachCachedPrefix(EngineSequence& s);
  void PublishKv(const EngineSequence& s);
  bool WaitsForSharedPrefill(const EngineSequence& seq,
                             const std::vector<SeqPtr>& candidates) const;
  HiddenRows FinalHidden(EngineSequence& s, const Planned& p, const ExtendOutput& out,
                         std::span<const int32_t> keep, int kv_before);
  DecodeState StateOf(const EngineSequence& seq) const;
  bool ModePlansNext(const EngineSequence& seq) const;
  void PublishLoad();
  // The loop came round with (`busy`) or without work: Load's stall measure.
  void Beat(bool busy) {
    heartbeat_ns_.store(absl::ToUnixNanos(absl::Now()));
    busy_.store(busy);
  }

  LoadedModel* model_;
  const EngineOptions options_;
  const DraftChannelFactory drafters_;
  const int context_;
  std::vector<int32_t> stop_tokens_;
  // Structured output's compiler over the model's token bytes, made at the first request that
  // needs it (on the caller's thread: Submit).
  std::once_flag grammar_compiler_once_;
  std::unique_ptr<GrammarCompiler> grammar_compiler_;
  const GrammarCompiler& Grammars();

  // Shared with callers and draft channels.
  std::shared_ptr<EngineMailbox> mailbox_;
  Published<EngineLoad> board_;  // published by the engine thread after each step
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> queued_{0};  // submitted and not yet admitted (for the queue limit)
  // When the engine thread last came round its loop, and whether it had work then.
  std::atomic<int64_t> heartbeat_ns_{0};
  std::atomic<bool> busy_{false};

  // Engine thread only.
  KvCache kv_;
  std::deque<SeqPtr> queue_;
  std::vector<SeqPtr> running_;  // by admit_order, oldest first
  std::unordered_map<uint64_t, SeqPtr> live_;
  std::map<std::string, std::shared_ptr<DraftChannel>> channels_;
  // Per drafter address: draft steps in a row that had no draft to verify. From
  // kLateStepsBeforeNoWait on, steps stop waiting for that drafter's chains (a drafter that is
  // up but silent, or hung); a chain from it starts the waits again.
  std::map<std::string, int> late_steps_;
  // Drafters whose chains carried a token outside the vocabulary (logged once each).
  std::set<std::string> foreign_drafters_;
  int64_t admissions_ = 0;
  int64_t steps_ = 0;
  int64_t preemptions_ = 0;
  double step_seconds_ewma_ = 0;
  double batch_tokens_ewma_ = 0;
  CostModelBuilder cost_builder_;
  CostModel cost_;  // the builder's snapshot after the last step

  std::thread thread_;
};

}  // namespace tandem
