#include "services/common/registry_publisher.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "CLI/CLI.hpp"

namespace tandem {

void AddRegistryFlags(CLI::App& app, RegistryFlags* flags, const std::string& env_prefix) {
  app.add_option("--redis", flags->redis,
                 "Redis HOST:PORT of the worker registry; empty = do not register")
      ->envname("TANDEM_REDIS");
  app.add_option("--advertise", flags->advertise,
                 "HOST:PORT that routers and verifiers dial (default: the listen address)")
      ->envname(env_prefix + "_ADVERTISE");
}

absl::StatusOr<std::unique_ptr<RegistryPublisher>> RegistryPublisher::Create(Options options) {
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(options.redis);
  if (!address.ok()) return address.status();
  return std::unique_ptr<RegistryPublisher>(new RegistryPublisher(std::move(options), *address));
}

RegistryPublisher::RegistryPublisher(Options options, RedisAddress address)
    : options_(std::move(options)),
      client_(RedisClient::Options{.address = std::move(address),
                                   .max_backoff = std::min(absl::Seconds(5), options_.period)}) {}

RegistryPublisher::~RegistryPublisher() { Stop(); }

void RegistryPublisher::Start() {
  Publish();
  thread_.Start(options_.period, [this] { Publish(); });
}

void RegistryPublisher::Stop() {
  if (stopped_) return;
  stopped_ = true;
  thread_.Stop();
  if (!key_.empty()) (void)client_.Command({"DEL", key_});
}

void RegistryPublisher::Publish() {
  const router::WorkerRecord record = options_.snapshot();
  key_ = router::WorkerKey(record);
  absl::StatusOr<RedisReply> reply =
      client_.Command({"SET", key_, router::EncodeWorkerRecord(record), "PX",
                       std::to_string(absl::ToInt64Milliseconds(options_.ttl))});
  if (!reply.ok()) {
    if (reachable_) {
      std::fprintf(stderr, "%s: cannot register in Redis (serving on; retrying): %s\n",
                   options_.log_name.c_str(), reply.status().ToString().c_str());
    }
    reachable_ = false;
    return;
  }
  if (!reachable_) {
    std::fprintf(stderr, "%s: registered in Redis at %s again\n", options_.log_name.c_str(),
                 client_.address().c_str());
  }
  reachable_ = true;
}

}  // namespace tandem
