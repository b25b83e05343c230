// A worker's registration in the Redis registry (router/registry.h): writes its record under
// `tandem:worker:<role>:<worker_id>` with a TTL, again every period with a fresh load snapshot,
// so the key outlives the process by at most the TTL. When Redis is away the worker keeps
// serving and registers again as soon as Redis answers (the client backs off meanwhile); Stop()
// deletes the key so routers drop the worker at once.
//
// Thread-safety: Start/Stop from one thread (main); the heartbeat runs on a thread of its own and
// calls `snapshot` there (it must be thread-safe).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/periodic_thread.h"
#include "router/registry.h"
#include "services/common/redis_client.h"

namespace CLI {
class App;
}

namespace tandem {

// `--redis HOST:PORT` (env TANDEM_REDIS) and `--advertise HOST:PORT` (env <PREFIX>_ADVERTISE):
// where to register and the address others dial ("" = the listen address).
struct RegistryFlags {
  std::string redis;
  std::string advertise;
  RedisAuth auth;
};
void AddRegistryFlags(CLI::App& app, RegistryFlags* flags, const std::string& env_prefix);
// Adds --redis-user, --redis-password-file and the --redis-tls* options (env TANDEM_REDIS_USER,
// TANDEM_REDIS_PASSWORD_FILE, TANDEM_REDIS_TLS*: one set for every service); AddRegistryFlags
// includes them.
void AddRedisAuthFlags(CLI::App& app, RedisAuth* auth);

class RegistryPublisher {
 public:
  struct Options {
    std::string redis;  // HOST:PORT
    RedisAuth auth;
    absl::Duration ttl = absl::Seconds(6);
    absl::Duration period = absl::Seconds(2);
    // The record to write, load included; called at every heartbeat.
    std::function<router::WorkerRecord()> snapshot;
    std::string log_name;  // e.g. "tandem-verifier", prefixes messages
  };

  // InvalidArgument for a malformed Redis address.
  static absl::StatusOr<std::unique_ptr<RegistryPublisher>> Create(Options options);
  ~RegistryPublisher();  // Stop()s

  // Registers at once (waiting at most the client's timeout), then heartbeats on a thread.
  void Start();
  // Stops the heartbeat and deletes the key (best effort).
  void Stop();

 private:
  RegistryPublisher(Options options, RedisClient::Options client);
  void Publish();

  const Options options_;
  RedisClient client_;
  std::string key_;        // heartbeat thread only (and Stop after it ended)
  bool reachable_ = true;  // heartbeat thread only: logs once per outage
  PeriodicThread thread_;
  bool stopped_ = false;  // Stop's: the key is deleted once
};

}  // namespace tandem
