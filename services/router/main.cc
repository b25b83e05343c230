// `tandem-router`: the cluster's front door. Serves tandem.v1.Generation and relays each request
// to the least-loaded healthy verifier (see router_service.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "router/verifier_pool.h"
#include "services/common/server.h"
#include "services/router/request_decode.h"
#include "services/router/router_service.h"
#include "services/router/verifier_monitor.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem-router: admits generation requests and relays them to the verifiers"};
  std::vector<std::string> verifiers;
  tandem::RouterOptions options;
  tandem::ServerFlags server_flags;
  tandem::ClientTlsFlags client_tls;
  app.add_option("--verifier", verifiers, "Verifier address host:port (repeatable)")
      ->envname("TANDEM_ROUTER_VERIFIERS")
      ->delimiter(',')
      ->required();
  app.add_option("--drafter", options.drafter,
                 "Drafter address host:port the verifiers use for `spec` (default: their own)")
      ->envname("TANDEM_ROUTER_DRAFTER");
  app.add_option("--max-queue", options.max_in_flight,
                 "Requests in flight at most; beyond, RESOURCE_EXHAUSTED")
      ->envname("TANDEM_ROUTER_MAX_QUEUE")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  tandem::AddServerFlags(app, &server_flags, "TANDEM_ROUTER");
  tandem::AddClientTlsFlags(app, &client_tls, "TANDEM_ROUTER");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<tandem::v1::Verifier::Stub>> stubs;
  std::vector<tandem::v1::Verifier::Stub*> stub_ptrs;
  for (const std::string& address : verifiers) {
    auto channel = tandem::MakeChannel(address, client_tls);
    if (!channel.ok()) {
      std::fprintf(stderr, "tandem-router: verifier %s: %s\n", address.c_str(),
                   channel.status().ToString().c_str());
      return 1;
    }
    channels.push_back(*channel);
    stubs.push_back(tandem::v1::Verifier::NewStub(*channel));
    stub_ptrs.push_back(stubs.back().get());
  }
  tandem::router::VerifierPool pool(verifiers);
  tandem::VerifierMonitor monitor(&pool, stub_ptrs);
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
  tandem::RouterService service(&pool, stub_ptrs, options);
  auto server = tandem::StartServer(server_flags, {&service});
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  tandem::AnnounceListening("tandem-router", server->address);
  const int signo = tandem::WaitForShutdownSignal();
  std::fprintf(stderr, "tandem-router: signal %d, shutting down\n", signo);
  tandem::SetNotServing(*server->server);
  // In-flight streams get a few seconds to finish; then they are cancelled (upstream too).
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  monitor.Stop();
  return 0;
}
