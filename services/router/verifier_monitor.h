// Keeps the router's VerifierPool current: asks every verifier for its load (GetLoad) about once a
// second, marking it up when it answers and is not draining, down otherwise, and fetches its info
// (GetInfo: model, modes, context) the first time, whenever it comes back up, and whenever its
// worker id changes (a restart behind the same address).
//
// Thread-safety: Start/Stop from one thread (main); the poll runs on a thread of its own and
// reports to the pool, which is thread-safe. The stubs are shared with the request path.
#pragma once

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/periodic_thread.h"
#include "router/verifier_pool.h"
#include "services/router/verifier_stubs.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem {

class VerifierMonitor {
 public:
  // `pool` and `stubs` (one per pool entry, same order) are not owned and must outlive the
  // monitor.
  VerifierMonitor(router::VerifierPool* pool, std::vector<v1::Verifier::Stub*> stubs,
                  absl::Duration period = absl::Seconds(1));
  // Polls every entry the pool has at each poll (it may grow), retired ones excepted. `stubs` is
  // not owned and must outlive the monitor.
  VerifierMonitor(router::VerifierPool* pool, VerifierStubs* stubs,
                  absl::Duration period = absl::Seconds(1));
  ~VerifierMonitor();  // Stop()s

  // Runs one poll on the calling thread, waiting up to `first_wait` for verifiers that are still
  // starting, then polls every period on a thread of its own.
  void Start(absl::Duration first_wait);
  void Stop();

 private:
  // Polls every verifier in parallel; each call waits up to `timeout` (and for the channel to
  // connect when `wait_for_ready`).
  void PollOnce(absl::Duration timeout, bool wait_for_ready);

  router::VerifierPool* pool_;
  std::unique_ptr<VerifierStubs> owned_stubs_;
  VerifierStubs* stubs_;
  const absl::Duration period_;
  PeriodicThread thread_;
};

}  // namespace tandem
