// A thread that runs a task every period until stopped: the heartbeat and polling loops of the
// services (the router's registry watcher and verifier monitor, the workers' registry
// publisher) share it, so that stopping one never waits out a period.
//
// Thread-safety: Start and Stop may be called from any thread, but not concurrently with each
// other; the task runs on the periodic thread only.
#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  ~PeriodicThread() { Stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts the thread: `task` runs one `period` after Start, then one period after each run
  // ends. Starting a running thread is a programming error (checked by an assertion).
  void Start(absl::Duration period, std::function<void()> task);
  // Wakes the thread at once and joins it; a run in progress finishes first. A no-op when not
  // running, so it may be called again (and by the destructor).
  void Stop();
  bool running() const { return thread_.joinable(); }

 private:
  void Loop(absl::Duration period, const std::function<void()>& task);

  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem
