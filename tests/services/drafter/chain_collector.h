// Test-side receiver of draft chains: applies them as a verifier would (a chain whose `from` is
// the end of the session's current one extends it, any other replaces it) and lets a test wait
// for a session's chain to cover some indices, or for its error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/engine/draft_channel.h"

namespace tandem::testing {

class ChainCollector {
 public:
  struct View {
    bool has_chain = false;
    int from = 0;
    std::vector<int32_t> tokens;
    absl::Status error;
    int messages = 0;
    int errors = 0;
    int branches = 0;             // branch-ahead chains received
    std::vector<DraftChain> log;  // every message, in arrival order
  };

  void Add(DraftChain chain) {
    absl::MutexLock lock(&mu_);
    View& v = views_[chain.session];
    ++v.messages;
    v.log.push_back(chain);
    if (!chain.error.ok()) {
      v.error = chain.error;
      ++v.errors;
      return;
    }
    if (chain.branch) {
      ++v.branches;
      return;  // beside the chain, never part of it (the log has it)
    }
    if (v.has_chain && chain.from == v.from + static_cast<int>(v.tokens.size())) {
      v.tokens.insert(v.tokens.end(), chain.tokens.begin(), chain.tokens.end());
    } else {
      v.has_chain = true;
      v.from = chain.from;
      v.tokens = chain.tokens;
    }
  }

  DraftChannel::ChainCallback Callback() {
    return [this](DraftChain chain) { Add(std::move(chain)); };
  }

  // Tokens [from, from + n) of the session's chain once it covers them (nullopt on timeout or
  // an error).
  std::optional<std::vector<int32_t>> WaitCovered(uint64_t session, int from, int n,
                                                  absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto covered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = views_.find(session);
      if (it == views_.end()) return false;
      const View& v = it->second;
      if (!v.error.ok()) return true;
      return v.has_chain && v.from <= from &&
             v.from + static_cast<int>(v.tokens.size()) >= from + n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&covered), timeout);
    if (!covered()) return std::nullopt;
    const View& v = views_[session];
    if (!v.error.ok()) return std::nullopt;
    return std::vector<int32_t>(v.tokens.begin() + (from - v.from),
                                v.tokens.begin() + (from - v.from + n));
  }

  absl::Status WaitError(uint64_t session, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto failed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = views_.find(session);
      return it != views_.end() && !it->second.error.ok();
    };
    mu_.AwaitWithTimeout(absl::Condition(&failed), timeout);
    if (!failed()) return absl::OkStatus();
    return views_[session].error;
  }

  // Waits until the session has received `n` branch chains; false on timeout.
  bool WaitBranches(uint64_t session, int n, absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = views_.find(session);
      return it != views_.end() && it->second.branches >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  View Get(uint64_t session) {
    absl::MutexLock lock(&mu_);
    return views_[session];
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, View> views_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::testing
