#include "router/admission.h"

#include <algorithm>

namespace tandem::router {

AdmissionGate::AdmissionGate(int limit) : limit_(std::max(limit, 1)) {}

bool AdmissionGate::TryAdmit() {
  int current = in_flight_.load(std::memory_order_relaxed);
  while (current < limit_) {
    if (in_flight_.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel)) {
      return true;
    }
  }
  return false;
}

void AdmissionGate::Release() { in_flight_.fetch_sub(1, std::memory_order_acq_rel); }

}  // namespace tandem::router
