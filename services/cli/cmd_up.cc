// `tandem up`: a local cluster of separate processes (drafter, verifier, router) on 127.0.0.1.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/cli/child_process.h"
#include "services/cli/commands.h"
#include "services/cli/local_cluster.h"
#include "services/cli/locate.h"
#include "services/common/server.h"
#include "worker/engine/draft_engine.h"
#include "worker/model/checkpoint/model_config.h"
#include "worker/model/device.h"

namespace tandem::cli {

namespace {

struct UpArgs {
  std::string listen = "127.0.0.1:8470";
  // The router's OpenAI-compatible API; "" = next to --listen (DefaultHttpListen), "off" = none.
  std::string http_listen;
  std::vector<std::string> api_keys;
  std::string model_dir;
  std::string drafter_model_dir;
  std::string device;       // the verifier's and the drafter's --device; "" = theirs (cpu)
  std::string cpu_weights;  // the verifier's and the drafter's --cpu-weights; "" = theirs (f32)
  double start_timeout_seconds = 120;
  bool self_spec_drafter = false;  // the drafter hosts the target and drafts with its masks
  std::string lora;                // the verifier's --lora (gated drafting adapter)
  std::string merge_lora;  // the verifier's --merge-lora (adapter merged into the served model)
};

// --self-spec-drafter: the drafter runs the tri-mode target itself and drafts a block of
// <|mask|> rows a forward (the target's block size), so that `spec` is NLD's linear
// self-speculation split across the drafter and the verifier.
absl::Status UseSelfSpecDrafter(const std::string& model_flag, LocalClusterOptions* options) {
  absl::StatusOr<std::string> model_dir = FindModelDir(model_flag);
  if (!model_dir.ok()) return model_dir.status();
  absl::StatusOr<ModelConfig> config = LoadModelConfig(*model_dir);
  if (!config.ok()) return config.status();
  if (!config->diffusion.mask_token_id || config->diffusion.block_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--self-spec-drafter needs a tri-mode target (a <|mask|> token and a block size of at "
        "least 2 in its config); ",
        *model_dir, " has none"));
  }
  options->drafter_model_dir = *model_dir;
  options->drafter_flags = {"--mask-drafts",
                            std::to_string(std::min(config->diffusion.block_size, kMaxMaskDrafts))};
  return absl::OkStatus();
}

// The router's HTTP address next to its gRPC one: the same host and the next port (8471 by
// default), or a port of the OS's choice when --listen asks for one, so that several clusters
// started with port 0 do not collide. "" when --listen has no port (the router says why).
std::string DefaultHttpListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port)) return "";
  return absl::StrCat(listen.substr(0, colon + 1), port == 0 ? 0 : port + 1);
}

int RunUp(const UpArgs& args) {
  // Signals are taken synchronously (sigtimedwait) by the loop below; children unblock them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string http_listen =
      args.http_listen.empty() ? DefaultHttpListen(args.listen) : args.http_listen;
  LocalClusterOptions options{
      .who = "tandem up",
      .model_dir = args.model_dir,
      .drafter_model_dir = args.drafter_model_dir,
      .router_listen = args.listen,
      .router_http_listen = http_listen == "off" ? "" : http_listen,
      .api_keys = args.api_keys,
      .device = args.device,
      .cpu_weights = args.cpu_weights,
      .start_timeout = absl::Seconds(args.start_timeout_seconds),
  };
  if (!args.lora.empty()) {
    options.verifier_flags.insert(options.verifier_flags.end(), {"--lora", args.lora});
  }
  if (!args.merge_lora.empty()) {
    options.verifier_flags.insert(options.verifier_flags.end(), {"--merge-lora", args.merge_lora});
  }
  if (args.self_spec_drafter) {
    if (absl::Status used = UseSelfSpecDrafter(args.model_dir, &options); !used.ok()) {
      std::fprintf(stderr, "tandem up: %s\n", std::string(used.message()).c_str());
      return 1;
    }
    // The drafter then hosts the verifier's model, adapter merged alike.
    if (!args.merge_lora.empty()) {
      options.drafter_flags.insert(options.drafter_flags.end(), {"--merge-lora", args.merge_lora});
    }
  }
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(std::move(options));
  if (!cluster.ok()) {
    std::fprintf(stderr, "tandem up: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  const LocalCluster& up = **cluster;
  const auto& children = up.children();
  std::printf("tandem up: drafter  %s (pid %d, model %s)\n", up.drafter_address().c_str(),
              static_cast<int>(children[0]->pid()), up.drafter_model_dir().c_str());
  std::printf("tandem up: verifier %s (pid %d, model %s)\n", up.verifier_address().c_str(),
              static_cast<int>(children[1]->pid()), up.model_dir().c_str());
  std::printf("tandem up: router   %s (pid %d): tandem.v1.Generation\n",
              up.router_address().c_str(), static_cast<int>(children[2]->pid()));
  for (const auto& child : children) {
    // Prometheus text format; the address comes from the child's "metrics on" line.
    std::printf("tandem up: metrics  http://%s/metrics (%s)\n",
                child->MetricsAddress().value_or("?").c_str(), child->name().c_str());
  }
  if (std::optional<std::string> http = children[2]->HttpAddress()) {
    std::printf("tandem up: openai   http://%s/v1 (OpenAI-compatible HTTP API)\n", http->c_str());
  }
  std::printf("tandem up: Ctrl-C stops the cluster\n");
  AnnounceListening("tandem up", up.router_address());

  for (;;) {
    const timespec one_second = {1, 0};
    siginfo_t info;
    const int signo = sigtimedwait(&signals, &info, &one_second);
    if (signo == SIGINT || signo == SIGTERM) {
      std::fprintf(stderr, "tandem up: stopping the cluster\n");
      return (*cluster)->Stop() ? 0 : 1;
    }
    for (const auto& child : children) {
      if (std::optional<int> status = child->PollExit()) {
        std::fprintf(stderr, "tandem up: the %s (pid %d) %s; stopping the cluster\n",
                     child->name().c_str(), static_cast<int>(child->pid()),
                     ChildProcess::DescribeExit(*status).c_str());
        (*cluster)->Stop();
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
  cmd->add_option("--http-listen", args->http_listen,
                  "Router's OpenAI-compatible HTTP API host:port (default: --listen's host and "
                  "next port, 127.0.0.1:8471; port 0 when --listen's is 0; 'off': none)");
  cmd->add_option("--api-key", args->api_keys,
                  "API key clients must send as 'Bearer KEY' (repeatable; default: none needed)");
  cmd->add_option("--model", args->model_dir,
                  "Target model directory (default: $TANDEM_MODEL_DIR, else the bundled "
                  "models/tandem-target)");
  cmd->add_option("--drafter-model", args->drafter_model_dir,
                  "Drafter model directory (default: tandem-drafter next to the target when "
                  "present with the same tokenizer, e.g. the bundled models/tandem-drafter; "
                  "else the target itself); a DFlash drafter (models/tandem-dflash) gets the "
                  "target as its --target-model");
  cmd->add_flag("--self-spec-drafter", args->self_spec_drafter,
                "The drafter hosts the tri-mode target itself and drafts a block of <|mask|> rows "
                "a forward (NLD linear self-speculation split across two services: `spec` "
                "requests verify its drafts with the target's AR pathway)")
      ->excludes("--drafter-model");
  cmd->add_option("--device", args->device,
                  "Where the verifier's and the drafter's models run: cpu (fp32) or cuda (bf16 "
                  "GPU; both share the GPU); default: cpu")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--cpu-weights", args->cpu_weights,
                  absl::StrCat("The verifier's and the drafter's --cpu-weights. ", kCpuWeightsHelp,
                               "; default: f32"))
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--lora", args->lora,
                  "The verifier's --lora: a PEFT LoRA adapter that isd, self_spec and "
                  "self_spec_quadratic run on their draft (<|mask|>) rows only (lossless)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--merge-lora", args->merge_lora,
                  "The verifier's --merge-lora: a PEFT LoRA adapter merged into the served "
                  "model's weights (e.g. the pcLLM adapter, which jacobi decodes in fewer "
                  "forwards); with --self-spec-drafter the drafter's too")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--start-timeout", args->start_timeout_seconds,
                  "Seconds each service may take to start")
      ->capture_default_str();
  cmd->callback([args, exit_code] { *exit_code = RunUp(*args); });
}

}  // namespace tandem::cli
