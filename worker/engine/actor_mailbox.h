// Generic cross-thread hand-offs of a worker actor (the drafter's engine uses them): an
// ActorMailbox (other threads Post typed messages, the actor's one thread drains them between
// steps) and a Published value (the actor publishes, e.g., its counters; any thread reads a
// copy).
//
// Thread-safety: every method may be called from any thread; ActorMailbox::Drain is meant for
// the owning actor's thread only (one consumer).
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

template <typename T>
class ActorMailbox {
 public:
  // Queues `message`; returns false (and drops it) once the mailbox is closed.
  bool Post(T message) {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    queue_.push_back(std::move(message));
    return true;
  }

  // Wakes the consumer for good: Drain returns false once the queue is empty.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  // Appends every queued message to `out`, in order. With `wait` and an empty queue, blocks
  // until a message arrives or the mailbox is closed. Returns false when closed and empty.
  bool Drain(std::vector<T>* out, bool wait) {
    absl::MutexLock lock(&mu_);
    if (wait) mu_.Await(absl::Condition(this, &ActorMailbox::ReadyToDrain));
    if (queue_.empty()) return !closed_;
    while (!queue_.empty()) {
      out->push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return true;
  }

 private:
  bool ReadyToDrain() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !queue_.empty();
  }

  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// A value one thread publishes and any thread reads a copy of.
template <typename T>
class Published {
 public:
  void Publish(T value) {
    absl::MutexLock lock(&mu_);
    value_ = std::move(value);
  }
  T Get() const {
    absl::MutexLock lock(&mu_);
    return value_;
  }

 private:
  mutable absl::Mutex mu_;
  T value_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace tandem
