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
  AddRedisAuthFlags(app, &flags->auth);
}

void AddRedisAuthFlags(CLI::App& app, RedisAuth* auth) {
  app.add_option("--redis-user", auth->user, "Redis ACL user for AUTH (default: the default user)")
      ->envname("TANDEM_REDIS_USER");
  app.add_option("--redis-password-file", auth->password_file,
                 "file holding the Redis password; empty = no AUTH")
      ->envname("TANDEM_REDIS_PASSWORD_FILE");
  app.add_flag("--redis-tls", auth->tls,
               "TLS to Redis (its tls-port), verifying its certificate (on as well when any "
               "--redis-tls-* option is given)")
      ->envname("TANDEM_REDIS_TLS");
  app.add_option("--redis-tls-ca", auth->tls_ca_file,
                 "PEM file of the CAs that sign Redis' certificate (default: the system's)")
      ->envname("TANDEM_REDIS_TLS_CA");
  app.add_option("--redis-tls-cert", auth->tls_cert_file,
                 "PEM client certificate for Redis' tls-auth-clients (with --redis-tls-key)")
      ->envname("TANDEM_REDIS_TLS_CERT");
  app.add_option("--redis-tls-key", auth->tls_key_file, "PEM key of --redis-tls-cert")
      ->envname("TANDEM_REDIS_TLS_KEY");
  app.add_option("--redis-tls-server-name", auth->tls_server_name,
                 "the name Redis' certificate must carry (default: the host of --redis)")
      ->envname("TANDEM_REDIS_TLS_SERVER_NAME");
}

absl::StatusOr<std::unique_ptr<RegistryPublisher>> RegistryPublisher::Create(Options options) {
  absl::StatusOr<RedisAddress> address = ParseRedisAddress(options.redis);
  if (!address.ok()) return address.status();
  absl::StatusOr<RedisClient::Options> client = RedisClient::WithAuth(*address, options.auth);
  if (!client.ok()) return client.status();
  client->max_backoff = std::min(absl::Seconds(5), options.period);
  return std::unique_ptr<RegistryPublisher>(
      new RegistryPublisher(std::move(options), *std::move(client)));
}

RegistryPublisher::RegistryPublisher(Options options, RedisClient::Options client)
    : options_(std::move(options)), client_(std::move(client)) {}

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
