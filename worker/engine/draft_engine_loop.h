// DraftEngine's insides, shared by its source files (draft_engine.cc: the steps and the API;
// draft_engine_branches.cc: branch-ahead): the mailbox messages, a drafting session and the
// loop that owns them on the engine thread. Not part of the API; include draft_engine.h.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/decoding/diffusion_drafter.h"
#include "worker/engine/branch_ahead.h"
#include "worker/engine/draft_engine.h"
#include "worker/kv/kv_cache.h"
#include "worker/sampling/sampling.h"

namespace tandem {

namespace draft_engine_internal {

// One drafter model per cache, and only causal KV of the sessions' tokens: the tokens alone
// decide the KV.
inline constexpr uint64_t kPrefixSalt = 0;

inline KvCacheOptions DraftKvOptions(const Transformer& model, const DraftEngineOptions& options) {
  // The DFlash path keeps no autoregressive KV: a one-block cache stands in.
  const bool dflash = options.dflash != nullptr;
  KvCacheOptions kv =
      model.KvOptions(dflash ? options.kv_block_size : options.kv_tokens, options.kv_block_size);
  kv.prefix_cache = options.prefix_cache && !dflash;
  return kv;
}

}  // namespace draft_engine_internal

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
        kv_(draft_engine_internal::DraftKvOptions(*model, options)),
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

}  // namespace tandem
