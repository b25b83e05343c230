#include "worker/engine/draft_engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <span>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/decoding/diffusion_drafter.h"
#include "worker/engine/branch_ahead.h"
#include "worker/kv/kv_cache.h"
#include "worker/sampling/sampling.h"

namespace tandem {

namespace {

// One drafter model per cache, and only causal KV of the sessions' tokens: the tokens alone
// decide the KV.
constexpr uint64_t kPrefixSalt = 0;

KvCacheOptions DraftKvOptions(const Transformer& model, const DraftEngineOptions& options) {
  // The DFlash path keeps no autoregressive KV: a one-block cache stands in.
  const bool dflash = options.dflash != nullptr;
  KvCacheOptions kv =
      model.KvOptions(dflash ? options.kv_block_size : options.kv_tokens, options.kv_block_size);
  kv.prefix_cache = options.prefix_cache && !dflash;
  return kv;
}

}  // namespace

struct DraftEngine::Message {
  enum class Kind { kAddStream, kRemoveStream, kOpen, kAdvance, kClose, kReject };
  Kind kind = Kind::kOpen;
  uint64_t stream = 0;
  uint64_t session = 0;
  int offset = 0;
  int gamma = 0;
  std::vector<int32_t> tokens;                 // kOpen: the sequence; kAdvance: the appended tokens
  ChainSink sink;                              // kAddStream
  absl::Status error;                          // kReject
  HiddenRows hidden;                           // kOpen, kAdvance
  int block_size = 0;                          // kOpen
  std::optional<DraftSessionGrammar> grammar;  // kOpen
};

struct DraftEngine::Session {
  uint64_t stream = 0;
  uint64_t id = 0;
  int gamma = 1;
  // The final tokens [0, final_len) followed by the draft chain [final_len, size).
  std::vector<int32_t> tokens;
  int final_len = 0;
  bool resident = false;   // has a KV sequence
  SeqId seq = 0;           // while resident
  int cached = 0;          // tokens[0, cached) have committed KV (0 when not resident)
  int evicted_cached = 0;  // what `cached` was at the last eviction (recompute accounting)
  // End of the last chain published since the last Open/Advance; -1 when none was (the next
  // chain then starts at final_len).
  int sent_end = -1;
  int client_end = -1;      // end of the chain the verifier holds (-1: none)
  int64_t last_served = 0;  // step of the last forward it took part in
  int hidden_rows = 0;      // tokens whose target hidden states arrived ([0, hidden_rows))
  int hidden_size = 0;      // of those rows (0 until the first)
  bool in_batch = false;    // during Step only
  // DFlash: context K/V of the rows so far, and whether the tokens or rows changed since the
  // session's last block.
  DFlashContext dflash;
  bool dflash_due = false;
  // Block drafts: the block size (0 = greedy chains) and whether the tokens changed since the
  // session's last block draft.
  int block_size = 0;
  bool block_due = false;
  // Structured output: the chain is drafted under this grammar; tokens [0, prompt_len) are the
  // prompt.
  std::unique_ptr<GrammarCursor> grammar;
  int prompt_len = 0;
  // Branch-ahead (options.branches > 0; greedy chains): each token's probability and runner-up
  // as drafted (parallel to `tokens`; empty entries for the verifier's tokens), whether the
  // chain was branched since the last Open/Advance, and the paths (accepted drafts, then the
  // correction) of the branches sent since.
  std::vector<DraftAlternative> alternatives;
  bool branched = false;
  std::vector<std::vector<int32_t>> branch_paths;
  // A branch session: drafts for its parent session `id` from the parent's final length
  // `branch_from`; its own final tokens end with the branch's correction.
  bool is_branch = false;
  int branch_from = 0;

  int chain_len() const { return static_cast<int>(tokens.size()) - final_len; }
};

// Everything the engine thread owns. Touched only by that thread.
class DraftEngine::Loop {
 public:
  Loop(Transformer* model, const DraftEngineOptions& options,
       Published<DraftEngineStats>* published)
      : model_(model),
        published_(published),
        options_(options),
        kv_(DraftKvOptions(*model, options)),
        vocab_(model->config().vocab_size) {
    const int context = model->config().max_position_embeddings;
    max_len_ = static_cast<int>(std::min<int64_t>(
        options.kv_tokens, context > 0 ? context : std::numeric_limits<int>::max()));
    if (options.dflash == nullptr && model->config().diffusion.mask_token_id) {
      block_drafter_ = std::make_unique<DiffusionDrafter>(
          model, *model->config().diffusion.mask_token_id, max_len_);
    }
  }

  void Handle(Message m) {
    switch (m.kind) {
      case Message::Kind::kAddStream:
        sinks_[m.stream] = std::move(m.sink);
        break;
      case Message::Kind::kRemoveStream:
        RemoveStream(m.stream);
        break;
      case Message::Kind::kOpen:
        Open(m.stream, m.session, std::move(m.tokens), m.gamma, m.hidden, m.block_size, m.grammar);
        break;
      case Message::Kind::kAdvance:
        Advance(m.stream, m.session, m.offset, m.tokens, m.gamma, m.hidden);
        break;
      case Message::Kind::kClose:
        Erase(m.stream, m.session);
        break;
      case Message::Kind::kReject: {
        auto it = sessions_.find({m.stream, m.session});
        Fail(m.stream, m.session, it == sessions_.end() ? 0 : it->second.final_len,
             std::move(m.error));
        break;
      }
    }
  }

  bool HasWork() const {
    for (const auto& [key, s] : sessions_) {
      if (NeedsWork(s)) return true;
    }
    for (const auto& [key, s] : branches_) {
      if (NeedsWork(s)) return true;
    }
    return false;
  }

  // One step: block drafts, DFlash drafts or autoregressive drafts, by the drafter's kind.
  void Step();

  DraftEngineStats Stats() const {
    DraftEngineStats s = stats_;
    s.sessions = static_cast<int>(sessions_.size());
    s.streams = static_cast<int>(sinks_.size());
    s.kv_usage_ratio = kv_.UsageRatio();
    s.kv_free_tokens = kv_.FreeTokenCapacity();
    s.prefix_cache = kv_.prefix_stats();
    return s;
  }

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (stream, session)

  bool CanExtend(const Session& s) const { return static_cast<int>(s.tokens.size()) < max_len_; }
  bool NeedsWork(const Session& s) const {
    if (s.is_branch) return CanExtend(s) && s.chain_len() < s.gamma;
    if (s.block_size > 0) return s.block_due;
    if (options_.dflash != nullptr) return s.dflash_due;
    return CanExtend(s) && s.chain_len() < 2 * s.gamma + 1;
  }

  void Send(uint64_t stream, DraftChain chain) {
    auto it = sinks_.find(stream);
    if (it == sinks_.end()) return;
    ++stats_.chains;
    // Whoever sees the chain sees counters that include it.
    published_->Publish(Stats());
    it->second(std::move(chain));
  }

  // Publishes what the verifier has not seen of the session's chain, once there is enough.
  void MaybeEmit(Session& s) {
    const int size = static_cast<int>(s.tokens.size());
    int from = 0;
    if (s.sent_end < 0) {
      // A short chain goes out only when it cannot grow (the context ends), so the verifier
      // stops waiting for it.
      if (s.chain_len() < s.gamma && CanExtend(s)) return;
      // Starting at the verifier's chain end would read as an extension of a chain that may
      // disagree with the final tokens; one final token in front makes it a replacement.
      from = s.final_len == s.client_end ? s.final_len - 1 : s.final_len;
    } else {
      if (size <= s.sent_end) return;
      from = s.sent_end;
    }
    DraftChain chain{.session = s.id,
                     .from = from,
                     .tokens = std::vector<int32_t>(s.tokens.begin() + from, s.tokens.end())};
    s.sent_end = size;
    s.client_end = size;
    Send(s.stream, std::move(chain));
  }

  // Ends the session with an error chain (it need not exist).
  void Fail(uint64_t stream, uint64_t session, int from, absl::Status error) {
    Erase(stream, session);
    Send(stream, DraftChain{.session = session, .from = from, .error = std::move(error)});
  }

  void Erase(uint64_t stream, uint64_t session) {
    DropBranches(stream, session);
    auto it = sessions_.find({stream, session});
    if (it == sessions_.end()) return;
    if (it->second.resident) kv_.RemoveSequence(it->second.seq);
    sessions_.erase(it);
  }

  void RemoveStream(uint64_t stream) {
    for (auto b = branches_.lower_bound({stream, 0, 0});
         b != branches_.end() && std::get<0>(b->first) == stream;) {
      if (b->second.resident) kv_.RemoveSequence(b->second.seq);
      b = branches_.erase(b);
    }
    auto it = sessions_.lower_bound({stream, 0});
    while (it != sessions_.end() && it->first.first == stream) {
      if (it->second.resident) kv_.RemoveSequence(it->second.seq);
      it = sessions_.erase(it);
    }
    sinks_.erase(stream);
  }

  absl::Status CheckVocabulary(std::span<const int32_t> tokens) const {
    for (int32_t t : tokens) {
      if (t < 0 || t >= vocab_) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " is outside the drafter's vocabulary of ", vocab_,
                         " (do the verifier and the drafter share a tokenizer?)"));
      }
    }
    return absl::OkStatus();
  }

  // Whether `hidden` may follow the session's rows so far (`rows` of width `hidden_size`) when
  // it will hold `length` tokens.
  absl::Status CheckHidden(uint64_t id, const HiddenRows& hidden, int rows, int hidden_size,
                           int length) const {
    if (hidden.tokens == 0 && hidden.layers == 0 && hidden.bf16.empty() &&
        hidden.device == nullptr) {
      return absl::OkStatus();
    }
    const int want_layers = static_cast<int>(options_.hidden_layers.size());
    if (want_layers == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("session ", id,
                       " sent target hidden states, but this drafter asks for none (start it "
                       "with --hidden-layers to take them)"));
    }
    if (hidden.layers != want_layers || hidden.tokens <= 0 || hidden.hidden_size <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session ", id, " sent hidden states of ", hidden.layers, " layers x ", hidden.tokens,
          " tokens x ", hidden.hidden_size, " values; this drafter asks for ", want_layers,
          " layers and the other two must be positive"));
    }
    const int64_t values = int64_t{hidden.layers} * hidden.tokens * hidden.hidden_size;
    if (hidden.device != nullptr) {
      // Rows in GPU memory: only a DFlash drafter on the GPU can take them (the transport hands
      // them on only to one).
      if (options_.dflash == nullptr || options_.dflash->device() != Device::kCuda) {
        return absl::FailedPreconditionError(absl::StrCat(
            "session ", id, " got target hidden states in GPU memory (device ",
            hidden.device->device(), "), but this drafter's ",
            options_.dflash == nullptr
                ? "AR draft model"
                : absl::StrCat("DFlash model runs on the ",
                               std::string(DeviceName(options_.dflash->device())), " and"),
            " cannot read them; only a DFlash drafter on the GPU takes hidden states there"));
      }
      if (!hidden.bf16.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("session ", id, " got hidden states both in GPU memory and as ",
                         hidden.bf16.size(), " host values"));
      }
    } else if (static_cast<int64_t>(hidden.bf16.size()) != values) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session ", id, " sent ", hidden.bf16.size(), " bf16 values for hidden states of shape [",
          hidden.layers, ", ", hidden.tokens, ", ", hidden.hidden_size, "], which need ", values));
    }
    if (hidden_size != 0 && hidden.hidden_size != hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat("session ", id,
                                                     " changed its hidden size from ", hidden_size,
                                                     " to ", hidden.hidden_size));
    }
    if (hidden.offset != rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session ", id, " sent hidden states from token ", hidden.offset, " but has them for ",
          rows, " tokens; runs must follow one another without gaps or repeats"));
    }
    if (int64_t{hidden.offset} + hidden.tokens > length) {
      return absl::InvalidArgumentError(
          absl::StrCat("session ", id, " sent hidden states up to token ",
                       hidden.offset + hidden.tokens, " but has only ", length, " tokens"));
    }
    return absl::OkStatus();
  }

  void Open(uint64_t stream, uint64_t id, std::vector<int32_t> tokens, int gamma,
            const HiddenRows& hidden, int block_size,
            const std::optional<DraftSessionGrammar>& grammar) {
    if (!sinks_.contains(stream)) return;  // the stream is gone
    if (sessions_.contains({stream, id})) {
      Fail(stream, id, 0,
           absl::InvalidArgumentError(
               absl::StrCat("session ", id, " was opened twice on one stream; both are ended")));
      return;
    }
    if (tokens.empty()) {
      Fail(stream, id, 0,
           absl::InvalidArgumentError(absl::StrCat("open of session ", id, " has no tokens")));
      return;
    }
    if (gamma < 1) {
      Fail(stream, id, 0,
           absl::InvalidArgumentError(
               absl::StrCat("open of session ", id, " asks for gamma ", gamma, "; must be >= 1")));
      return;
    }
    if (block_size < 0) {
      Fail(stream, id, 0,
           absl::InvalidArgumentError(absl::StrCat("open of session ", id, " asks for block size ",
                                                   block_size, "; must be >= 0")));
      return;
    }
    if (absl::Status s = CheckVocabulary(tokens); !s.ok()) {
      Fail(stream, id, 0, s);
      return;
    }
    if (grammar.has_value() && (grammar->grammar == nullptr || grammar->prompt_len < 0 ||
                                grammar->prompt_len > static_cast<int>(tokens.size()))) {
      Fail(stream, id, 0,
           absl::InvalidArgumentError(
               absl::StrCat("open of session ", id, " has a grammar with prompt length ",
                            grammar->prompt_len, " for ", tokens.size(), " tokens")));
      return;
    }
    if (absl::Status s = CheckHidden(id, hidden, 0, 0, static_cast<int>(tokens.size())); !s.ok()) {
      Fail(stream, id, 0, s);
      return;
    }
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      Fail(stream, id, 0,
           absl::ResourceExhaustedError(absl::StrCat(
               "the drafter already has ", sessions_.size(),
               " sessions open (--max-sessions); decode session ", id, " without drafts")));
      return;
    }
    Session& s = sessions_[{stream, id}];
    s.stream = stream;
    s.id = id;
    s.gamma = gamma;
    s.tokens = std::move(tokens);
    s.final_len = static_cast<int>(s.tokens.size());
    if (options_.branches > 0) s.alternatives.resize(s.tokens.size());
    if (grammar.has_value()) {
      s.grammar = std::make_unique<GrammarCursor>(grammar->grammar, grammar->stop_tokens);
      s.prompt_len = grammar->prompt_len;
    }
    ++stats_.sessions_opened;
    if (absl::Status st = RecordHidden(s, hidden); !st.ok()) {
      Fail(stream, id, 0, st);
      return;
    }
    if (block_drafter_ != nullptr && block_size > 0) {
      s.block_size = block_size;
      s.block_due = true;
      return;
    }
    if (options_.dflash != nullptr) {
      s.dflash_due = true;
      return;
    }
    MaybeEmit(s);
  }

  // Counts the rows; the DFlash path turns them into the session's context K/V.
  absl::Status RecordHidden(Session& s, const HiddenRows& hidden) {
    if (hidden.tokens <= 0) return absl::OkStatus();
    if (options_.dflash != nullptr && hidden.device != nullptr) {
      // Already on the GPU: the model's reads queue behind the rows' readiness, and the payload
      // goes back to its pool after them when `hidden` is dropped.
      absl::Status appended = hidden.device->Read([&](const void* rows, CUstream_st* stream) {
        return options_.dflash->AppendContextDevice(s.dflash, rows, hidden.tokens, stream);
      });
      if (!appended.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("session ", s.id, ": ", appended.message()));
      }
    } else if (options_.dflash != nullptr) {
      std::vector<float> rows(hidden.bf16.size());
      for (size_t i = 0; i < rows.size(); ++i) rows[i] = Bf16ToFloat(hidden.bf16[i]);
      absl::Status appended = options_.dflash->AppendContext(s.dflash, rows, hidden.tokens);
      if (!appended.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("session ", s.id, ": ", appended.message()));
      }
    }
    s.hidden_rows += hidden.tokens;
    s.hidden_size = hidden.hidden_size;
    stats_.hidden_rows += hidden.tokens;
    return absl::OkStatus();
  }

  // The DFlash path: one block per session whose tokens or rows changed.
  void DFlashStep();
  // The autoregressive step and its stages.
  struct ArPlanned {
    Session* s;
    int n;  // session tokens fed (their KV is kept)
    // The n tokens, then (mask drafts) <|mask|> rows at the positions after them.
    std::vector<int32_t> tokens;
    std::vector<int32_t> positions;
    Visibility visible;
    // The last fed token's row, then the mask rows that draft (all but the first mask).
    std::vector<int32_t> outputs;
  };
  void ArStep();
  void SpawnBranches();
  void SendBranch(Session& b);
  void DropBranches(uint64_t stream, uint64_t session);
  void CountBranchHit(Session& s, std::span<const int32_t> append);
  std::vector<ArPlanned> PlanAr(const std::vector<Session*>& candidates);
  // <|mask|> rows of a session's drafting forward when it has `size` tokens (0: one greedy
  // token a forward).
  int MaskRows(int size) const;
  ArPlanned PlanExtend(Session& s, int n, int masks) const;
  // The greedy token of `logits`, the row after the session's tokens [0, end) (under its
  // grammar, if any).
  int32_t Greedy(Session& s, std::span<const float> logits, int end);
  std::span<const float> Row(const ExtendOutput& out, int r) const {
    return std::span<const float>(out.logits)
        .subspan(static_cast<size_t>(r) * vocab_, static_cast<size_t>(vocab_));
  }
  void CommitAr(const std::vector<ArPlanned>& planned, const std::vector<ExtendOutput>& out);
  // The step's time and tokens to the stats' averages and the observer.
  void AccountStep(double seconds, int batch_tokens);
  // Block drafts of the sessions that are due.
  void BlockStep();

  void Advance(uint64_t stream, uint64_t id, int offset, std::span<const int32_t> append, int gamma,
               const HiddenRows& hidden) {
    if (!sinks_.contains(stream)) return;
    auto it = sessions_.find({stream, id});
    if (it == sessions_.end()) {
      Fail(stream, id, offset,
           absl::NotFoundError(absl::StrCat("advance for session ", id,
                                            ", which is not open on this stream (never opened, "
                                            "closed or ended by an earlier error)")));
      return;
    }
    Session& s = it->second;
    if (offset != s.final_len) {
      Fail(stream, id, offset,
           absl::InvalidArgumentError(absl::StrCat(
               "advance for session ", id, " says it has ", offset, " tokens but the drafter has ",
               s.final_len, "; the session is ended (reopen it with the whole sequence)")));
      return;
    }
    if (gamma < 0) {
      Fail(stream, id, offset,
           absl::InvalidArgumentError(absl::StrCat("advance for session ", id, " asks for gamma ",
                                                   gamma, "; must be >= 1 (or 0: unchanged)")));
      return;
    }
    if (absl::Status st = CheckVocabulary(append); !st.ok()) {
      Fail(stream, id, offset, st);
      return;
    }
    if (absl::Status st = CheckHidden(id, hidden, s.hidden_rows, s.hidden_size,
                                      s.final_len + static_cast<int>(append.size()));
        !st.ok()) {
      Fail(stream, id, offset, st);
      return;
    }
    if (absl::Status st = RecordHidden(s, hidden); !st.ok()) {
      Fail(stream, id, offset, st);
      return;
    }
    if (s.block_size > 0) {
      // The next block starts after the new final tokens; its draft replaces the old one.
      if (gamma > 0) s.gamma = gamma;
      s.tokens.insert(s.tokens.end(), append.begin(), append.end());
      s.final_len = static_cast<int>(s.tokens.size());
      if (!append.empty()) s.block_due = true;
      return;
    }
    if (options_.dflash != nullptr) {
      // Final tokens only: the old chain is dropped, the next block replaces it.
      if (gamma > 0) s.gamma = gamma;
      s.tokens.resize(s.final_len);
      s.tokens.insert(s.tokens.end(), append.begin(), append.end());
      s.final_len = static_cast<int>(s.tokens.size());
      s.sent_end = -1;
      const int lag = s.final_len - s.dflash.length();
      if (!append.empty() && lag > options_.dflash->config().max_anchor) {
        // A verifier that sends rows sends those of a step's kept tokens with its tokens, so
        // this lag is for good (the session opened before the verifier knew the layers, or
        // after its first tokens were final): end it, its sequence decodes without waiting.
        Fail(stream, id, offset,
             absl::FailedPreconditionError(absl::StrCat(
                 "session ", id, " has target hidden states for ", s.dflash.length(), " of its ",
                 s.final_len, " tokens; the DFlash drafter drafts from at most ",
                 options_.dflash->config().max_anchor, " tokens without them")));
        return;
      }
      s.dflash_due = true;
      return;
    }
    // Rows alone (the verifier's prefill) change nothing to draft from.
    if (append.empty() && (gamma == 0 || gamma == s.gamma)) return;
    if (gamma > 0) s.gamma = gamma;
    const int n = static_cast<int>(append.size());
    CountBranchHit(s, append);
    DropBranches(stream, id);
    int agree = 0;
    while (agree < n && agree < s.chain_len() && s.tokens[s.final_len + agree] == append[agree]) {
      ++agree;
    }
    const int old_final = s.final_len;
    const int keep = old_final + agree;  // tokens that stay as they are
    if (agree < n) {
      s.tokens.resize(keep);
      s.tokens.insert(s.tokens.end(), append.begin() + agree, append.end());
      if (s.cached > keep) TruncateKv(s, keep);
      s.evicted_cached = std::min(s.evicted_cached, keep);
      if (options_.branches > 0) {
        s.alternatives.resize(keep);
        s.alternatives.resize(s.tokens.size());
      }
    }
    s.final_len = old_final + n;
    stats_.reused_tokens += std::max(0, std::min(s.cached, s.final_len) - old_final);
    s.sent_end = -1;
    MaybeEmit(s);
  }

  // Rolls the session's KV back to `length` tokens; when the pool has no block for the copy of
  // a shared block that needs (KvCache::Truncate), drops its KV instead (recomputed later).
  void TruncateKv(Session& s, int length) {
    if (kv_.Truncate(s.seq, length).ok()) {
      s.cached = length;
      return;
    }
    DropKv(s);
  }

  void DropKv(Session& s) {
    kv_.RemoveSequence(s.seq);
    s.resident = false;
    s.evicted_cached = std::max(s.evicted_cached, s.cached);
    s.cached = 0;
  }

  // Drops the KV of the least useful resident session outside the batch: first those whose
  // chain is already long enough, then the least recently served. False when there is none.
  bool EvictOne() {
    // Branches first: they are only speculation.
    for (auto& [key, b] : branches_) {
      if (b.resident && !b.in_batch) {
        DropKv(b);
        ++stats_.evictions;
        return true;
      }
    }
    Session* victim = nullptr;
    for (auto& [key, s] : sessions_) {
      if (!s.resident || s.in_batch) continue;
      if (victim == nullptr || std::make_pair(NeedsWork(s), s.last_served) <
                                   std::make_pair(NeedsWork(*victim), victim->last_served)) {
        victim = &s;
      }
    }
    if (victim == nullptr) return false;
    DropKv(*victim);
    ++stats_.evictions;
    return true;
  }

  Transformer* model_;
  Published<DraftEngineStats>* published_;
  DraftEngineOptions options_;
  KvCache kv_;
  int vocab_;
  int max_len_;  // a session extends while it holds fewer tokens
  SeqId next_seq_ = 1;
  int64_t step_ = 0;
  std::map<uint64_t, ChainSink> sinks_;
  std::map<Key, Session> sessions_;  // ordered: a stream's sessions are one range
  // Branch-ahead sessions by (stream, parent session, outcome j).
  std::map<std::tuple<uint64_t, uint64_t, int>, Session> branches_;
  DraftEngineStats stats_;
  std::unique_ptr<DiffusionDrafter> block_drafter_;  // null without a diffusion pathway
  std::vector<float> row_;  // CommitAr's scratch: a logit row masked by a session's grammar
};

void DraftEngine::Loop::BlockStep() {
  for (auto& [key, s] : sessions_) {
    if (s.block_size <= 0 || !s.block_due) continue;
    s.block_due = false;
    const int size = std::min(s.block_size, max_len_ - s.final_len);
    if (size <= 0) continue;  // the context ends at the block start: nothing to draft
    const auto start = std::chrono::steady_clock::now();
    const DrafterStats before = block_drafter_->stats();
    absl::StatusOr<BlockDraft> draft =
        block_drafter_->DraftBlock(std::span<const int32_t>(s.tokens).first(s.final_len),
                                   std::vector<int32_t>(size, kUndecodedSlot), size);
    const DrafterStats& after = block_drafter_->stats();
    stats_.forwards += after.forwards - before.forwards;
    stats_.fed_tokens += after.fed_tokens - before.fed_tokens;
    ++step_;
    if (!draft.ok()) {
      Fail(s.stream, s.id, s.final_len,
           absl::InternalError(absl::StrCat("block draft failed: ", draft.status().message())));
      return;  // `sessions_` changed; the rest wait for the next step
    }
    s.last_served = step_;
    stats_.drafted_tokens += draft->size();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options_.observer != nullptr) {
      options_.observer->OnStep(seconds, static_cast<int>(after.fed_tokens - before.fed_tokens));
    }
    DraftChain chain{.session = s.id,
                     .from = s.final_len,
                     .tokens = std::move(draft->tokens),
                     .slots = std::move(draft->slots)};
    s.sent_end = -1;
    s.client_end = -1;
    Send(s.stream, std::move(chain));
  }
}

void DraftEngine::Loop::DFlashStep() {
  const DFlashConfig& config = options_.dflash->config();
  for (auto& [key, s] : sessions_) {
    if (!s.dflash_due) continue;
    s.dflash_due = false;
    const int anchor = s.final_len - s.dflash.length();
    const int room = max_len_ - s.final_len;
    if (anchor < 1 || anchor > config.max_anchor || room <= 0) continue;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<int32_t>> drafts = options_.dflash->Draft(
        s.dflash, std::span<const int32_t>(s.tokens).subspan(s.dflash.length(), anchor));
    ++stats_.forwards;
    ++step_;
    if (!drafts.ok()) {
      Fail(s.stream, s.id, s.final_len,
           absl::InternalError(absl::StrCat("DFlash block failed: ", drafts.status().message())));
      return;  // `sessions_` changed; the rest wait for the next step
    }
    if (static_cast<int>(drafts->size()) > room) drafts->resize(room);
    s.last_served = step_;
    s.tokens.resize(s.final_len);
    s.tokens.insert(s.tokens.end(), drafts->begin(), drafts->end());
    stats_.drafted_tokens += static_cast<int64_t>(drafts->size());
    stats_.fed_tokens += config.block_size;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options_.observer != nullptr) options_.observer->OnStep(seconds, config.block_size);
    // Starting one final token early makes the chain a replacement of the verifier's.
    const int from = s.final_len == s.client_end ? s.final_len - 1 : s.final_len;
    DraftChain chain{.session = s.id,
                     .from = from,
                     .tokens = std::vector<int32_t>(s.tokens.begin() + from, s.tokens.end())};
    s.sent_end = static_cast<int>(s.tokens.size());
    s.client_end = s.sent_end;
    Send(s.stream, std::move(chain));
  }
}

void DraftEngine::Loop::Step() {
  if (block_drafter_ != nullptr) BlockStep();
  if (options_.dflash != nullptr) {
    DFlashStep();
    return;
  }
  ArStep();
  if (options_.branches > 0) SpawnBranches();
}

// An autoregressive draft step: plan (sessions in need, verifier-waiting first, then the least
// recently served; KV reserved, evicting idle sessions' caches) → forward → commit each fed
// prefix and append one greedy token → account → emit chains.
void DraftEngine::Loop::ArStep() {
  std::vector<Session*> candidates;
  for (auto& [key, s] : sessions_) {
    if (NeedsWork(s)) candidates.push_back(&s);
  }
  for (auto& [key, s] : branches_) {
    if (NeedsWork(s)) candidates.push_back(&s);
  }
  if (candidates.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  ++step_;
  // Chains before branches (the step's token budget goes to them first); among them, those
  // the verifier waits for, then the least recently served.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Session* a, const Session* b) {
    return std::make_tuple(a->is_branch, a->sent_end >= 0, a->last_served) <
           std::make_tuple(b->is_branch, b->sent_end >= 0, b->last_served);
  });
  std::vector<ArPlanned> planned = PlanAr(candidates);
  if (planned.empty()) {
    for (Session* s : candidates) s->in_batch = false;
    return;
  }

  std::vector<Extend> extends;
  extends.reserve(planned.size());
  int batch_tokens = 0;
  for (const ArPlanned& p : planned) {
    extends.push_back(Extend{.seq = p.s->seq,
                             .tokens = p.tokens,
                             .positions = p.positions,
                             .visible = p.visible,
                             .outputs = p.outputs});
    batch_tokens += static_cast<int>(p.tokens.size());
  }
  absl::StatusOr<std::vector<ExtendOutput>> out = model_->Forward(extends, kv_);
  ++stats_.forwards;
  if (!out.ok()) {
    // Forward validates its input: this is a bug here, but only these sessions suffer. Failing
    // erases sessions, so the flags are cleared through the map, not the candidates.
    for (const ArPlanned& p : planned) {
      Fail(p.s->stream, p.s->id, p.s->final_len,
           absl::InternalError(absl::StrCat("drafter forward failed: ", out.status().message())));
    }
    for (auto& [key, s] : sessions_) s.in_batch = false;
    return;
  }
  CommitAr(planned, *out);
  for (Session* s : candidates) s->in_batch = false;
  AccountStep(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              batch_tokens);
  std::vector<Session*> done_branches;
  for (const ArPlanned& p : planned) {
    Session& s = *p.s;
    if (!s.is_branch) {
      MaybeEmit(s);
      continue;
    }
    // A branch goes out whole (γ drafts, as a chain's first message), then its KV is freed.
    if (!NeedsWork(s)) {
      SendBranch(s);
      done_branches.push_back(&s);
    }
  }
  for (Session* b : done_branches) {
    if (b->resident) kv_.RemoveSequence(b->seq);
    branches_.erase({b->stream, b->id, b->final_len - 1 - b->branch_from});
  }
}

// Branch-ahead: each chain at its lookahead (a fully accepted step finds its next drafts) that
// was not branched since its last Open/Advance gets branch sessions for its likeliest partial
// acceptances (LikelyRejections): the accepted drafts and the runner-up at the first refused
// one, drafted γ tokens on beside the other chains' drafting. Drafting them sooner measured
// worse: the lookahead a full acceptance needs then came late.
void DraftEngine::Loop::SpawnBranches() {
  for (auto& [key, s] : sessions_) {
    // Not under a grammar: a branch's correction is drafted without one.
    if (s.branched || s.block_size > 0 || s.grammar != nullptr || NeedsWork(s) ||
        s.chain_len() < s.gamma || s.alternatives.size() != s.tokens.size()) {
      continue;
    }
    s.branched = true;
    const std::span<const DraftAlternative> drafts =
        std::span<const DraftAlternative>(s.alternatives).subspan(s.final_len);
    for (int j : LikelyRejections(drafts, s.gamma, options_.branches)) {
      const int at = s.final_len + j;  // the refused draft's index
      Session& b = branches_[{s.stream, s.id, j}];
      b.stream = s.stream;
      b.id = s.id;
      b.gamma = s.gamma;
      b.is_branch = true;
      b.branch_from = s.final_len;
      b.tokens.assign(s.tokens.begin(), s.tokens.begin() + at);
      b.tokens.push_back(s.alternatives[at].second);
      b.final_len = static_cast<int>(b.tokens.size());
    }
  }
}

// Sends a branch to the verifier beside its parent's chain; the parent notes its path for hit
// counting.
void DraftEngine::Loop::SendBranch(Session& b) {
  auto parent = sessions_.find({b.stream, b.id});
  if (parent == sessions_.end() || parent->second.final_len != b.branch_from) return;
  parent->second.branch_paths.emplace_back(b.tokens.begin() + b.branch_from,
                                           b.tokens.begin() + b.final_len);
  ++stats_.branches;
  Send(b.stream,
       DraftChain{.session = b.id,
                  .from = b.branch_from,
                  .tokens = std::vector<int32_t>(b.tokens.begin() + b.branch_from, b.tokens.end()),
                  .branch = true});
}

void DraftEngine::Loop::DropBranches(uint64_t stream, uint64_t session) {
  auto it = branches_.lower_bound({stream, session, 0});
  while (it != branches_.end() && std::get<0>(it->first) == stream &&
         std::get<1>(it->first) == session) {
    if (it->second.resident) kv_.RemoveSequence(it->second.seq);
    it = branches_.erase(it);
  }
}

// An advance whose tokens took the path of a branch sent for this chain: the verifier had its
// next drafts ready.
void DraftEngine::Loop::CountBranchHit(Session& s, std::span<const int32_t> append) {
  for (const std::vector<int32_t>& path : s.branch_paths) {
    if (append.size() >= path.size() && std::equal(path.begin(), path.end(), append.begin())) {
      ++stats_.branch_hits;
      break;
    }
  }
  s.branch_paths.clear();
  s.branched = false;
}

// The sessions' extends within the step's token budget, each with its KV reserved. A session
// that finds no room even after evictions waits; it goes first next step.
std::vector<DraftEngine::Loop::ArPlanned> DraftEngine::Loop::PlanAr(
    const std::vector<Session*>& candidates) {
  std::vector<ArPlanned> planned;
  int budget = options_.max_batch_tokens;
  for (Session* s : candidates) {
    if (budget <= 0) break;
    const int size = static_cast<int>(s->tokens.size());
    if (s->resident && s->cached >= size) {
      // The logits after the last token come from feeding it: give it back.
      TruncateKv(*s, size - 1);
    }
    if (!s->resident) {
      s->seq = next_seq_++;
      (void)kv_.AddSequence(s->seq);  // ids are fresh
      s->resident = true;
      // Another session's KV of the same tokens, or its own from before an eviction; the last
      // token is always fed (its logits are the next draft).
      s->cached = kv_.AttachPrefix(s->seq, std::span<const int32_t>(s->tokens).first(size - 1),
                                   kPrefixSalt);
    }
    const int n = std::min(size - s->cached, budget);
    // Mask drafts ride on the forward that feeds the session's last token.
    const int masks = s->cached + n == size ? MaskRows(size) : 0;
    bool room = kv_.Reserve(s->seq, n + masks).has_value();
    s->in_batch = true;  // not a victim for its own room
    while (!room && EvictOne()) room = kv_.Reserve(s->seq, n + masks).has_value();
    if (!room) {
      s->in_batch = false;
      continue;
    }
    planned.push_back(PlanExtend(*s, n, masks));
    budget -= n + masks;
  }
  return planned;
}

int DraftEngine::Loop::MaskRows(int size) const {
  if (options_.mask_drafts < 2) return 0;
  const int masks = std::min(options_.mask_drafts, max_len_ - size);
  return masks >= 2 ? masks : 0;
}

// The session's next n tokens, causal; with masks, the <|mask|> rows after them, which see
// every fed token and each other (the block-diffusion layout of NLD's linear self-speculation).
DraftEngine::Loop::ArPlanned DraftEngine::Loop::PlanExtend(Session& s, int n, int masks) const {
  ArPlanned p{.s = &s, .n = n};
  p.tokens.assign(s.tokens.begin() + s.cached, s.tokens.begin() + s.cached + n);
  p.tokens.insert(p.tokens.end(), masks, *model_->config().diffusion.mask_token_id);
  const int total = n + masks;
  p.positions.resize(total);
  for (int i = 0; i < total; ++i) p.positions[i] = s.cached + i;
  p.outputs.push_back(n - 1);
  if (masks == 0) return p;
  p.visible = Visibility::Explicit(total);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) p.visible.Allow(i, j);
  }
  for (int i = n; i < total; ++i) {
    for (int j = 0; j < total; ++j) p.visible.Allow(i, j);
  }
  // The first mask sits where the last token's row already predicts: it only conditions the
  // others.
  for (int i = n + 1; i < total; ++i) p.outputs.push_back(i);
  return p;
}

// Every fed token's KV is kept; a session whose whole sequence is now cached gains the greedy
// token after it.
void DraftEngine::Loop::CommitAr(const std::vector<ArPlanned>& planned,
                                 const std::vector<ExtendOutput>& out) {
  std::vector<int32_t> keep;
  for (size_t i = 0; i < planned.size(); ++i) {
    const ArPlanned& p = planned[i];
    Session& s = *p.s;
    s.last_served = step_;
    keep.resize(p.n);
    for (int j = 0; j < p.n; ++j) keep[j] = j;
    // Cannot fail: the indices are the reserved ones, in order.
    (void)kv_.Commit(s.seq, keep);
    kv_.PublishPrefix(s.seq, s.tokens, kPrefixSalt);
    stats_.fed_tokens += p.n;
    stats_.recomputed_tokens += std::max(0, std::min(s.cached + p.n, s.evicted_cached) - s.cached);
    s.cached += p.n;
    if (s.cached != static_cast<int>(s.tokens.size())) continue;
    // One draft from each output row, in position order: the last token's greedy successor,
    // then the mask rows' (while the context has room).
    for (int r = 0; r < static_cast<int>(p.outputs.size()) && CanExtend(s); ++r) {
      s.tokens.push_back(Greedy(s, Row(out[i], r), static_cast<int>(s.tokens.size())));
      if (options_.branches > 0 && !s.is_branch) {
        // The row Greedy chose from (masked by the grammar, if any).
        s.alternatives.push_back(TopTwo(s.grammar != nullptr ? row_ : Row(out[i], r)));
      }
      ++stats_.drafted_tokens;
      if (s.is_branch) ++stats_.branch_tokens;
    }
  }
}

int32_t DraftEngine::Loop::Greedy(Session& s, std::span<const float> logits, int end) {
  if (s.grammar == nullptr) return Argmax(logits);
  // Under the grammar: the row masked after the generated tokens of [0, end).
  row_.assign(logits.begin(), logits.end());
  const std::span<const int32_t> generated = std::span<const int32_t>(s.tokens).subspan(
      static_cast<size_t>(s.prompt_len), static_cast<size_t>(end - s.prompt_len));
  if (s.grammar->MoveTo(generated, {})) s.grammar->Mask(row_);
  return Argmax(row_);
}

void DraftEngine::Loop::AccountStep(double seconds, int batch_tokens) {
  constexpr double kAlpha = 0.1;
  stats_.step_seconds_ewma =
      stats_.forwards == 1 ? seconds : (1 - kAlpha) * stats_.step_seconds_ewma + kAlpha * seconds;
  stats_.batch_tokens_ewma = stats_.forwards == 1
                                 ? batch_tokens
                                 : (1 - kAlpha) * stats_.batch_tokens_ewma + kAlpha * batch_tokens;
  if (options_.observer != nullptr) options_.observer->OnStep(seconds, batch_tokens);
}

absl::StatusOr<std::unique_ptr<DraftEngine>> DraftEngine::Create(Transformer* model,
                                                                 DraftEngineOptions options) {
  if (model == nullptr) return absl::InvalidArgumentError("the drafter engine needs a model");
  const int context = model->config().max_position_embeddings;
  if (options.kv_block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV block size must be >= 1, got ", options.kv_block_size));
  }
  if (options.dflash != nullptr) {
    if (&options.dflash->target() != model) {
      return absl::InvalidArgumentError("the DFlash drafter was loaded for another target model");
    }
    options.hidden_layers = options.dflash->config().target_layer_ids;
  } else if (options.kv_tokens < std::max(context, 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the drafter's KV cache (", options.kv_tokens,
        " tokens) must hold at least one full-context session (", context, " tokens)"));
  }
  if (options.mask_drafts != 0) {
    if (options.mask_drafts < 2 || options.mask_drafts > kMaxMaskDrafts) {
      return absl::InvalidArgumentError(absl::StrCat("mask drafts must be 2..", kMaxMaskDrafts,
                                                     " tokens a forward, got ",
                                                     options.mask_drafts));
    }
    if (options.dflash != nullptr || !model->config().diffusion.mask_token_id) {
      return absl::InvalidArgumentError(
          "mask drafts need a model with a block-diffusion pathway (a <|mask|> token in its "
          "config), and no DFlash drafter");
    }
  }
  if (options.branches < 0 || options.branches > kMaxBranches) {
    return absl::InvalidArgumentError(
        absl::StrCat("branches must be 0..", kMaxBranches, " a chain, got ", options.branches));
  }
  if (options.max_sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max sessions must be >= 1, got ", options.max_sessions));
  }
  if (options.max_batch_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max batch tokens must be >= 1, got ", options.max_batch_tokens));
  }
  for (size_t i = 0; i < options.hidden_layers.size(); ++i) {
    const int32_t layer = options.hidden_layers[i];
    if (layer < 0 || std::find(options.hidden_layers.begin(), options.hidden_layers.begin() + i,
                               layer) != options.hidden_layers.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hidden layers must be distinct target layer numbers >= 0, got ", layer, " at ", i));
    }
  }
  return std::unique_ptr<DraftEngine>(new DraftEngine(model, options));
}

DraftEngine::DraftEngine(Transformer* model, DraftEngineOptions options)
    : model_(model),
      options_(options),
      mailbox_(std::make_unique<ActorMailbox<Message>>()),
      loop_(std::make_unique<Loop>(model, options, &stats_)) {
  thread_ = std::thread([this] {
    std::vector<Message> messages;
    while (true) {
      messages.clear();
      if (!mailbox_->Drain(&messages, /*wait=*/!loop_->HasWork())) break;
      for (Message& m : messages) loop_->Handle(std::move(m));
      loop_->Step();
      stats_.Publish(loop_->Stats());
    }
  });
}

DraftEngine::~DraftEngine() {
  mailbox_->Close();
  thread_.join();
}

void DraftEngine::Post(Message message) { mailbox_->Post(std::move(message)); }

uint64_t DraftEngine::AddStream(ChainSink sink) {
  const uint64_t id = next_stream_.fetch_add(1);
  Post(Message{.kind = Message::Kind::kAddStream, .stream = id, .sink = std::move(sink)});
  return id;
}

void DraftEngine::RemoveStream(uint64_t stream) {
  Post(Message{.kind = Message::Kind::kRemoveStream, .stream = stream});
}

void DraftEngine::Open(uint64_t stream, uint64_t session, std::vector<int32_t> tokens, int gamma,
                       HiddenRows hidden, int block_size,
                       std::optional<DraftSessionGrammar> grammar) {
  Post(Message{.kind = Message::Kind::kOpen,
               .stream = stream,
               .session = session,
               .gamma = gamma,
               .tokens = std::move(tokens),
               .hidden = std::move(hidden),
               .block_size = block_size,
               .grammar = std::move(grammar)});
}

void DraftEngine::Advance(uint64_t stream, uint64_t session, int offset,
                          std::vector<int32_t> append, int gamma, HiddenRows hidden) {
  Post(Message{.kind = Message::Kind::kAdvance,
               .stream = stream,
               .session = session,
               .offset = offset,
               .gamma = gamma,
               .tokens = std::move(append),
               .hidden = std::move(hidden)});
}

void DraftEngine::Close(uint64_t stream, uint64_t session) {
  Post(Message{.kind = Message::Kind::kClose, .stream = stream, .session = session});
}

void DraftEngine::Reject(uint64_t stream, uint64_t session, absl::Status error) {
  Post(Message{.kind = Message::Kind::kReject,
               .stream = stream,
               .session = session,
               .error = std::move(error)});
}

DraftEngineStats DraftEngine::Stats() const { return stats_.Get(); }

}  // namespace tandem
