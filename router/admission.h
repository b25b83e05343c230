// Admission control of the router: a bound on the requests in flight, so that overload is
// answered at once (RESOURCE_EXHAUSTED, HTTP 429) instead of queueing without bound.
//
// Thread-safety: every method may be called from any thread (one atomic counter).
#pragma once

#include <atomic>

namespace tandem::router {

class AdmissionGate {
 public:
  // `limit` > 0: requests admitted and not yet released at most.
  explicit AdmissionGate(int limit);

  // True when the request is admitted; it must then be Release()d exactly once.
  bool TryAdmit();
  void Release();

  int in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  int limit() const { return limit_; }

 private:
  const int limit_;
  std::atomic<int> in_flight_{0};
};

}  // namespace tandem::router
