// A local Tandem cluster: tandem-drafter, tandem-verifier (one or more) and tandem-router as
// separate child processes on 127.0.0.1, the verifiers pointed at the drafter and the router at
// all of them, each
// address read from the child's "listening on" line (ports chosen by the OS unless asked
// otherwise). Backs `tandem up`, `tandem bench serve` and `tandem bench router`.
//
// The children die with the LocalCluster (SIGTERM, then SIGKILL after a grace period) and with
// the thread that started it (ChildProcess): start it from a thread that lives as long as the
// cluster should.
//
// Thread-safety: a LocalCluster is driven from one thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/cli/child_process.h"

namespace tandem::cli {

struct LocalClusterOptions {
  // How messages name the command that runs the cluster, e.g. "tandem up".
  std::string who = "tandem";
  std::string model_dir;          // "" = FindModelDir: $TANDEM_MODEL_DIR, else the bundled target
  std::string drafter_model_dir;  // "" = DefaultDrafterDir(target) (locate.h)
  std::string router_listen = "127.0.0.1:0";
  std::string router_http_listen;  // the router's OpenAI-compatible API; "" = none
  std::vector<std::string> api_keys;
  bool metrics = true;  // every service serves /metrics on a port chosen by the OS
  int threads = 0;      // the verifier's and the drafter's --threads; 0 = their default
  std::string device;   // the verifier's and the drafter's --device; "" = their default (cpu)
  // The verifier's and the drafter's --cpu-weights; "" = their default (f32).
  std::string cpu_weights;
  int verifiers = 1;  // verifier processes, all behind the router
  // A Redis worker registry (HOST:PORT; "" = none): the drafter and the verifiers register
  // there (--redis), and the router finds its verifiers there only (no --verifier flags).
  std::string redis;
  // Appended to each service's command line.
  std::vector<std::string> drafter_flags;
  std::vector<std::string> verifier_flags;
  std::vector<std::string> router_flags;
  absl::Duration start_timeout = absl::Seconds(120);  // per service
  // Copy the services' stderr (and stdout after their announcements) to ours.
  bool forward_output = true;
};

class LocalCluster {
 public:
  // Starts drafter, verifier and router in that order and waits for each one's address. On
  // failure stops those already started; the error names the service and quotes its stderr.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(LocalClusterOptions options);
  ~LocalCluster();  // Stop()

  const std::string& model_dir() const { return model_dir_; }
  const std::string& drafter_model_dir() const { return drafter_model_dir_; }
  const std::string& drafter_address() const { return drafter_address_; }
  // The first verifier's; verifier_addresses() has every one.
  const std::string& verifier_address() const { return verifier_addresses_.front(); }
  const std::vector<std::string>& verifier_addresses() const { return verifier_addresses_; }
  const std::string& router_address() const { return router_address_; }
  // Drafter, verifier, router, in start order.
  const std::vector<std::unique_ptr<ChildProcess>>& children() const { return children_; }

  // Stops the services in reverse order of start (the router first, so that nothing new
  // reaches a stopping verifier; the drafter last): SIGTERM, then SIGKILL after 20 s. True when
  // each one exited cleanly (status 0, or ended by the SIGTERM); problems are printed to stderr.
  // Services that already exited are skipped (their exit is the caller's to report).
  bool Stop();

  // Starts children()[index] again on the address it had, with the same command line, after
  // it exited (a fault injected by the caller: SIGKILL, say); replaces it in children(). Returns
  // once the new process listens. FailedPrecondition while the old one still runs.
  absl::Status Restart(size_t index);

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  absl::StatusOr<std::string> StartService(std::string name, std::vector<std::string> argv);

  const LocalClusterOptions options_;
  std::string model_dir_;
  std::string drafter_model_dir_;
  std::string drafter_address_;
  std::vector<std::string> verifier_addresses_;
  std::string router_address_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
  std::vector<std::vector<std::string>> argv_;  // each child's command line
  std::vector<std::string> addresses_;          // each child's announced address
};

}  // namespace tandem::cli
