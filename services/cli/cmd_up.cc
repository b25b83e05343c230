// `tandem up`: a local cluster of separate processes (drafter, verifier, router) on 127.0.0.1.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/cli/child_process.h"
#include "services/cli/commands.h"
#include "services/cli/locate.h"
#include "services/common/server.h"

namespace tandem::cli {

namespace {

struct UpArgs {
  std::string listen = "127.0.0.1:8470";
  std::string model_dir;
  std::string drafter_model_dir;
  double start_timeout_seconds = 120;
};

// Stops the children in reverse order of start (the router first, so that nothing new reaches
// a stopping verifier; the drafter last): SIGTERM, then SIGKILL after a grace period. True when
// each one exited cleanly (status 0, or ended by the SIGTERM).
bool StopAll(std::vector<std::unique_ptr<ChildProcess>>& children) {
  bool clean = true;
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    ChildProcess& child = **it;
    if (child.PollExit()) continue;  // already gone (and reported by the caller)
    child.Signal(SIGTERM);
    std::optional<int> status = child.WaitForExit(absl::Seconds(20));
    if (!status) {
      std::fprintf(stderr, "tandem up: the %s did not stop within 20s; killing it\n",
                   child.name().c_str());
      child.Signal(SIGKILL);
      child.WaitForExit(absl::Seconds(5));
      clean = false;
      continue;
    }
    const bool ok = (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) ||
                    (WIFSIGNALED(*status) && WTERMSIG(*status) == SIGTERM);
    if (!ok) {
      std::fprintf(stderr, "tandem up: the %s %s while stopping\n", child.name().c_str(),
                   ChildProcess::DescribeExit(*status).c_str());
      clean = false;
    }
  }
  return clean;
}

int RunUp(const UpArgs& args) {
  auto drafter_bin = FindServiceBinary("tandem-drafter", "drafter");
  auto verifier_bin = FindServiceBinary("tandem-verifier", "verifier");
  auto router_bin = FindServiceBinary("tandem-router", "router");
  auto model_dir = FindModelDir(args.model_dir);
  for (const absl::Status& status :
       {drafter_bin.status(), verifier_bin.status(), router_bin.status(), model_dir.status()}) {
    if (!status.ok()) {
      std::fprintf(stderr, "tandem up: %s\n", std::string(status.message()).c_str());
      return 1;
    }
  }
  const std::string drafter_model =
      args.drafter_model_dir.empty() ? *model_dir : args.drafter_model_dir;

  // Signals are taken synchronously (sigtimedwait) by the loop below; children unblock them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const absl::Duration start_timeout = absl::Seconds(args.start_timeout_seconds);
  std::vector<std::unique_ptr<ChildProcess>> children;
  // Starts one service and waits for its address; on failure stops those already started.
  auto start = [&](std::string name, std::vector<std::string> argv) -> absl::StatusOr<std::string> {
    auto child = ChildProcess::Start({.name = std::move(name), .argv = std::move(argv)});
    if (!child.ok()) return child.status();
    children.push_back(std::move(*child));
    return children.back()->WaitForAddress(start_timeout);
  };
  auto fail = [&](const absl::Status& status) {
    std::fprintf(stderr, "tandem up: %s\n", std::string(status.message()).c_str());
    StopAll(children);
    return 1;
  };
  auto drafter =
      start("drafter", {*drafter_bin, "--model", drafter_model, "--listen", "127.0.0.1:0"});
  if (!drafter.ok()) return fail(drafter.status());
  auto verifier = start("verifier", {*verifier_bin, "--model", *model_dir, "--drafter", *drafter,
                                     "--listen", "127.0.0.1:0"});
  if (!verifier.ok()) return fail(verifier.status());
  auto router = start("router", {*router_bin, "--verifier", *verifier, "--drafter", *drafter,
                                 "--listen", args.listen});
  if (!router.ok()) return fail(router.status());
  std::printf("tandem up: drafter  %s (pid %d, model %s)\n", drafter->c_str(),
              static_cast<int>(children[0]->pid()), drafter_model.c_str());
  std::printf("tandem up: verifier %s (pid %d, model %s)\n", verifier->c_str(),
              static_cast<int>(children[1]->pid()), model_dir->c_str());
  std::printf("tandem up: router   %s (pid %d): tandem.v1.Generation\n", router->c_str(),
              static_cast<int>(children[2]->pid()));
  std::printf("tandem up: Ctrl-C stops the cluster\n");
  AnnounceListening("tandem up", *router);

  for (;;) {
    const timespec one_second = {1, 0};
    siginfo_t info;
    const int signo = sigtimedwait(&signals, &info, &one_second);
    if (signo == SIGINT || signo == SIGTERM) {
      std::fprintf(stderr, "tandem up: stopping the cluster\n");
      return StopAll(children) ? 0 : 1;
    }
    for (auto& child : children) {
      if (std::optional<int> status = child->PollExit()) {
        std::fprintf(stderr, "tandem up: the %s (pid %d) %s; stopping the cluster\n",
                     child->name().c_str(), static_cast<int>(child->pid()),
                     ChildProcess::DescribeExit(*status).c_str());
        StopAll(children);
        return 1;
      }
    }
  }
}

}  // namespace

void RegisterUp(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<UpArgs>();
  CLI::App* cmd = app.add_subcommand(
      "up",
      "Start a local cluster on 127.0.0.1 (drafter, verifier and router as separate processes) "
      "on the bundled model and serve until SIGINT/SIGTERM");
  cmd->add_option("--listen", args->listen, "Router address host:port (port 0: chosen by the OS)")
      ->capture_default_str();
  cmd->add_option("--model", args->model_dir,
                  "Target model directory (default: $TANDEM_MODEL_DIR, else the bundled "
                  "models/tandem-target)");
  cmd->add_option("--drafter-model", args->drafter_model_dir,
                  "Drafter model directory (default: the target model)");
  cmd->add_option("--start-timeout", args->start_timeout_seconds,
                  "Seconds each service may take to start")
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunUp(*args); });
}

}  // namespace tandem::cli
