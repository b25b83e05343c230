// Service binaries as child processes: start one, read the addresses it announces on stdout
// ("<binary> listening on HOST:PORT", services/common/server.h; "<binary> metrics on
// HOST:PORT", services/common/metrics.h), signal it, wait for it. Backs
// `tandem up` and the integration tests.
//
// A child is killed (SIGKILL) when the thread that started it exits, the parent's death
// included (PR_SET_PDEATHSIG): a crashed parent leaves no orphan service behind. Start children
// from a thread that lives as long as they should (main, or a test's thread).
//
// Thread-safety: a ChildProcess is driven from one thread. Its output is pumped by a thread of
// its own; the state they share is guarded by one mutex.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// The environment defaults (ChildProcess::Options::default_env) of model services that share
// this machine's cores with each other (a local cluster's drafter and verifiers). OpenMP's
// default lets a thread that waits at a barrier spin through its time slice; two services' teams
// on the same cores then wait out each other's slices: spec through a local cluster on 2 cores
// ran at 247 tokens/s, 1922 with waiting threads asleep (`tandem bench serve`, C = 1).
std::vector<std::string> SharedCoresEnv();

class ChildProcess {
 public:
  struct Options {
    std::string name;               // how messages call it, e.g. "verifier"
    std::vector<std::string> argv;  // argv[0] is the executable's path
    // Copy the child's stderr, and its stdout after the announcement, to ours.
    bool forward_output = true;
    // "NAME=VALUE" entries the child's environment gets when ours has no NAME (ours is inherited
    // as it is otherwise).
    std::vector<std::string> default_env;
  };

  // Starts the child. Errors name the executable (missing, not executable).
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(Options options);
  // Kills a child that still runs (SIGKILL) and reaps it.
  ~ChildProcess();

  // The address from the child's "... listening on HOST:PORT" line. Errors when the child exits
  // first or stays silent for `timeout`; both quote the end of its stderr.
  absl::StatusOr<std::string> WaitForAddress(absl::Duration timeout);
  // The address from the child's "... metrics on HOST:PORT" line (services/common/metrics.h),
  // once seen. Services print it before their "listening on" line, so after WaitForAddress it is
  // known for a child started with --metrics-listen.
  std::optional<std::string> MetricsAddress() const;
  // Likewise the router's "... http on HOST:PORT" line (its OpenAI-compatible API).
  std::optional<std::string> HttpAddress() const;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return options_.name; }
  void Signal(int signo);
  // The wait status once the child has exited (reaping it), nullopt while it runs.
  std::optional<int> PollExit();
  // Waits up to `timeout` for the child to exit; its wait status, or nullopt if it still runs.
  std::optional<int> WaitForExit(absl::Duration timeout);
  // The last few KiB the child wrote to stderr.
  std::string StderrTail() const;

  // "exited with status 1", "was killed by signal 9 (Killed)".
  static std::string DescribeExit(int wait_status);

 private:
  ChildProcess(Options options, pid_t pid, int stdout_fd, int stderr_fd);
  void Pump();  // the output thread's body

  const Options options_;
  const pid_t pid_;
  const int stdout_fd_;
  const int stderr_fd_;
  std::optional<int> exit_status_;  // set once reaped (driving thread only)
  std::thread pump_;

  mutable absl::Mutex mu_;
  std::optional<std::string> address_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> metrics_address_ ABSL_GUARDED_BY(mu_);
  std::optional<std::string> http_address_ ABSL_GUARDED_BY(mu_);
  bool output_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string stderr_tail_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
