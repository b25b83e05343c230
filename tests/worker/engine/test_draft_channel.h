// An in-process DraftChannel for engine tests: greedy AR drafting with InProcessArDrafter (one
// per session, on a model of the test's choice), or block drafts with DiffusionDrafter for a
// session opened with a block size when the model has a <|mask|> token, on a thread of its own, so
// chains reach the engine asynchronously like a remote drafter's. It can be told to fail after some
// chains: by erroring every session, or by falling silent; and it can be slow (each chain sent a
// set delay after it was asked for), or send tokens shifted by a set amount (a drafter for another
// vocabulary, or a faulty one). It can ask for hidden-state layers and keeps every
// session's tokens and hidden rows (after Close too) for inspection.
//
// Thread-safe: the engine calls Open/Advance/Close from its thread while the drafting thread
// answers.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "worker/decoding/diffusion_drafter.h"
#include "worker/decoding/drafter.h"
#include "worker/engine/draft_channel.h"

namespace tandem::testing {

class InProcessDraftChannel : public DraftChannel {
 public:
  // After `chains_before_failure` chains: kError breaks the channel (error chains, unhealthy),
  // kSilent sends nothing more, kUnreachable sends nothing more and says it is not connected.
  enum class Failure { kNone, kError, kSilent, kUnreachable };

  // What a session received: its tokens (prompt + appended) and its hidden rows in order.
  struct Received {
    std::vector<int32_t> tokens;
    std::vector<HiddenRows> hidden;
  };

  InProcessDraftChannel(Transformer* model, int capacity, ChainCallback on_chain,
                        Failure failure = Failure::kNone, int chains_before_failure = 0,
                        std::vector<int32_t> hidden_layers = {})
      : model_(model),
        capacity_(capacity),
        on_chain_(std::move(on_chain)),
        failure_(failure),
        hidden_layers_(std::move(hidden_layers)),
        chains_left_(chains_before_failure) {
    thread_ = std::thread([this] { Run(); });
  }

  ~InProcessDraftChannel() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  using DraftChannel::Advance;
  using DraftChannel::Open;

  // Drafts free text whatever the grammar (drafts only change speed).
  absl::Status Open(uint64_t session, std::span<const int32_t> tokens, int gamma,
                    const HiddenRows& hidden, int block_size,
                    const std::optional<DraftGrammar>& /*grammar*/) override {
    absl::MutexLock lock(&mu_);
    if (broken_) return absl::UnavailableError("test drafter is down");
    Received& r = received_[session];
    r.tokens.assign(tokens.begin(), tokens.end());
    if (!hidden.empty()) r.hidden.push_back(hidden);
    Session& s = sessions_[session];
    s.tokens.assign(tokens.begin(), tokens.end());
    s.gamma = gamma;
    s.block_size = 0;
    if (block_size > 0 && model_->config().diffusion.mask_token_id) {
      s.block_size = block_size;
      s.drafter = std::make_shared<DiffusionDrafter>(
          model_, *model_->config().diffusion.mask_token_id, capacity_);
    } else {
      s.drafter = std::make_shared<InProcessArDrafter>(model_, capacity_);
    }
    dirty_.insert(session);
    return absl::OkStatus();
  }

  absl::Status Advance(uint64_t session, int offset, std::span<const int32_t> append, int gamma,
                       const HiddenRows& hidden) override {
    absl::MutexLock lock(&mu_);
    if (broken_) return absl::UnavailableError("test drafter is down");
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return absl::OkStatus();
    Received& r = received_[session];
    r.tokens.resize(offset);
    r.tokens.insert(r.tokens.end(), append.begin(), append.end());
    if (!hidden.empty()) r.hidden.push_back(hidden);
    // Rows alone (a prefill slice) change nothing to draft from.
    if (append.empty() && gamma == it->second.gamma) return absl::OkStatus();
    it->second.tokens.resize(offset);
    it->second.tokens.insert(it->second.tokens.end(), append.begin(), append.end());
    it->second.gamma = gamma;
    dirty_.insert(session);
    return absl::OkStatus();
  }

  void Close(uint64_t session) override {
    absl::MutexLock lock(&mu_);
    sessions_.erase(session);
    dirty_.erase(session);
  }

  bool healthy() const override {
    absl::MutexLock lock(&mu_);
    return !broken_;
  }

  bool connected() const override {
    absl::MutexLock lock(&mu_);
    return !(failure_ == Failure::kUnreachable && chains_left_ <= 0);
  }

  std::vector<int32_t> hidden_layers() const override { return hidden_layers_; }

  // Every chain from now on is sent `delay` after its draft was made (a slow drafter).
  void set_delay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

  // Every drafted token from now on is sent plus `shift`.
  void set_token_shift(int32_t shift) {
    absl::MutexLock lock(&mu_);
    token_shift_ = shift;
  }

  int chains_sent() const {
    absl::MutexLock lock(&mu_);
    return chains_sent_;
  }

  std::map<uint64_t, Received> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }

 private:
  struct Session {
    std::vector<int32_t> tokens;
    int gamma = 0;
    int block_size = 0;  // > 0: block drafts
    std::shared_ptr<Drafter> drafter;
  };

  void Run() {
    while (true) {
      uint64_t session = 0;
      std::vector<int32_t> tokens;
      int gamma = 0;
      int block_size = 0;
      std::shared_ptr<Drafter> drafter;
      absl::Duration delay;
      int32_t shift = 0;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !dirty_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        session = *dirty_.begin();
        dirty_.erase(dirty_.begin());
        const Session& s = sessions_.at(session);
        tokens = s.tokens;
        gamma = s.gamma;
        block_size = s.block_size;
        drafter = s.drafter;
        delay = delay_;
        shift = token_shift_;
      }
      absl::SleepFor(delay);
      DraftChain chain{.session = session, .from = static_cast<int>(tokens.size())};
      if (block_size > 0) {
        absl::StatusOr<BlockDraft> draft = drafter->DraftBlock(
            tokens, std::vector<int32_t>(block_size, kUndecodedSlot), block_size);
        if (draft.ok()) {
          chain.tokens = std::move(draft->tokens);
          chain.slots = std::move(draft->slots);
        } else {
          chain.error = draft.status();
        }
      } else {
        absl::StatusOr<std::vector<int32_t>> drafts = drafter->Draft(tokens, gamma);
        if (drafts.ok()) {
          chain.tokens = std::move(*drafts);
        } else {
          chain.error = drafts.status();
        }
      }
      for (int32_t& token : chain.tokens) token += shift;
      std::vector<DraftChain> send;
      {
        absl::MutexLock lock(&mu_);
        if (failure_ != Failure::kNone && chains_left_ <= 0) {
          if (failure_ == Failure::kError && !broken_) {
            broken_ = true;
            for (const auto& [id, s] : sessions_) {
              send.push_back(
                  DraftChain{.session = id, .error = absl::UnavailableError("test drafter died")});
            }
          }
          // Silent (or already broken): nothing more is sent.
        } else {
          --chains_left_;
          ++chains_sent_;
          send.push_back(std::move(chain));
        }
      }
      for (DraftChain& c : send) on_chain_(std::move(c));
    }
  }

  Transformer* model_;
  int capacity_;
  ChainCallback on_chain_;
  const Failure failure_;
  const std::vector<int32_t> hidden_layers_;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> dirty_ ABSL_GUARDED_BY(mu_);  // sessions whose tokens changed
  std::map<uint64_t, Received> received_ ABSL_GUARDED_BY(mu_);
  int chains_left_ ABSL_GUARDED_BY(mu_);
  int chains_sent_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  int32_t token_shift_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tandem::testing
