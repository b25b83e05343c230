// The chains waiting to be written to one verifier's Draft stream, and the stream's write /
// finish state machine (one write in flight, Finish exactly once and never during a write).
//
// A chain that extends the session's last queued one merges into it (block drafts never do:
// they always replace; branches never merge and are never merged into) and an error replaces it,
// so a verifier that reads slowly receives fewer, longer chains rather than a backlog of
// single tokens; replacements (one per Open or Advance the verifier sent) stay separate. Past
// `max_queued` entries (a reader that stopped reading, or a flood of bad messages) the stream is
// finished with RESOURCE_EXHAUSTED.
//
// Thread-safety: all methods may be called from any thread (the engine thread pushes, gRPC
// reactions complete writes and close). Each returns an Action the caller carries out outside
// the lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/engine/draft_channel.h"

namespace tandem {

class ChainOutbox {
 public:
  struct Action {
    std::optional<DraftChain> write;     // start writing this (a write is now in flight)
    std::optional<absl::Status> finish;  // finish the stream with this status (happens once)
  };

  explicit ChainOutbox(size_t max_queued) : max_queued_(max_queued) {}

  // Queues `chain` unless the stream is closing.
  Action Push(DraftChain chain);
  // The write in flight completed (`ok` false: the stream is broken).
  Action WriteDone(bool ok);
  // The stream is ending (reads ended, the call was cancelled): drops what is queued; the
  // finish follows at once or when the write in flight completes.
  Action Close(absl::Status status);

  size_t queued() const;
  bool closed() const;

 private:
  Action NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::list<DraftChain> queue_ ABSL_GUARDED_BY(mu_);
  // The latest queued entry of each session, where its next chain merges.
  std::unordered_map<uint64_t, std::list<DraftChain>::iterator> latest_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
