// Keeps the router's RegistryView (router/registry.h) current from Redis: lists the
// `tandem:worker:*` keys (SCAN) about once a second, reads them and applies the complete listing,
// so registered verifiers join the pool and those whose key expired leave it. While Redis cannot
// be read the last view stands and requests go on; the client backs off between attempts.
//
// Thread-safety: Start/Stop from one thread (main); the watch runs on a thread of its own and has
// its own Redis connection.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/periodic_thread.h"
#include "router/registry.h"
#include "services/common/redis_client.h"

namespace tandem {

class RegistryWatcher {
 public:
  // `view` is not owned and must outlive the watcher. InvalidArgument for a malformed address.
  static absl::StatusOr<std::unique_ptr<RegistryWatcher>> Create(
      const std::string& redis, router::RegistryView* view,
      absl::Duration period = absl::Seconds(1), const RedisAuth& auth = {});
  ~RegistryWatcher();  // Stop()s

  // Reads the registry once on the calling thread, then every period on a thread of its own.
  void Start();
  void Stop();

  // One listing: the records of every worker key (malformed ones skipped). Unavailable when
  // Redis cannot be read.
  absl::StatusOr<std::vector<router::WorkerRecord>> List();

 private:
  RegistryWatcher(RedisClient::Options client, router::RegistryView* view, absl::Duration period);
  void WatchOnce();

  RedisClient client_;
  router::RegistryView* view_;
  const absl::Duration period_;
  bool reachable_ = true;  // the watching thread's: logs once per outage
  PeriodicThread thread_;
};

}  // namespace tandem
