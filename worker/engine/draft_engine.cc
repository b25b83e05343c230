#include "worker/engine/draft_engine.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/engine/draft_engine_loop.h"

namespace tandem {

using draft_engine_internal::kPrefixSalt;

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
