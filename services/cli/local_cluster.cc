#include "services/cli/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/cli/locate.h"
#include "worker/model/dflash.h"

namespace tandem::cli {

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(LocalClusterOptions options) {
  auto drafter_bin = FindServiceBinary("tandem-drafter", "drafter");
  auto verifier_bin = FindServiceBinary("tandem-verifier", "verifier");
  auto router_bin = FindServiceBinary("tandem-router", "router");
  auto model_dir = FindModelDir(options.model_dir);
  for (const absl::Status& status :
       {drafter_bin.status(), verifier_bin.status(), router_bin.status(), model_dir.status()}) {
    if (!status.ok()) return status;
  }
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(std::move(options)));
  const LocalClusterOptions& o = cluster->options_;
  cluster->model_dir_ = *model_dir;
  cluster->drafter_model_dir_ =
      o.drafter_model_dir.empty() ? DefaultDrafterDir(*model_dir) : o.drafter_model_dir;

  // Flags every service takes alike (the model services: `threads`, also --threads, --device,
  // --cpu-weights and the registry).
  auto common = [&o](std::vector<std::string> argv, bool threads) {
    argv.insert(argv.end(), {"--listen", "127.0.0.1:0"});
    if (o.metrics) argv.insert(argv.end(), {"--metrics-listen", "127.0.0.1:0"});
    if (threads && o.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(o.threads)});
    if (threads && !o.device.empty()) argv.insert(argv.end(), {"--device", o.device});
    if (threads && !o.cpu_weights.empty()) {
      argv.insert(argv.end(), {"--cpu-weights", o.cpu_weights});
    }
    if (threads && !o.redis.empty()) argv.insert(argv.end(), {"--redis", o.redis});
    return argv;
  };
  std::vector<std::string> drafter_argv =
      common({*drafter_bin, "--model", cluster->drafter_model_dir_}, true);
  // A DFlash drafter drafts from this target's hidden states with its embeddings and LM head.
  if (IsDFlashCheckpoint(cluster->drafter_model_dir_)) {
    drafter_argv.insert(drafter_argv.end(), {"--target-model", cluster->model_dir_});
  }
  drafter_argv.insert(drafter_argv.end(), o.drafter_flags.begin(), o.drafter_flags.end());
  auto drafter = cluster->StartService("drafter", std::move(drafter_argv));
  if (!drafter.ok()) return drafter.status();
  cluster->drafter_address_ = *drafter;

  if (o.verifiers < 1) return absl::InvalidArgumentError("a local cluster needs a verifier");
  for (int i = 0; i < o.verifiers; ++i) {
    std::vector<std::string> verifier_argv =
        common({*verifier_bin, "--model", cluster->model_dir_, "--drafter", *drafter}, true);
    verifier_argv.insert(verifier_argv.end(), o.verifier_flags.begin(), o.verifier_flags.end());
    auto verifier = cluster->StartService("verifier", std::move(verifier_argv));
    if (!verifier.ok()) return verifier.status();
    cluster->verifier_addresses_.push_back(*verifier);
  }

  std::vector<std::string> router_argv = {*router_bin, "--drafter", *drafter, "--listen",
                                          o.router_listen};
  if (o.redis.empty()) {
    for (const std::string& verifier : cluster->verifier_addresses_) {
      router_argv.insert(router_argv.end(), {"--verifier", verifier});
    }
  } else {
    router_argv.insert(router_argv.end(), {"--redis", o.redis});
  }
  if (o.metrics) router_argv.insert(router_argv.end(), {"--metrics-listen", "127.0.0.1:0"});
  if (!o.router_http_listen.empty()) {
    router_argv.insert(router_argv.end(), {"--http-listen", o.router_http_listen});
  }
  for (const std::string& key : o.api_keys) {
    router_argv.insert(router_argv.end(), {"--api-key", key});
  }
  router_argv.insert(router_argv.end(), o.router_flags.begin(), o.router_flags.end());
  auto router = cluster->StartService("router", std::move(router_argv));
  if (!router.ok()) return router.status();
  cluster->router_address_ = *router;
  return cluster;
}

absl::StatusOr<std::string> LocalCluster::StartService(std::string name,
                                                       std::vector<std::string> argv) {
  // The drafter and the verifiers share this machine's cores.
  std::vector<std::string> env;
  if (name == "drafter" || name == "verifier") env = SharedCoresEnv();
  argv_.push_back(argv);
  auto child = ChildProcess::Start({.name = std::move(name),
                                    .argv = std::move(argv),
                                    .forward_output = options_.forward_output,
                                    .default_env = std::move(env)});
  if (!child.ok()) {
    argv_.pop_back();
    Stop();
    return child.status();
  }
  children_.push_back(std::move(*child));
  absl::StatusOr<std::string> address = children_.back()->WaitForAddress(options_.start_timeout);
  addresses_.push_back(address.ok() ? *address : "");
  if (!address.ok()) Stop();
  return address;
}

absl::Status LocalCluster::Restart(size_t index) {
  if (index >= children_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no service ", index, " in the cluster"));
  }
  ChildProcess& old = *children_[index];
  if (!old.PollExit()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", old.name(), " still runs; stop it before restarting it"));
  }
  std::vector<std::string> argv = argv_[index];
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--listen") argv[i + 1] = addresses_[index];
  }
  std::vector<std::string> env;
  if (old.name() == "drafter" || old.name() == "verifier") env = SharedCoresEnv();
  auto child = ChildProcess::Start({.name = old.name(),
                                    .argv = std::move(argv),
                                    .forward_output = options_.forward_output,
                                    .default_env = std::move(env)});
  if (!child.ok()) return child.status();
  children_[index] = std::move(*child);
  absl::StatusOr<std::string> address = children_[index]->WaitForAddress(options_.start_timeout);
  return address.status();
}

LocalCluster::~LocalCluster() { Stop(); }

bool LocalCluster::Stop() {
  bool clean = true;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    ChildProcess& child = **it;
    if (child.PollExit()) continue;  // already gone (and reported by the caller)
    child.Signal(SIGTERM);
    std::optional<int> status = child.WaitForExit(absl::Seconds(20));
    if (!status) {
      std::fprintf(stderr, "%s: the %s did not stop within 20s; killing it\n", options_.who.c_str(),
                   child.name().c_str());
      child.Signal(SIGKILL);
      child.WaitForExit(absl::Seconds(5));
      clean = false;
      continue;
    }
    const bool ok = (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) ||
                    (WIFSIGNALED(*status) && WTERMSIG(*status) == SIGTERM);
    if (!ok) {
      std::fprintf(stderr, "%s: the %s %s while stopping\n", options_.who.c_str(),
                   child.name().c_str(), ChildProcess::DescribeExit(*status).c_str());
      clean = false;
    }
  }
  return clean;
}

}  // namespace tandem::cli
