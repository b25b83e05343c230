// A local Tandem cluster for integration tests: the real tandem-drafter, tandem-verifier and
// tandem-router binaries as child processes on 127.0.0.1 with ports chosen by the OS, and a
// Generation client. The children die with the cluster object, and with the test process if it
// crashes (ChildProcess), so no test leaves a service behind.
//
// Thread-safety: a Cluster is driven from the test's thread; Generate() may run on any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "services/cli/child_process.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::testing {

// The bundled target model.
std::string TargetModelDir();
// Starts a service binary and waits (up to 2 minutes) for the address it announces.
absl::StatusOr<std::unique_ptr<ChildProcess>> StartService(const std::string& name,
                                                           std::vector<std::string> argv,
                                                           std::string* address);
// A built binary: $TANDEM_BINARY_DIR (else the build tree this test belongs to) +
// services/<folder>/<name>.
std::string BinaryPath(const std::string& folder, const std::string& name);

struct ClusterOptions {
  bool drafter = true;       // start a tandem-drafter and point the verifier and router at it
  int router_max_queue = 0;  // 0 = the router's default
  bool metrics = false;      // every service serves /metrics on a port chosen by the OS
  std::vector<std::string> router_flags;    // appended to the router's command line
  std::vector<std::string> verifier_flags;  // appended to the verifier's command line
  // The drafter's model flags; empty = "--model <target>" (e.g. a DFlash drafter's "--model",
  // dir, "--target-model", TargetModelDir()).
  std::vector<std::string> drafter_model_flags;
  // Every service gets --cluster-token-file with this file (empty: none).
  std::string cluster_token_file;
};

class Cluster {
 public:
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options = {});

  const std::string& router_address() const { return router_address_; }
  const std::string& verifier_address() const { return verifier_address_; }
  const std::string& drafter_address() const { return drafter_address_; }
  ChildProcess* drafter() { return drafter_.get(); }
  ChildProcess* verifier() { return verifier_.get(); }
  ChildProcess* router() { return router_.get(); }
  v1::Generation::Stub& generation() { return *generation_; }

  // Starts one more router in front of this cluster's verifier; its address.
  absl::StatusOr<std::string> StartExtraRouter(std::vector<std::string> extra_flags);

 private:
  Cluster() = default;

  // Members are destroyed in reverse order: the routers are killed first, the drafter last.
  std::unique_ptr<ChildProcess> drafter_;
  std::unique_ptr<ChildProcess> verifier_;
  std::unique_ptr<ChildProcess> router_;
  std::vector<std::unique_ptr<ChildProcess>> extra_routers_;
  std::string drafter_address_;
  std::string verifier_address_;
  std::string router_address_;
  std::unique_ptr<v1::Generation::Stub> generation_;
};

// One Generate call, collected.
struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  int messages = 0;
  v1::GenerateResponse last;  // the message with finish_reason
};

// A greedy request (no sampling settings) of `prompt` in `mode`.
v1::GenerateRequest Greedy(const std::string& prompt, const std::string& mode, int max_tokens);

// Calls Generate and reads the whole stream; `on_message` sees each message as it arrives.
StreamResult Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                      absl::Duration timeout = absl::Seconds(300),
                      const std::function<void(const v1::GenerateResponse&)>& on_message = {});

std::unique_ptr<v1::Generation::Stub> GenerationStub(const std::string& address);

}  // namespace tandem::testing
