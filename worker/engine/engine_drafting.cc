// Engine: `spec` sequences' drafter sessions, their draft chains and the target hidden states
// sent to drafters that want them.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/engine_impl.h"

namespace tandem {

namespace {

// Every this many steps of γ = 0 an adaptive spec sequence verifies one draft.
constexpr int kAcceptanceProbeEvery = 8;
// The longest a sequence whose drafts decide its output (simsd) waits for its γ drafts (see
// WaitForChains).
constexpr absl::Duration kExactDraftWait = absl::Seconds(5);
// Draft steps in a row without a draft after which a drafter's sequences stop waiting for it:
// a silent drafter then costs three draft timeouts, not one per step.
constexpr int kLateStepsBeforeNoWait = 3;
// While other sequences can step, the longest the step waits for a missing chain, as a share of
// the mean step time: a chain that comes sooner joins the step (a fast drafter's usual case),
// a later one sits its sequence out for the step and stalls no one.
constexpr double kChainGraceOfStep = 0.25;

}  // namespace

void Engine::Impl::DisableDrafting(EngineSequence& seq, absl::Status why) {
  if (!seq.chain.enabled) return;
  seq.chain.enabled = false;
  seq.chain.error = std::move(why);
  seq.chain.tokens.clear();
  seq.chain.slots.clear();
}

void Engine::Impl::OpenSessions(const std::vector<SeqPtr>& candidates) {
  for (const SeqPtr& seq : candidates) {
    if (!seq->spec || seq->session_open || !seq->chain.enabled) continue;
    std::shared_ptr<DraftChannel>& channel = channels_[seq->drafter_address];
    if (channel == nullptr || !channel->healthy()) {
      std::weak_ptr<EngineMailbox> mailbox = mailbox_;
      absl::StatusOr<std::unique_ptr<DraftChannel>> made = drafters_(
          seq->drafter_address, [mailbox, address = seq->drafter_address](DraftChain chain) {
            if (auto box = mailbox.lock()) {
              box->Post(engine_message::Chain{.chain = std::move(chain), .drafter = address});
            }
          });
      if (!made.ok()) {
        channel = nullptr;
        DisableDrafting(*seq, made.status());
        continue;
      }
      channel = std::move(*made);
    }
    seq->channel = channel;
    seq->session_open = true;
    seq->last_advance = absl::Now();
    // Rows must start at the first token; a session opened later gets none.
    if (seq->kv_len == 0) seq->hidden_layers = channel->hidden_layers();
    const int num_layers = model_->model->config().num_layers;
    for (int32_t layer : seq->hidden_layers) {
      if (layer < 0 || layer > num_layers) {
        seq->hidden_layers.clear();
        seq->session_open = false;
        DisableDrafting(*seq, absl::InvalidArgumentError(absl::StrCat(
                                  "drafter at ", seq->drafter_address, " asks for hidden layer ",
                                  layer, " but the target has layers 0..", num_layers)));
        break;
      }
    }
    if (!seq->session_open) continue;
    absl::Status opened = channel->Open(
        seq->id, seq->tokens, seq->gamma, HiddenRows{}, seq->block_size,
        seq->grammar_spec.has_value()
            ? std::optional<DraftGrammar>(DraftGrammar{.spec = *seq->grammar_spec,
                                                       .prompt_len = seq->prompt_len,
                                                       .stop_tokens = seq->adjust.min_tokens_ban})
            : std::nullopt);
    if (!opened.ok()) DisableDrafting(*seq, opened);
  }
}

void Engine::Impl::ChooseGammas(const std::vector<SeqPtr>& candidates) {
  if (std::none_of(candidates.begin(), candidates.end(), [](const SeqPtr& seq) {
        return seq->spec && !seq->gamma_pinned && seq->resident;
      })) {
    return;
  }
  // The rest of the step as Step will likely plan it: prefill chunks, other modes' extends at
  // their measured size, pinned spec sequences at their γ.
  const auto load = static_cast<double>(candidates.size());
  GammaBatch batch;
  std::vector<GammaCandidate> choices;
  std::vector<EngineSequence*> adaptive;  // the sequences of `choices`, in order
  for (const SeqPtr& seq : candidates) {
    if (!seq->resident) continue;
    const int pending = static_cast<int>(seq->tokens.size()) - seq->kv_len;
    if (!ModePlansNext(*seq)) {
      batch.other_tokens += std::min(options_.prefill_chunk, pending - 1);
      continue;
    }
    if (seq->spec && !seq->gamma_pinned) {
      choices.push_back(
          GammaCandidate{.max_gamma = seq->gamma, .acceptance = seq->acceptance.value()});
      adaptive.push_back(seq.get());
      batch.candidate_tokens += std::max(1, pending);
      continue;
    }
    if (seq->spec) {
      batch.other_tokens += std::max(1, pending) + seq->gamma;
      batch.other_gain += ExpectedTokens(seq->acceptance.value(), seq->gamma);
      continue;
    }
    const std::optional<ModeLoadPoint> point = cost_.ModeAt(seq->mode_name, load);
    batch.other_tokens += point ? std::max<double>(point->extend_tokens, pending) : pending;
    batch.other_gain += point ? point->tokens_per_step : 1.0;
  }
  const std::vector<int> gammas = tandem::ChooseGammas(choices, batch, cost_);
  for (size_t i = 0; i < adaptive.size(); ++i) {
    EngineSequence& seq = *adaptive[i];
    seq.step_gamma = gammas[i];
    // An AR step teaches nothing about acceptance: now and then one draft keeps the estimate
    // honest, so that a sequence that drafts well is not stuck in AR by a stale estimate.
    if (seq.step_gamma == 0 && seq.gamma > 0 && ++seq.undrafted_steps >= kAcceptanceProbeEvery) {
      seq.step_gamma = 1;
    }
    if (seq.step_gamma > 0) seq.undrafted_steps = 0;
  }
}

std::vector<Engine::Impl::SeqPtr> Engine::Impl::WaitForChains(
    const std::vector<SeqPtr>& candidates) {
  // Once some candidates can step, the others' chains get a short grace: a chain that comes
  // within it joins this step, a later one sits its sequence out and the rest step now. While
  // every candidate waits, the wait stalls no one: it lasts until a chain comes or is due.
  const absl::Duration grace_length = absl::Seconds(kChainGraceOfStep * step_seconds_ewma_);
  std::optional<absl::Time> grace;
  std::vector<bool> waits(candidates.size());
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time wake = absl::InfiniteFuture();
    size_t waiting = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const std::optional<absl::Time> due = ChainDue(*candidates[i], now);
      waits[i] = due.has_value();
      if (!due) continue;
      candidates[i]->chain_waited = true;
      ++waiting;
      wake = std::min(wake, *due);
    }
    if (waiting == 0 || mailbox_->closed()) return candidates;
    if (waiting < candidates.size()) {
      if (!grace) grace = now + grace_length;
      if (now >= *grace) {
        std::vector<SeqPtr> ready;
        for (size_t i = 0; i < candidates.size(); ++i) {
          if (!waits[i]) ready.push_back(candidates[i]);
        }
        return ready;
      }
      wake = std::min(wake, *grace);
    }
    mailbox_->WaitUntil(wake);
    HandleMessages(mailbox_->TakeAll());
  }
}

std::optional<absl::Time> Engine::Impl::ChainDue(EngineSequence& seq, absl::Time now) {
  if (!seq.spec || !seq.resident || !seq.session_open || !seq.chain.enabled) return std::nullopt;
  if (seq.channel != nullptr && !seq.channel->healthy()) {
    DisableDrafting(seq, absl::UnavailableError("the drafter's channel broke"));
    return std::nullopt;
  }
  // When the drafts decide the output (simsd), a late or short chain would change the decode,
  // not only its speed (a speculative step of fewer drafts, or a completion step). So such a
  // sequence waits for γ drafts (blocks are full even when the budget ends inside one) and
  // longer; a broken channel still ends the wait at once.
  const bool exact = seq.mode->drafts_decide_output();
  // A drafter that cannot be reached, or that let several steps in a row go without a draft,
  // is not waited for: its sequences take their steps without drafts (AR) at once, and draft
  // again as soon as its chains come. Modes whose drafts decide the output wait.
  if (!exact && ((seq.channel != nullptr && !seq.channel->connected()) ||
                 late_steps_[seq.drafter_address] >= kLateStepsBeforeNoWait)) {
    return std::nullopt;
  }
  const int room = context_ - static_cast<int>(seq.tokens.size());
  if (seq.step_gamma <= 0 || (!exact && seq.budget() < 2) || room <= 0 || !ModePlansNext(seq)) {
    return std::nullopt;
  }
  const int wanted = exact ? std::min(seq.gamma, room) : 1;
  if (seq.chain.Available(seq.tokens) >= wanted) return std::nullopt;
  // A drafter conditioned on hidden states (DFlash) drafts once every token but the newest has
  // its rows; while the prompt's tail is still pending no chain is coming for these tokens, so
  // the step goes ahead without one.
  if (!exact && !seq.hidden_layers.empty() &&
      static_cast<int>(seq.tokens.size()) - seq.hidden_sent > 1) {
    return std::nullopt;
  }
  const absl::Time due =
      seq.last_advance +
      (exact ? std::max(options_.draft_timeout, kExactDraftWait) : options_.draft_timeout);
  if (due <= now) return std::nullopt;
  return due;
}

// Adds the drafter's layers to the extend's taps when it may make KV final for tokens whose
// states the drafter has not had; nothing at all when the drafter wants none.
void Engine::Impl::PlanHiddenTaps(Planned& p) const {
  const EngineSequence& s = *p.seq;
  if (s.hidden_layers.empty() || !s.session_open || !s.chain.enabled) return;
  if (s.kv_len + static_cast<int>(p.plan.tokens.size()) <= s.hidden_sent) return;
  p.taps = p.plan.hidden_layers;
  for (int32_t layer : s.hidden_layers) {
    auto it = std::find(p.taps.begin(), p.taps.end(), layer);
    if (it == p.taps.end()) {
      p.taps.push_back(layer);
      it = p.taps.end() - 1;
    }
    p.drafter_taps.push_back(static_cast<int>(it - p.taps.begin()));
  }
}

// The drafter's rows (bf16) of the tokens whose KV this extend made final (`keep`, from
// sequence index `kv_before` on) and that it has not been sent yet; empty when none.
HiddenRows Engine::Impl::FinalHidden(EngineSequence& s, const Planned& p, const ExtendOutput& out,
                                     std::span<const int32_t> keep, int kv_before) {
  HiddenRows rows;
  if (p.taps.empty()) return rows;
  const int first = std::max(kv_before, s.hidden_sent);
  const int end = kv_before + static_cast<int>(keep.size());
  if (end <= first) return rows;
  const int n = static_cast<int>(p.plan.tokens.size());
  const int hidden = model_->model->config().hidden_size;
  if (out.hidden.size() != p.taps.size() * n * static_cast<size_t>(hidden)) {
    DisableDrafting(s, absl::InternalError(absl::StrCat("the forward returned ", out.hidden.size(),
                                                        " hidden values for ", p.taps.size(),
                                                        " taps of ", n, " tokens (engine bug)")));
    return rows;
  }
  rows.layers = static_cast<int>(p.drafter_taps.size());
  rows.tokens = end - first;
  rows.hidden_size = hidden;
  rows.offset = first;
  rows.bf16.resize(static_cast<size_t>(rows.layers) * rows.tokens * hidden);
  uint16_t* dst = rows.bf16.data();
  for (int tap : p.drafter_taps) {
    for (int pos = first; pos < end; ++pos) {
      const float* src =
          out.hidden.data() + (static_cast<size_t>(tap) * n + keep[pos - kv_before]) * hidden;
      for (int h = 0; h < hidden; ++h) *dst++ = FloatToBf16(src[h]);
    }
  }
  s.hidden_sent = end;
  return rows;
}

}  // namespace tandem
