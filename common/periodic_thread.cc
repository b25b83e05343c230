#include "common/periodic_thread.h"

#include <cassert>
#include <utility>

namespace tandem {

void PeriodicThread::Start(absl::Duration period, std::function<void()> task) {
  assert(!running());
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this, period, task = std::move(task)] { Loop(period, task); });
}

void PeriodicThread::Stop() {
  if (!running()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PeriodicThread::Loop(absl::Duration period, const std::function<void()>& task) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) return;
    }
    task();
  }
}

}  // namespace tandem
