// `tandem-router`: the cluster's front door. Serves tandem.v1.Generation and relays each request
// to the least-loaded healthy verifier (see router_service.h).
#include <malloc.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/cleanup/cleanup.h"
#include "absl/time/time.h"
#include "router/mode_policy.h"
#include "router/registry.h"
#include "router/verifier_pool.h"
#include "services/common/metrics.h"
#include "services/common/registry_publisher.h"
#include "services/common/server.h"
#include "services/router/http_front.h"
#include "services/router/registry_watcher.h"
#include "services/router/request_decode.h"
#include "services/router/router_service.h"
#include "services/router/verifier_monitor.h"
#include "services/router/verifier_stubs.h"

namespace {

// glibc raises its mmap threshold after each large free (up to 32 MiB); request bodies of a few
// MB then come from the HTTP threads' arenas, which keep their pages: a router that had refused
// 64 bodies of 10 MB (16 at a time) held 430 MB until it exited, against 24 MB at start. A fixed
// threshold keeps every buffer of 256 KiB or more in a mapping of its own, returned to the
// system when freed (the same run ends at 27 MB). The router's small per-request objects are
// unaffected.
void ReturnLargeBuffersToTheSystem() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  ReturnLargeBuffersToTheSystem();
  CLI::App app{"tandem-router: admits generation requests and relays them to the verifiers"};
  std::vector<std::string> verifiers;
  tandem::RouterOptions options;
  tandem::ServerFlags server_flags;
  tandem::ClientFlags client_tls;
  std::string redis;
  app.add_option("--verifier", verifiers,
                 "Verifier address host:port (repeatable; --redis finds more)")
      ->envname("TANDEM_ROUTER_VERIFIERS")
      ->delimiter(',');
  app.add_option("--redis", redis,
                 "Redis HOST:PORT of the worker registry: verifiers and drafters found there join "
                 "the --verifier ones (empty = off)")
      ->envname("TANDEM_REDIS");
  app.add_option("--drafter", options.drafter,
                 "Drafter address host:port the verifiers use for `spec` (default: their own)")
      ->envname("TANDEM_ROUTER_DRAFTER");
  app.add_option("--max-queue", options.max_in_flight,
                 "Requests in flight at most; beyond, RESOURCE_EXHAUSTED")
      ->envname("TANDEM_ROUTER_MAX_QUEUE")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-migrations", options.max_migrations,
                 "Times one stream may move to another verifier when its verifier fails")
      ->envname("TANDEM_ROUTER_MAX_MIGRATIONS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--prefix-affinity", options.prefix_affinity,
                 "send a request to the verifier that last served a prompt beginning like its "
                 "own, where that prefix's KV is likely cached (on|off)")
      ->envname("TANDEM_ROUTER_PREFIX_AFFINITY")
      ->capture_default_str();
  app.add_option("--prefix-affinity-slack", options.prefix_affinity_slack,
                 "streams that verifier may carry beyond the least loaded one and still get "
                 "the request")
      ->envname("TANDEM_ROUTER_PREFIX_AFFINITY_SLACK")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bool mode_policy_on = true;
  tandem::router::ModePolicyOptions policy_options;
  app.add_option("--mode-policy", mode_policy_on,
                 "Choose the mode of 'auto' requests from the verifiers' measured cost models "
                 "(false: the verifier's default mode)")
      ->envname("TANDEM_ROUTER_MODE_POLICY")
      ->capture_default_str();
  app.add_option("--policy-margin", policy_options.margin,
                 "Relative goodput gain another mode needs to replace the current one")
      ->envname("TANDEM_ROUTER_POLICY_MARGIN")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--policy-confirm", policy_options.confirm,
                 "Consecutive decisions the gain must hold before the mode switches")
      ->envname("TANDEM_ROUTER_POLICY_CONFIRM")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  double policy_confirm_seconds = absl::ToDoubleSeconds(policy_options.confirm_time);
  app.add_option("--policy-confirm-seconds", policy_confirm_seconds,
                 "Seconds the gain must hold (from its first decision) before the mode switches")
      ->envname("TANDEM_ROUTER_POLICY_CONFIRM_SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--policy-allow-lossy", policy_options.allow_lossy,
               "Let the policy choose lossy modes (diffusion) for 'auto' requests too")
      ->envname("TANDEM_ROUTER_POLICY_ALLOW_LOSSY");
  tandem::AddServerFlags(app, &server_flags, "TANDEM_ROUTER");
  tandem::AddClientTlsFlags(app, &client_tls, "TANDEM_ROUTER");
  tandem::MetricsFlags metrics_flags;
  tandem::AddMetricsFlags(app, &metrics_flags, "TANDEM_ROUTER");
  std::string http_listen;
  std::vector<std::string> api_keys;
  app.add_option("--http-listen", http_listen,
                 "OpenAI-compatible HTTP API on host:port (port 0: chosen by the OS; empty: off)")
      ->envname("TANDEM_ROUTER_HTTP_LISTEN");
  int http_max_connections = 1024;
  app.add_option("--http-max-connections", http_max_connections,
                 "HTTP connections served at once, a thread each (streams and slow clients hold "
                 "one for their length); more wait for one to end")
      ->envname("TANDEM_ROUTER_HTTP_MAX_CONNECTIONS")
      ->check(CLI::Range(1, 65536));
  double http_request_timeout = 60;
  app.add_option("--http-request-timeout", http_request_timeout,
                 "Seconds an HTTP connection has to send each request, headers and body, from "
                 "connecting or from its previous response; then it is closed (0: no limit)")
      ->envname("TANDEM_ROUTER_HTTP_REQUEST_TIMEOUT")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--api-key", api_keys,
                 "Require 'Bearer KEY' from clients, HTTP and gRPC (repeatable; /health and "
                 "/ready stay open)")
      ->envname("TANDEM_ROUTER_API_KEYS")
      ->delimiter(',');
  std::string cluster_token_file;
  tandem::AddClusterTokenFlag(app, &cluster_token_file);
  tandem::RedisAuth redis_auth;
  tandem::AddRedisAuthFlags(app, &redis_auth);
  CLI11_PARSE(app, argc, argv);
  options.api_keys = tandem::ApiKeys(api_keys);
  absl::StatusOr<std::string> cluster_token = tandem::ReadClusterToken(cluster_token_file);
  if (!cluster_token.ok()) {
    std::fprintf(stderr, "tandem-router: --cluster-token-file: %s\n",
                 std::string(cluster_token.status().message()).c_str());
    return 1;
  }
  client_tls.token = *cluster_token;  // sent to the verifiers
  policy_options.confirm_time = absl::Seconds(policy_confirm_seconds);

  if (verifiers.empty() && redis.empty()) {
    std::fprintf(stderr,
                 "tandem-router: name verifiers with --verifier, or a registry with --redis\n");
    return 1;
  }
  tandem::router::VerifierPool pool(verifiers);
  tandem::VerifierStubs stubs(&pool, [&client_tls](const std::string& address) {
    return tandem::MakeChannel(address, client_tls);
  });
  for (size_t i = 0; i < verifiers.size(); ++i) {
    if (stubs.Get(i) == nullptr) return 1;  // the error is printed
  }
  // Before the monitor's first poll, so that registered verifiers are in it.
  tandem::router::RegistryView registry(&pool);
  std::unique_ptr<tandem::RegistryWatcher> watcher;
  if (!redis.empty()) {
    auto created = tandem::RegistryWatcher::Create(redis, &registry, absl::Seconds(1), redis_auth);
    if (!created.ok()) {
      std::fprintf(stderr, "tandem-router: %s\n", created.status().ToString().c_str());
      return 1;
    }
    watcher = *std::move(created);
    watcher->Start();
    if (options.drafter.empty()) {
      options.pick_drafter = [&registry](const std::string& model) {
        return registry.PickDrafter(model);
      };
    }
  }
  tandem::VerifierMonitor monitor(&pool, &stubs);
  // Verifiers started alongside the router may still be loading their model.
  monitor.Start(absl::Seconds(10));
  if (pool.Models().empty()) {
    std::fprintf(stderr,
                 "tandem-router: no verifier answered yet; requests get UNAVAILABLE until one "
                 "does\n");
  }

  // gRPC refuses a message over the server's limit before any handler sees it, with
  // RESOURCE_EXHAUSTED; a higher limit lets the router answer requests between its own limit
  // and this one with INVALID_ARGUMENT (request_decode.h). Beyond it, gRPC's answer stands.
  server_flags.max_receive_message_bytes = 4 * static_cast<int>(tandem::kMaxGenerateRequestBytes);
  // Outlives the service, whose calls record in it.
  tandem::ServiceMetrics metrics(tandem::MetricsRole::kRouter);
  options.metrics = &metrics;
  tandem::router::ModePolicy mode_policy(policy_options);
  if (mode_policy_on) options.mode_policy = &mode_policy;
  tandem::RouterService service(&pool, &stubs, options);
  // Scrapes run one at a time, so the hook may remember the migrations counted so far.
  metrics.SetScrapeHook(
      [&pool, &service, counted = uint64_t{0}](tandem::ServiceMetrics& m) mutable {
        m.SetQueueDepth(0);  // admitted calls go to a verifier at once or fail: none wait
        m.SetRunningSequences(service.in_flight());
        for (size_t i = 0; i < pool.size(); ++i) {
          m.SetWorkerUp(pool.address(i), "verifier", pool.Healthy(i) && !pool.Retired(i));
        }
        const uint64_t migrations = service.migrations();
        for (; counted < migrations; ++counted) m.AddMigration("verifier_failed");
      });
  // The hook reads the service and the pool: off before they go.
  absl::Cleanup hook_off = [&metrics] { metrics.SetScrapeHook(nullptr); };
  if (!metrics_flags.listen.empty()) {
    absl::StatusOr<std::string> address = metrics.Serve(metrics_flags.listen);
    if (!address.ok()) {
      std::fprintf(stderr, "tandem-router: %s\n", address.status().ToString().c_str());
      return 1;
    }
    tandem::AnnounceMetrics("tandem-router", *address);
  }
  auto server = tandem::StartServer(server_flags, {&service});
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<tandem::HttpFront> http;
  if (!http_listen.empty()) {
    tandem::HttpFrontOptions http_options{
        .listen = http_listen,
        .api_keys = options.api_keys,
        .ready =
            [&pool] {
              for (size_t i = 0; i < pool.size(); ++i) {
                if (pool.Healthy(i)) return true;
              }
              return false;
            },
        .max_connections = http_max_connections,
        .request_timeout = absl::Seconds(http_request_timeout),
        // `metrics` outlives the front.
        .on_request_timeout =
            [&metrics] { metrics.AddHttpConnectionsClosed("request_timeout", 1); },
    };
    // HTTP requests take the gRPC clients' path: the same service, in process.
    auto front = tandem::HttpFront::Start(
        std::move(http_options), server->server->InProcessChannel(grpc::ChannelArguments()));
    if (!front.ok()) {
      std::fprintf(stderr, "tandem-router: %s\n", front.status().ToString().c_str());
      return 1;
    }
    http = std::move(*front);
    // Before the "listening on" line, which tells the parent the router is ready.
    std::printf("tandem-router http on %s\n", http->address().c_str());
    std::fflush(stdout);
  }
  tandem::AnnounceListening("tandem-router", server->address);
  const int signo = tandem::WaitForShutdownSignal();
  std::fprintf(stderr, "tandem-router: signal %d, shutting down\n", signo);
  tandem::SetNotServing(*server->server);
  // In-flight streams get a few seconds to finish; then they are cancelled (upstream too).
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // The streams' handlers have returned or are returning with the calls' ends.
  if (http) http->Stop();
  monitor.Stop();
  if (watcher) watcher->Stop();
  return 0;
}
