#include "worker/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/decoding/logit_adjust_step.h"
#include "worker/decoding/modes.h"
#include "worker/engine/engine_impl.h"

namespace tandem {

namespace {

constexpr double kEwmaAlpha = 0.1;
// How often a step loop whose every sequence is backlogged looks again (sinks do not signal
// when they catch up).
constexpr absl::Duration kBacklogPoll = absl::Milliseconds(2);

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

void Engine::Impl::HandleMessages(std::vector<EngineMessage> messages) {
  for (EngineMessage& message : messages) {
    if (auto* submit = std::get_if<engine_message::Submit>(&message)) {
      SeqPtr seq = std::move(submit->sequence);
      live_[seq->id] = seq;
      queue_.push_back(std::move(seq));
    } else if (auto* cancel = std::get_if<engine_message::Cancel>(&message)) {
      auto it = live_.find(cancel->id);
      if (it != live_.end()) it->second->cancel_requested = true;
    } else if (auto* chain = std::get_if<engine_message::Chain>(&message)) {
      // The drafter is back: wait for it again, even when the chain's sequence has ended (a
      // short request can end before its first chain comes, and the next ones must not be
      // left to decode without drafts because of it).
      if (chain->chain.error.ok()) late_steps_[chain->drafter] = 0;
      auto it = live_.find(chain->chain.session);
      if (it == live_.end() || !it->second->spec) continue;
      RefuseForeignTokens(*it->second, chain->chain);
      it->second->chain.Merge(std::move(chain->chain), it->second->tokens);
    }
    // Drain: the flag is already set; the message only wakes the loop.
  }
}

void Engine::Impl::RefuseForeignTokens(const EngineSequence& seq, DraftChain& chain) {
  if (!chain.error.ok()) return;
  const int vocab = model_->model->config().vocab_size;
  for (const int32_t token : chain.tokens) {
    if (token >= 0 && token < vocab) continue;
    chain.tokens.clear();
    chain.slots.clear();
    chain.error = absl::FailedPreconditionError(absl::StrCat(
        "the drafter at ", seq.drafter_address, " sent token ", token,
        ", outside this model's vocabulary of ", vocab, " (a drafter for another model?)"));
    if (foreign_drafters_.insert(seq.drafter_address).second) {
      std::fprintf(stderr, "tandem engine: %s; its sequences decode without drafts\n",
                   std::string(chain.error.message()).c_str());
    }
    return;
  }
}

void Engine::Impl::Loop() {
  while (true) {
    HandleMessages(mailbox_->TakeAll());
    if (mailbox_->closed()) break;
    Beat(!queue_.empty() || !running_.empty());
    CheckCancelsAndDeadlines();
    Admit();
    std::vector<SeqPtr> candidates;
    for (const SeqPtr& seq : running_) {
      if (!seq->sink->Backlogged()) candidates.push_back(seq);
    }
    if (candidates.empty()) {
      // Waiting with work only while every sequence is backlogged, polled every kBacklogPoll.
      Beat(!queue_.empty() || !running_.empty());
      PublishLoad();
      absl::Time wake = absl::InfiniteFuture();
      if (!running_.empty()) wake = absl::Now() + kBacklogPoll;
      for (const auto& [id, seq] : live_) wake = std::min(wake, seq->deadline);
      mailbox_->WaitUntil(wake);
      continue;
    }
    OpenSessions(candidates);
    ChooseGammas(candidates);
    Step(WaitForChains(candidates));
    PublishLoad();
  }
  // Shutdown: everything still live ends as cancelled, on this thread like every event.
  HandleMessages(mailbox_->TakeAll());
  std::vector<SeqPtr> all;
  for (const SeqPtr& seq : running_) all.push_back(seq);
  for (const SeqPtr& seq : queue_) all.push_back(seq);
  for (const SeqPtr& seq : all) Finish(seq, FinishReason::kCancelled, absl::OkStatus());
  PublishLoad();
}

void Engine::Impl::CheckCancelsAndDeadlines() {
  const absl::Time now = absl::Now();
  std::vector<SeqPtr> ended;
  for (const auto& [id, seq] : live_) {
    if (seq->cancel_requested || now >= seq->deadline ||
        seq->replay_finish != FinishReason::kNone) {
      ended.push_back(seq);
    }
  }
  for (const SeqPtr& seq : ended) {
    if (seq->cancel_requested) {
      Finish(seq, FinishReason::kCancelled, absl::OkStatus());
    } else if (seq->replay_finish != FinishReason::kNone) {
      Finish(seq, seq->replay_finish, absl::OkStatus());
    } else {
      Finish(seq, FinishReason::kCancelled,
             absl::DeadlineExceededError("the request's deadline passed before it finished"));
    }
  }
}

void Engine::Impl::Admit() {
  // KV promised to sequences admitted in this call, which have not reserved it yet.
  int64_t promised = 0;
  while (!queue_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    const SeqPtr& seq = queue_.front();
    const int64_t need = static_cast<int64_t>(seq->tokens.size()) + options_.kv_block_size;
    if (!running_.empty() && kv_.FreeTokenCapacity() - promised < need) break;
    promised += need;
    SeqPtr admitted = seq;
    queue_.pop_front();
    if (!kv_.AddSequence(static_cast<SeqId>(admitted->id)).ok()) {
      Finish(admitted, FinishReason::kNone,
             absl::InternalError(
                 absl::StrCat("sequence ", admitted->id, " is already in the KV cache")));
      continue;
    }
    admitted->resident = true;
    admitted->kv_len = 0;
    if (admitted->admit_order < 0) admitted->admit_order = admissions_++;
    if (admitted->counted_queued) {
      admitted->counted_queued = false;
      queued_.fetch_sub(1);
    }
    if (!admitted->scheduled_once) {
      admitted->scheduled_once = true;
      admitted->usage.queue_seconds = Seconds(absl::Now() - admitted->submitted);
    }
    auto pos = std::upper_bound(
        running_.begin(), running_.end(), admitted,
        [](const SeqPtr& a, const SeqPtr& b) { return a->admit_order < b->admit_order; });
    running_.insert(pos, std::move(admitted));
  }
}

DecodeState Engine::Impl::StateOf(const EngineSequence& seq) const {
  return DecodeState{.tokens = seq.tokens,
                     .prompt_len = seq.prompt_len,
                     .kv_len = seq.kv_len,
                     .budget = seq.budget(),
                     .sampling = &seq.sampling,
                     .constraint = seq.constraint.get()};
}

// Whether the sequence's next extend is the mode's (not an engine prefill chunk), assuming the
// whole token budget of a step were free.
bool Engine::Impl::ModePlansNext(const EngineSequence& seq) const {
  const int pending = static_cast<int>(seq.tokens.size()) - seq.kv_len;
  return pending <= 1 || pending <= std::min(options_.prefill_chunk, options_.max_batch_tokens);
}

void Engine::Impl::Preempt(const SeqPtr& seq) {
  PublishKv(*seq);  // its blocks stay cached while the pool allows: a re-admission hit
  kv_.RemoveSequence(static_cast<SeqId>(seq->id));
  seq->resident = false;
  seq->kv_len = 0;
  seq->decoding = false;
  ++seq->usage.preemptions;
  ++preemptions_;
  if (options_.observer != nullptr) options_.observer->OnPreemption();
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  queue_.push_front(seq);
}

void Engine::Impl::Step(const std::vector<SeqPtr>& candidates) {
  const absl::Time start = absl::Now();
  // Resident sequences per mode when the step starts: the cost model's load (Account).
  ModeCounts residents;
  for (const SeqPtr& seq : running_) {
    if (seq->resident) ++residents[seq->mode_name];
  }
  StepBatch batch = PlanStep(candidates);
  if (batch.planned.empty()) return;
  std::vector<absl::StatusOr<ExtendOutput>> outputs = RunForward(batch.planned);
  std::vector<SequenceObservation> observed;
  for (size_t b = 0; b < batch.planned.size(); ++b) {
    Planned& p = batch.planned[b];
    ++p.seq->usage.forwards;
    if (!outputs[b].ok()) {
      Finish(p.seq, FinishReason::kNone, outputs[b].status());
    } else if (p.prefill) {
      CommitPrefill(p, *outputs[b]);
    } else if (auto o = ConsumeModeStep(p, *outputs[b], start)) {
      observed.push_back(std::move(*o));
    }
  }
  Account(batch, residents, observed, start);
}

// Plan and reserve: each candidate in turn, oldest first, until the step's token budget is
// spent. A sequence whose KV cannot be reserved preempts the newest sequence outside the batch,
// or waits (preempted itself) when only the batch is left.
Engine::Impl::StepBatch Engine::Impl::PlanStep(const std::vector<SeqPtr>& candidates) {
  StepBatch batch;
  batch.planned.reserve(candidates.size());
  for (const SeqPtr& seq : candidates) {
    if (!seq->resident) continue;  // preempted earlier in this step
    // The budget decides where planning stops; a plan is always run once made (modes keep
    // state from Plan for Consume), so the last one may overshoot the budget by its drafts.
    if (!batch.planned.empty() && batch.tokens >= options_.max_batch_tokens) break;
    if (WaitsForSharedPrefill(*seq, candidates)) continue;
    std::optional<Planned> p = PlanSequence(seq, options_.max_batch_tokens - batch.tokens);
    if (!p.has_value()) continue;
    const int n = static_cast<int>(p->plan.tokens.size());
    if (!ReserveKv(seq, n, batch.planned)) continue;
    batch.tokens += n;
    PlanHiddenTaps(*p);
    batch.planned.push_back(std::move(*p));
  }
  return batch;
}

KvCacheOptions KvOptions(const Transformer& model, const EngineOptions& options) {
  KvCacheOptions kv = model.KvOptions(options.kv_tokens, options.kv_block_size);
  kv.prefix_cache = options.prefix_cache;
  return kv;
}

// The cache is the engine's own, for one model, and only KV that a causal forward of the
// committed tokens gives is committed (the step contract), with the adapter gate off, which no
// adapter changes: the tokens alone decide the KV, so the salt is constant.
constexpr uint64_t kPrefixSalt = 0;

void Engine::Impl::AttachCachedPrefix(EngineSequence& s) {
  // A migrated sequence's KV must be its first run's bit for bit where the backend can replay
  // it so (ReplaySlice).
  if (s.migrated && model_->model->backend()->ExactExtendTokens() > 0) return;
  // At least one pending token is left for the first step.
  int limit = static_cast<int>(s.tokens.size()) - 1;
  // A drafter that reads the target's hidden states gets them from the forwards that make KV
  // final: it must have had those of every token taken from the cache.
  if (s.spec && !s.hidden_layers.empty()) limit = std::min(limit, s.hidden_sent);
  if (limit < options_.kv_block_size) return;
  s.kv_len = kv_.AttachPrefix(static_cast<SeqId>(s.id),
                              std::span<const int32_t>(s.tokens).first(limit), kPrefixSalt);
  if (s.usage.preemptions == 0) s.usage.cached_tokens = std::min(s.kv_len, s.prompt_len);
}

const GrammarCompiler& Engine::Impl::Grammars() {
  std::call_once(grammar_compiler_once_, [this] {
    const int vocab = model_->model->config().vocab_size;
    grammar_compiler_ = std::make_unique<GrammarCompiler>(
        GrammarTokenBytes(*model_->tokenizer, vocab), vocab, stop_tokens_);
  });
  return *grammar_compiler_;
}

// A sequence with no KV whose prompt begins with whole blocks that an earlier sequence of this
// step is still computing waits until they are done, then takes them from the cache: requests
// that share a prompt (n choices, a burst with one system prompt) prefill it once.
bool Engine::Impl::WaitsForSharedPrefill(const EngineSequence& seq,
                                         const std::vector<SeqPtr>& candidates) const {
  if (!options_.prefix_cache || seq.kv_len > 0) return false;
  if (seq.echo && seq.echoed < seq.prompt_len) return false;  // computes its prompt anyway
  const int block = options_.kv_block_size;
  for (const SeqPtr& other : candidates) {
    const EngineSequence& o = *other;
    if (&o == &seq || !o.resident || o.admit_order >= seq.admit_order) continue;
    if (o.kv_len >= o.prompt_len) continue;  // past its prompt: what it shares is published
    const size_t limit = std::min(seq.tokens.size() - 1, o.tokens.size());
    size_t common = 0;
    while (common < limit && seq.tokens[common] == o.tokens[common]) ++common;
    const int shared = static_cast<int>(common) / block * block;
    if (shared >= block && o.kv_len < shared) return true;
  }
  return false;
}

void Engine::Impl::PublishKv(const EngineSequence& s) {
  if (options_.prefix_cache) kv_.PublishPrefix(static_cast<SeqId>(s.id), s.tokens, kPrefixSalt);
}

// The sequence's extend for this step: an engine prefill slice, or the mode's plan. nullopt
// when the sequence ended instead (a plan past every bound).
std::optional<Engine::Impl::Planned> Engine::Impl::PlanSequence(const SeqPtr& seq, int room) {
  const bool echoing = seq->echo && seq->echoed < seq->prompt_len;
  if (echoing && seq->echoed == 0) {
    // The prompt's first token: no logprob, nothing predicts it.
    SequenceEvent event;
    event.prompt_logprobs.push_back({.token = seq->tokens[0], .has_logprob = false});
    event.mode = seq->mode_name;
    event.lossless = seq->lossless;
    seq->echoed = 1;
    seq->sink->OnEvent(std::move(event));
  }
  if (seq->max_new == 0 && seq->kv_len >= seq->prompt_len - 1) {  // echo alone: scored
    Finish(seq, FinishReason::kLength, absl::OkStatus());
    return std::nullopt;
  }
  // The cache has no logits: a prompt to echo is computed whole.
  if (seq->kv_len == 0 && options_.prefix_cache && !echoing) AttachCachedPrefix(*seq);
  Planned p;
  p.seq = seq;
  p.state = StateOf(*seq);
  const int chunk_limit = std::max(1, std::min(options_.prefill_chunk, room));
  const int exact = seq->migrated ? model_->model->backend()->ExactExtendTokens() : 0;
  std::optional<StepPlan> echo_slice;
  if (echoing) echo_slice = EchoSlice(seq->tokens, seq->kv_len, chunk_limit, seq->prompt_len);
  if (echo_slice.has_value()) {
    p.prefill = true;
    p.echo = true;
    p.plan = std::move(*echo_slice);
  } else if (std::optional<StepPlan> slice =
                 ReplaySlice(seq->tokens, seq->kv_len, chunk_limit, seq->prompt_len, exact)) {
    p.prefill = true;
    p.plan = std::move(*slice);
  } else {
    // A spec step that could verify drafts (the conditions under which WaitForChains waits).
    p.draft_step = seq->spec && seq->step_gamma > 0 && seq->budget() >= 2 &&
                   static_cast<int>(seq->tokens.size()) < context_;
    if (seq->drafter != nullptr) seq->drafter->set_limit(seq->step_gamma);
    p.from_branch = p.draft_step && seq->chain.UsableFromBranch(seq->tokens);
    p.plan = seq->mode->Plan(p.state);
    if (seq->adjust.active() || seq->top_logprobs >= 0) ReturnLogits(&p.plan);
    // A step that drafts nothing by design (simsd's completion steps) is no fallback.
    p.draft_step = p.draft_step && seq->mode->last_plan_wanted_drafts();
  }
  const int n = static_cast<int>(p.plan.tokens.size());
  // A safety net behind CheckModeOptions: a plan far past the step budget (a mode's sizing
  // bug) ends its sequence instead of stalling every other one.
  if (n > options_.max_batch_tokens + options_.prefill_chunk + kEngineKvHeadroom) {
    Finish(seq, FinishReason::kNone,
           absl::InternalError(absl::StrCat(
               "mode ", seq->mode_name, " planned a step of ", n, " tokens, past the step budget ",
               options_.max_batch_tokens, " (engine bug: its options were checked)")));
    return std::nullopt;
  }
  return p;
}

// Whether KV for `tokens` more tokens of `seq` is reserved. When not, `seq` has been preempted
// (others in the batch go first) or, alone and still too big, ended with an error.
bool Engine::Impl::ReserveKv(const SeqPtr& seq, int tokens, const std::vector<Planned>& batch) {
  auto in_batch = [&](const EngineSequence* s) {
    return std::any_of(batch.begin(), batch.end(),
                       [s](const Planned& p) { return p.seq.get() == s; });
  };
  while (!kv_.Reserve(static_cast<SeqId>(seq->id), tokens)) {
    if (SeqPtr victim = PickVictim(running_, seq.get(), in_batch)) {
      Preempt(victim);
      continue;
    }
    if (!batch.empty()) {
      Preempt(seq);  // the newest of the batch: it waits for the others to finish
    } else {
      Finish(seq, FinishReason::kNone,
             absl::InternalError(absl::StrCat(
                 "sequence ", seq->id, " alone needs KV for ", seq->kv_len + tokens,
                 " tokens, more than the cache's ", kv_.FreeTokenCapacity(),
                 " (engine bug: Create sizes the cache for a full-context sequence)")));
    }
    return false;
  }
  return true;
}

// Forward: the batch in one call. A malformed extend rejects the whole batch and writes
// nothing, so then each runs alone and only the sequence at fault fails.
std::vector<absl::StatusOr<ExtendOutput>> Engine::Impl::RunForward(
    const std::vector<Planned>& batch) {
  std::vector<Extend> extends;
  extends.reserve(batch.size());
  for (const Planned& p : batch) {
    extends.push_back(Extend{.seq = static_cast<SeqId>(p.seq->id),
                             .tokens = p.plan.tokens,
                             .positions = p.plan.positions,
                             .visible = p.plan.visible,
                             .outputs = p.plan.outputs,
                             .lora_gate = p.plan.lora_gate,
                             .hidden_layers = p.taps.empty()
                                                  ? std::span<const int32_t>(p.plan.hidden_layers)
                                                  : std::span<const int32_t>(p.taps),
                             .samples = p.plan.samples,
                             .return_logits = p.plan.return_logits});
  }
  std::vector<absl::StatusOr<ExtendOutput>> outputs;
  outputs.reserve(batch.size());
  absl::StatusOr<std::vector<ExtendOutput>> all = model_->model->Forward(extends, kv_);
  if (all.ok()) {
    for (ExtendOutput& out : *all) outputs.emplace_back(std::move(out));
    return outputs;
  }
  for (const Extend& e : extends) {
    absl::StatusOr<std::vector<ExtendOutput>> one = model_->model->Forward({&e, 1}, kv_);
    if (one.ok()) {
      outputs.emplace_back(std::move((*one)[0]));
    } else {
      outputs.emplace_back(one.status());
    }
  }
  return outputs;
}

// Commit an engine prefill slice: all of its KV, and its hidden states to the drafter.
void Engine::Impl::CommitPrefill(Planned& p, const ExtendOutput& out) {
  EngineSequence& s = *p.seq;
  std::vector<int32_t> keep(p.plan.tokens.size());
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = static_cast<int32_t>(i);
  absl::Status committed = kv_.Commit(static_cast<SeqId>(s.id), keep);
  if (!committed.ok()) {
    Finish(p.seq, FinishReason::kNone, committed);
    return;
  }
  const int kv_before = s.kv_len;
  s.kv_len += static_cast<int>(keep.size());
  PublishKv(s);
  if (p.echo) EchoPrompt(s, out, kv_before);
  HiddenRows rows = FinalHidden(s, p, out, keep, kv_before);
  if (!rows.empty() && s.session_open && s.chain.enabled) {
    absl::Status advanced =
        s.channel->Advance(s.id, static_cast<int>(s.tokens.size()), {}, s.gamma, rows);
    if (!advanced.ok()) DisableDrafting(s, advanced);
  }
}

// Streams the prompt tokens an echo slice's rows predict (row i: token kv_before + i + 1) with
// their logprobs, those not streamed before (a preempted sequence recomputes its prompt).
void Engine::Impl::EchoPrompt(EngineSequence& s, const ExtendOutput& out, int kv_before) {
  const int vocab = model_->model->config().vocab_size;
  const int rows = static_cast<int>(out.logits.size() / static_cast<size_t>(vocab));
  SequenceEvent event;
  for (int r = 0; r < rows; ++r) {
    const int target = kv_before + r + 1;
    if (target < s.echoed || target >= s.prompt_len) continue;
    const std::span<const float> row(out.logits.data() + static_cast<size_t>(r) * vocab,
                                     static_cast<size_t>(vocab));
    event.prompt_logprobs.push_back(
        RowLogprob(row, s.tokens[static_cast<size_t>(target)], std::max(0, s.top_logprobs)));
    s.echoed = target + 1;
  }
  if (event.prompt_logprobs.empty()) return;
  event.mode = s.mode_name;
  event.lossless = s.lossless;
  s.sink->OnEvent(std::move(event));
}

// Consume and commit a mode's extend: the mode's result is checked, its kept KV committed, its
// drafting counted, and its new tokens emitted. Returns the cost model's observation of a
// decode step (none for the step that took the prompt, or when the sequence ended with an
// error).
std::optional<SequenceObservation> Engine::Impl::ConsumeModeStep(Planned& p, ExtendOutput& out,
                                                                 absl::Time step_start) {
  EngineSequence& s = *p.seq;
  if (s.adjust.active()) {
    absl::Status adjusted =
        AdjustStepLogits(s.adjust, p.state, p.plan, model_->model->config().vocab_size, &s.history,
                         s.grammar.get(), &out);
    if (!adjusted.ok()) {
      Finish(p.seq, FinishReason::kNone, adjusted);
      return std::nullopt;
    }
  }
  // The mode sees exactly the taps it asked for.
  ExtendOutput view;
  const ExtendOutput* mode_out = &out;
  if (p.taps.size() > p.plan.hidden_layers.size()) {
    view = ModeView(out, p.plan.hidden_layers.size(), p.plan.tokens.size(),
                    model_->model->config().hidden_size);
    mode_out = &view;
  }
  absl::StatusOr<StepResult> result = s.mode->Consume(p.state, p.plan, *mode_out);
  absl::Status status =
      result.ok() ? CheckStep(p.state, p.plan, *result, s.mode_name) : result.status();
  if (status.ok() && static_cast<int>(result->append.size()) > s.budget()) {
    status =
        absl::InternalError(absl::StrCat("mode ", s.mode_name, " gained ", result->append.size(),
                                         " tokens with a budget of ", s.budget()));
  }
  if (status.ok()) status = kv_.Commit(static_cast<SeqId>(s.id), result->keep);
  if (!status.ok()) {
    Finish(p.seq, FinishReason::kNone, status);
    return std::nullopt;
  }
  const int kv_before = s.kv_len;
  s.kv_len += static_cast<int>(result->keep.size());
  PublishKv(s);  // the blocks its tokens fill so far; Finish and Preempt publish the rest
  HiddenRows rows = FinalHidden(s, p, out, result->keep, kv_before);
  s.usage.drafted += result->drafted;
  s.usage.accepted += result->accepted;
  if (result->drafted > 0) s.acceptance.Observe(result->drafted, result->accepted);
  std::optional<SequenceObservation> observed;
  // The step that took the prompt (or recomputed KV) measures prefill, not the mode.
  if (s.decoding) {
    const double wait = s.last_step_end == absl::InfinitePast()
                            ? 0.0
                            : std::max(0.0, Seconds(step_start - s.last_step_end));
    observed = SequenceObservation{.mode = s.mode_name,
                                   .gained = static_cast<int>(result->append.size()),
                                   .extend = static_cast<int>(p.plan.tokens.size()),
                                   .wait = wait};
  } else if (s.usage.ttft_seconds == 0) {
    // The request's first token comes from this step (a preempted sequence rebuilding its KV
    // has had its first token already).
    observed = SequenceObservation{.mode = s.mode_name,
                                   .start = std::max(1e-9, Seconds(step_start - s.submitted))};
  }
  s.decoding = true;
  if (result->drafted > 0) {
    late_steps_[s.drafter_address] = 0;
  } else if (p.draft_step && s.chain.enabled) {
    ++late_steps_[s.drafter_address];
  }
  if (p.draft_step) {
    ++s.usage.draft_steps;
    if (result->drafted > 0) ++(s.chain_waited ? s.usage.drafts_waited : s.usage.drafts_ready);
    if (result->drafted > 0 && p.from_branch) ++s.usage.drafts_from_branch;
  }
  if (options_.observer != nullptr) {
    if (result->drafted > 0) {
      options_.observer->OnDraftVerified(s.mode_name, result->drafted, result->accepted);
      if (p.draft_step) options_.observer->OnChainArrival(s.chain_waited);
    } else if (p.draft_step) {
      options_.observer->OnFallback(s.chain.enabled ? "late" : "drafter_down");
    }
  }
  s.chain_waited = false;
  std::vector<TokenLogprob> logprobs;
  if (s.top_logprobs >= 0) {
    absl::StatusOr<std::vector<TokenLogprob>> read =
        StepLogprobs(p.state, p.plan, *mode_out, model_->model->config().vocab_size, result->append,
                     s.top_logprobs);
    if (!read.ok()) {
      Finish(p.seq, FinishReason::kNone, read.status());
      return std::nullopt;
    }
    logprobs = *std::move(read);
  }
  Emit(p.seq, result->append, rows, std::move(logprobs));
  return observed;
}

// Emit: the new tokens join the sequence and its stream, the drafter hears of them, and a stop
// or the budget finishes the sequence.
void Engine::Impl::Emit(const SeqPtr& seq, std::span<const int32_t> append, const HiddenRows& rows,
                        std::vector<TokenLogprob> logprobs) {
  EngineSequence& s = *seq;
  Emitted e = AppendTokens(s, append);
  // Tokens past a stop are not emitted, nor their logprobs.
  if (logprobs.size() > e.tokens.size()) logprobs.resize(e.tokens.size());
  if (!e.tokens.empty() && s.usage.ttft_seconds == 0) {
    s.usage.ttft_seconds = Seconds(absl::Now() - s.submitted);
  }
  if (!e.error.ok()) {
    Finish(seq, FinishReason::kNone, e.error, std::move(e.tokens), std::move(e.text),
           std::move(logprobs));
    return;
  }
  if (e.finish != FinishReason::kNone) {
    Finish(seq, e.finish, absl::OkStatus(), std::move(e.tokens), std::move(e.text),
           std::move(logprobs));
    return;
  }
  if (s.spec && s.session_open && s.chain.enabled && (!e.tokens.empty() || !rows.empty())) {
    absl::Status advanced = s.channel->Advance(s.id, e.offset, e.tokens, s.gamma, rows);
    // Only new tokens restart the wait for a chain.
    if (!e.tokens.empty()) s.last_advance = absl::Now();
    if (!advanced.ok()) DisableDrafting(s, advanced);
  }
  if (!e.tokens.empty() || !e.text.empty()) {
    SequenceEvent event;
    event.tokens = std::move(e.tokens);
    event.logprobs = std::move(logprobs);
    event.text = std::move(e.text);
    event.mode = s.mode_name;
    event.lossless = s.lossless;
    s.sink->OnEvent(std::move(event));
  }
}

// Account: the step's time and tokens to the observer, the load board's averages and the cost
// model (see ObserveSequenceSteps for whose time a step is).
void Engine::Impl::Account(const StepBatch& batch, const ModeCounts& residents,
                           std::span<const SequenceObservation> observed, absl::Time step_start) {
  ++steps_;
  const absl::Time end = absl::Now();
  for (const Planned& p : batch.planned) p.seq->last_step_end = end;
  const double seconds = Seconds(end - step_start);
  if (options_.observer != nullptr) options_.observer->OnStep(seconds, batch.tokens);
  cost_builder_.ObserveStep(batch.tokens, seconds);
  ObserveSequenceSteps(cost_builder_, residents, observed, seconds);
  cost_ = cost_builder_.Snapshot();
  const auto batch_tokens = static_cast<double>(batch.tokens);
  if (steps_ == 1) {
    step_seconds_ewma_ = seconds;
    batch_tokens_ewma_ = batch_tokens;
  } else {
    step_seconds_ewma_ += kEwmaAlpha * (seconds - step_seconds_ewma_);
    batch_tokens_ewma_ += kEwmaAlpha * (batch_tokens - batch_tokens_ewma_);
  }
}

void Engine::Impl::Finish(const SeqPtr& seq, FinishReason reason, absl::Status error,
                          std::vector<int32_t> tokens, std::string text,
                          std::vector<TokenLogprob> logprobs) {
  EngineSequence& s = *seq;
  if (reason != FinishReason::kStop) {
    // Text held back for a possible stop string, and a character cut short.
    text += s.checker->Flush();
    text += s.detok->Flush();
  }
  if (s.resident) {
    if (error.ok()) PublishKv(s);  // its whole history, for a conversation's next turn
    kv_.RemoveSequence(static_cast<SeqId>(s.id));
    running_.erase(std::find(running_.begin(), running_.end(), seq));
    s.resident = false;
  } else {
    auto it = std::find(queue_.begin(), queue_.end(), seq);
    if (it != queue_.end()) queue_.erase(it);
  }
  if (s.counted_queued) {
    s.counted_queued = false;
    queued_.fetch_sub(1);
  }
  if (s.session_open) {
    if (s.channel != nullptr) s.channel->Close(s.id);
    s.session_open = false;
  }
  SequenceEvent event;
  event.tokens = std::move(tokens);
  event.logprobs = std::move(logprobs);
  event.text = std::move(text);
  event.finish = reason;
  event.error = std::move(error);
  event.mode = s.mode_name;
  event.lossless = s.lossless;
  s.usage.prompt_tokens = s.prompt_len;
  s.usage.completion_tokens = s.generated;
  s.usage.total_seconds = Seconds(absl::Now() - s.submitted);
  if (error.ok() && (reason == FinishReason::kStop || reason == FinishReason::kLength) &&
      !s.synthetic) {
    cost_builder_.ObserveFinished(s.generated);
  }
  event.usage = s.usage;
  std::shared_ptr<SequenceSink> sink = s.sink;
  live_.erase(s.id);
  sink->OnEvent(std::move(event));
}

void Engine::Impl::PublishLoad() {
  EngineLoad load;
  load.running = static_cast<int>(running_.size());
  load.queued = static_cast<int>(queue_.size());
  load.kv_usage_ratio = kv_.UsageRatio();
  load.kv_free_tokens = kv_.FreeTokenCapacity();
  load.steps = steps_;
  load.step_seconds_ewma = step_seconds_ewma_;
  load.batch_tokens_ewma = batch_tokens_ewma_;
  load.preemptions = preemptions_;
  load.prefix_cache = kv_.prefix_stats();
  load.cost = cost_;
  board_.Publish(load);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(LoadedModel* model, EngineOptions options,
                                                       DraftChannelFactory drafters) {
  if (model == nullptr || model->model == nullptr || model->tokenizer == nullptr) {
    return absl::InvalidArgumentError("the engine needs a loaded model with its tokenizer");
  }
  const int max_positions = model->model->config().max_position_embeddings;
  int context = options.context > 0 ? options.context : max_positions;
  if (max_positions > 0) context = std::min(context, max_positions);
  if (context <= 0) {
    return absl::InvalidArgumentError(
        "the model states no context length (max_position_embeddings); set EngineOptions.context");
  }
  if (options.kv_block_size <= 0 || options.max_batch_tokens <= 0 || options.max_running <= 0 ||
      options.prefill_chunk <= 0 || options.max_queued < 0 || options.max_mode_block <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine options must be positive: kv_block_size ", options.kv_block_size,
        ", max_batch_tokens ", options.max_batch_tokens, ", max_running ", options.max_running,
        ", prefill_chunk ", options.prefill_chunk, ", max_queued ", options.max_queued,
        ", max_mode_block ", options.max_mode_block));
  }
  const int64_t needed = static_cast<int64_t>(context) + kEngineKvHeadroom;
  if (options.kv_tokens < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_tokens ", options.kv_tokens, " cannot hold one full-context sequence: the context is ",
        context, " tokens and modes need ", kEngineKvHeadroom, " more; use at least ", needed));
  }
  const std::vector<std::string> modes = ImplementedModes();
  if (std::find(modes.begin(), modes.end(), options.default_mode) == modes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown default mode '", options.default_mode,
                     "'; this build has: ", absl::StrJoin(modes, ", ")));
  }
  return std::unique_ptr<Engine>(
      new Engine(std::make_unique<Impl>(model, std::move(options), std::move(drafters), context)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

absl::StatusOr<uint64_t> Engine::Submit(SequenceRequest request,
                                        std::shared_ptr<SequenceSink> sink) {
  return impl_->Submit(std::move(request), std::move(sink));
}
void Engine::Cancel(uint64_t id) { impl_->Cancel(id); }
void Engine::Drain() { impl_->Drain(); }
EngineLoad Engine::Load() const { return impl_->Load(); }
const LoadedModel& Engine::model() const { return impl_->model(); }

}  // namespace tandem
