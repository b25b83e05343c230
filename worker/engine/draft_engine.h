// The drafter's worker actor: alone owns an AR draft model, its KV cache and the drafting
// sessions of every connected verifier stream (see proto/tandem/v1/drafter.proto).
//
// A session keeps its final tokens and a greedy draft chain ahead of them. One thread runs the
// loop: drain the mailbox (streams and sessions opening, advancing, closing) -> pick the
// sessions whose chain is shorter than the lookahead (2 * gamma + 1 tokens past the final ones:
// a fully accepted step commits gamma drafts and a bonus token, and the next step wants gamma
// more) -> one batched Forward over all of them (each session's extend is its tokens whose KV is
// not cached yet, causal, logits of the last) -> append each greedy token -> publish chains.
//
// Chains: after an Open or an Advance the session's next chain starts at its final length (one
// final token earlier when the final length equals the end of the chain the verifier holds, so
// that it reads as a replacement, not an extension) and goes out as soon as it holds gamma
// tokens past the final ones (at once when the chain drafted ahead agrees with the appended
// tokens), or when the context ends first; then each newly drafted token extends it. Appended
// tokens that agree with the chain just make it final (their KV is reused); at the first
// disagreement the KV is truncated to the agreeing prefix and drafting restarts there.
//
// Hidden states: when options.hidden_layers names target layers (the drafter's GetInfo
// advertises them), verifiers send the target's hidden states of those layers for every final
// token of a session, lagging the tokens (proto/tandem/v1/drafter.proto, HiddenStates). The
// engine checks their shape and order (a malformed run ends the session with an error chain)
// and counts them; the AR draft model does not use them.
//
// DFlash: with options.dflash set the engine drafts with that block drafter instead (`model` is
// then the target, whose embeddings and head it reuses). It asks for the DFlash model's target
// layers; each session's rows become its context K/V as they arrive (host rows are converted to
// fp32 and appended; rows already in GPU memory, HiddenRows::device, go to
// DFlashModel::AppendContextDevice and need the model on CUDA, else the session ends with a
// FailedPrecondition error). After every Open or
// Advance (rows alone included) a session whose tokens without rows number a in
// [1, max_anchor] gets one block forward and its chain is that block's B - a drafts. More lag
// gives no chain; when it persists past an Advance that brought tokens (the rows are not coming:
// the verifier sends a step's rows with its tokens) the session ends with an error chain, so
// that its sequence takes AR steps without waiting for drafts. There is no AR KV cache and no
// batching across sessions in this path.
//
// Block drafts: a session opened with a block size (a `simsd` verifier) gets, after its Open and
// after every Advance that brought tokens, one block draft instead of a greedy chain when the
// model has a block-diffusion pathway (a <|mask|> token): DiffusionDrafter denoises a block of
// that many masks after the final tokens in its own order (one forward per slot), and the chain
// carries every slot of the block with its slot order (DraftChain.slots). These sessions share
// one drafter and its one-sequence cache (no batching, no AR KV); without the pathway the block
// size is ignored and the session gets greedy chains.
//
// Mask drafts (options.mask_drafts = k, a tri-mode model such as the verifier's own target:
// NLD §3.3 linear self-speculation with the draft and verify forwards on two services): the
// forward that feeds a session's last tokens also carries k <|mask|> rows at the next positions,
// which see every fed token and each other but are never kept in the KV. Its k drafts are the
// last token's greedy successor (the AR pathway's prediction of the first masked position, so a
// drafter hosting the target drafts that one exactly) and the argmax of masks 2..k (the same
// position convention as `self_spec`). Drafted tokens are fed causally by the next forward, so
// the chain keeps growing ahead of the verifier k tokens a forward, optimistic on full
// acceptance, and agreeing advances reuse its KV as in the greedy path.
//
// Branch-ahead (options.branches = B; greedy chains, not under a grammar): once a session's
// chain reaches its lookahead (so that a fully accepted step finds its next drafts), the drafter
// also drafts for the
// likeliest partial acceptances, scored from its own probabilities (worker/engine/branch_ahead.h):
// for each of the B likeliest, a branch session holding the session's tokens, the accepted
// drafts and the drafter's runner-up at the first refused one, drafted γ greedy tokens on in the
// same batched forwards (after every chain's own work). A branch goes to the verifier whole, as
// a DraftChain.branch from the session's final length; the verifier keeps it beside the chain and
// drafts from it when its tokens take that path. An Advance drops the session's branches (counting
// a hit when its tokens took a sent branch's path); branches are the first to lose their KV under
// pressure.
//
// Structured output: a session opened with a grammar (DraftSessionGrammar, compiled by the
// caller) drafts its greedy chain under it: before each argmax the row is masked to what the
// grammar allows after the session's generated tokens and chain, so the verifier's
// grammar-masked rows can accept the drafts. The DFlash and block-draft paths ignore grammars.
//
// Batching: sessions whose verifier waits for a chain go first, then the least recently
// served, within a token budget per forward (long prefills are fed in chunks).
//
// KV: a session that needs room takes it from sessions outside the batch (those whose chain is
// complete first, then the least recently served); an evicted session recomputes its KV when
// it next drafts. A session never fails for lack of
// KV; one that reaches the model's context stops extending (its last chain stays short).
//
// Thread-safety: every public method may be called from any thread; they only post messages.
// Chains are delivered on the engine thread through each stream's sink.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/actor_mailbox.h"
#include "worker/engine/draft_channel.h"
#include "worker/engine/engine_observer.h"
#include "worker/model/dflash.h"
#include "worker/model/transformer.h"
#include "worker/sampling/grammar.h"

namespace tandem {

// A session's grammar: the compiled constraint, how many of its first tokens are the prompt,
// and the sequence's stop tokens (allowed only where the grammar is complete).
struct DraftSessionGrammar {
  std::shared_ptr<const Grammar> grammar;
  int prompt_len = 0;
  std::vector<int32_t> stop_tokens;
};

struct DraftEngineOptions {
  int64_t kv_tokens = 32768;  // KV cache capacity in tokens (all sessions together)
  int kv_block_size = 16;
  int max_sessions = 256;       // open sessions at most (all streams together)
  int max_batch_tokens = 2048;  // token budget of one batched forward (prefills are chunked)
  // Told about each batched forward (OnStep) on the engine thread (metrics); not owned, may be
  // null, must outlive the engine.
  EngineObserver* observer = nullptr;
  // Target layers whose hidden states verifiers are asked to send (see above); empty = none.
  std::vector<int32_t> hidden_layers;
  // A DFlash drafter loaded for `model` (see above); Create sets hidden_layers from it. Not
  // owned; must outlive the engine.
  const DFlashModel* dflash = nullptr;
  // Prefix caching of the autoregressive path's KV (worker/kv/kv_cache.h): a session that
  // needs KV takes the longest cached prefix of its tokens, another session's included.
  bool prefix_cache = true;
  // > 0: chains are drafted with the model's block-diffusion pathway, this many tokens a
  // forward (see "Mask drafts" above; 2..kMaxMaskDrafts, and the model needs a <|mask|>
  // token). 0: one greedy token a forward.
  int mask_drafts = 0;
  // > 0: branch-ahead (see "Branch-ahead" above): once a session's chain reaches its lookahead,
  // it gets up to this many branches, for its likeliest partial acceptances, each drafted γ
  // tokens on and sent as a DraftChain.branch. 0..kMaxBranches.
  int branches = 0;
};

inline constexpr int kMaxBranches = 8;

inline constexpr int kMaxMaskDrafts = 64;

// A snapshot of the engine's counters.
struct DraftEngineStats {
  int sessions = 0;  // open now
  int streams = 0;   // registered now
  int64_t sessions_opened = 0;
  int64_t forwards = 0;           // batched drafter forwards
  int64_t drafted_tokens = 0;     // greedy tokens appended to chains
  int64_t reused_tokens = 0;      // drafted tokens that became final with their KV kept
  int64_t fed_tokens = 0;         // tokens fed to the model (prefill, recompute and drafts)
  int64_t recomputed_tokens = 0;  // tokens fed again after their session's KV was evicted
  int64_t evictions = 0;          // sessions whose KV was dropped to make room
  int64_t chains = 0;             // chain messages published
  int64_t hidden_rows = 0;        // token rows of target hidden states received (all sessions)
  int64_t branches = 0;           // branch-ahead chains sent
  int64_t branch_tokens = 0;      // tokens drafted in branches (sent or dropped)
  int64_t branch_hits = 0;        // advances whose tokens took a sent branch's path
  double kv_usage_ratio = 0;
  int64_t kv_free_tokens = 0;
  PrefixCacheStats prefix_cache;
  double step_seconds_ewma = 0;
  double batch_tokens_ewma = 0;
};

class DraftEngine {
 public:
  // Receives the chains of one stream's sessions, on the engine thread; must not block.
  using ChainSink = std::function<void(DraftChain)>;

  // `model` is not owned and must outlive the engine. InvalidArgument for options that cannot
  // work (a KV cache that cannot hold one full-context session, max_sessions < 1, ...).
  static absl::StatusOr<std::unique_ptr<DraftEngine>> Create(Transformer* model,
                                                             DraftEngineOptions options);
  // Drops every session and joins the engine thread; no sink is called afterwards.
  ~DraftEngine();

  DraftEngine(const DraftEngine&) = delete;
  DraftEngine& operator=(const DraftEngine&) = delete;

  // Registers a stream whose sessions' chains go to `sink`; returns its id.
  uint64_t AddStream(ChainSink sink);
  // Closes the stream's sessions; its sink is not called once the engine has processed this.
  void RemoveStream(uint64_t stream);

  // Session messages (drafter.proto). Protocol errors (unknown or duplicate session, offset
  // mismatch, empty tokens, gamma < 1, tokens outside the vocabulary, too many sessions) end
  // the session with an error chain; they never affect other sessions.
  // `hidden`: the rows that became final since the session's last message (none by default);
  // a wrong shape, a gap or a repeat, or rows nobody asked for end the session.
  // `block_size` > 0 asks for block drafts (see above).
  // `grammar`: the session drafts under it (see above); a prompt_len outside [0, tokens] ends
  // the session.
  void Open(uint64_t stream, uint64_t session, std::vector<int32_t> tokens, int gamma,
            HiddenRows hidden = {}, int block_size = 0,
            std::optional<DraftSessionGrammar> grammar = std::nullopt);
  void Advance(uint64_t stream, uint64_t session, int offset, std::vector<int32_t> append,
               int gamma, HiddenRows hidden = {});
  void Close(uint64_t stream, uint64_t session);
  // Ends the session (open or not) with an error chain carrying `error`, in order with the
  // stream's other messages (for malformed messages caught before the engine).
  void Reject(uint64_t stream, uint64_t session, absl::Status error);

  // Counters as of the last chain published (or the last step): a caller that has received a
  // chain sees counters that include it.
  DraftEngineStats Stats() const;
  const ModelConfig& model_config() const { return model_->config(); }
  const DraftEngineOptions& options() const { return options_; }
  // How it drafts, as WorkerInfo.modes and the registry name it: "dflash" (blocks from the
  // target's hidden states), "mask_drafts" (the model's <|mask|> rows) or "ar" (greedy chains).
  const char* drafting() const {
    return options_.dflash != nullptr ? "dflash" : options_.mask_drafts > 0 ? "mask_drafts" : "ar";
  }

 private:
  struct Message;
  struct Session;
  class Loop;

  DraftEngine(Transformer* model, DraftEngineOptions options);
  void Post(Message message);

  Transformer* model_;
  DraftEngineOptions options_;
  std::atomic<uint64_t> next_stream_{1};
  std::unique_ptr<ActorMailbox<Message>> mailbox_;
  Published<DraftEngineStats> stats_;  // published before every chain and after every step
  std::unique_ptr<Loop> loop_;         // state owned by the engine thread
  std::thread thread_;
};

}  // namespace tandem
