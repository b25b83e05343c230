#include "services/drafter/chain_outbox.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {

ChainOutbox::Action ChainOutbox::Push(DraftChain chain) {
  absl::MutexLock lock(&mu_);
  if (closed_) return {};
  auto it = latest_.find(chain.session);
  // A branch is a message of its own: it never merges, and later chains of its session merge
  // past it into their own latest one.
  const bool mergeable = it != latest_.end() && it->second->error.ok() && !chain.branch;
  if (mergeable && !chain.error.ok()) {
    // The session ends: its queued tokens are of no use any more.
    *it->second = std::move(chain);
  } else if (mergeable && chain.slots.empty() && it->second->slots.empty() &&
             chain.from == it->second->from + static_cast<int>(it->second->tokens.size())) {
    // What the reader would make of the two chains in a row.
    it->second->tokens.insert(it->second->tokens.end(), chain.tokens.begin(), chain.tokens.end());
  } else {
    // A replacement stays a message of its own: merged into the queued chain its `from` could
    // read as an extension of what the reader already holds.
    const uint64_t session = chain.session;
    const bool branch = chain.branch;
    queue_.push_back(std::move(chain));
    if (!branch) latest_[session] = std::prev(queue_.end());
    if (queue_.size() > max_queued_) {
      closed_ = true;
      finish_status_ = absl::ResourceExhaustedError(absl::StrCat(
          "more than ", max_queued_, " draft chains are waiting for this stream's reader"));
      ClearLocked();
    }
  }
  return NextLocked();
}

ChainOutbox::Action ChainOutbox::WriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  write_in_flight_ = false;
  if (!ok && !closed_) {
    closed_ = true;
    finish_status_ = absl::CancelledError("the draft stream broke while writing");
    ClearLocked();
  }
  return NextLocked();
}

ChainOutbox::Action ChainOutbox::Close(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!closed_) {
    closed_ = true;
    finish_status_ = std::move(status);
    ClearLocked();
  }
  return NextLocked();
}

size_t ChainOutbox::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool ChainOutbox::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

ChainOutbox::Action ChainOutbox::NextLocked() {
  Action action;
  if (write_in_flight_) return action;
  if (closed_) {
    if (!finished_) {
      finished_ = true;
      action.finish = finish_status_;
    }
    return action;
  }
  if (queue_.empty()) return action;
  auto it = latest_.find(queue_.front().session);
  if (it != latest_.end() && it->second == queue_.begin()) latest_.erase(it);
  action.write = std::move(queue_.front());
  queue_.pop_front();
  write_in_flight_ = true;
  return action;
}

void ChainOutbox::ClearLocked() {
  queue_.clear();
  latest_.clear();
}

}  // namespace tandem
