#include <memory>

#include "absl/strings/str_join.h"
#include "services/cli/bench_cluster.h"
#include "services/cli/bench_engine.h"
#include "services/cli/bench_modes.h"
#include "services/cli/commands.h"
#include "worker/decoding/modes.h"

namespace tandem::cli {

void RegisterBench(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (print a table; --json for machines)");
  bench->require_subcommand(1);
  auto engine = std::make_shared<BenchEngineArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "engine",
      "CPU engine: batch-1 decode tokens/s and bandwidth efficiency against memcpy, prefill "
      "GFLOP/s against OpenBLAS sgemm, on a synthetic fp32 model (>= 100M parameters)");
  cmd->add_flag("--json", engine->json, "Print JSON instead of a table");
  cmd->add_option("--threads", engine->threads, "CPU threads; 0 = all cores");
  cmd->add_option("--decode-steps", engine->decode_steps, "Timed decode steps")
      ->capture_default_str();
  cmd->add_option("--prefill-tokens", engine->prefill_tokens, "Prompt length of the prefill run")
      ->capture_default_str();
  cmd->add_option("--layers", engine->layers, "Layers of the synthetic model")
      ->capture_default_str();
  cmd->callback([engine, exit_code] { *exit_code = RunBenchEngine(*engine); });

  auto cluster = std::make_shared<BenchClusterArgs>();
  CLI::App* cluster_cmd = bench->add_subcommand(
      "cluster",
      "Speculation over the network: starts a tandem-drafter and a tandem-verifier on loopback "
      "and compares the spec step time through them with the in-process draft and verify "
      "times (overlap), next to AR through the services and the loopback RPC round trip");
  cluster_cmd->add_option("--model", cluster->model_dir,
                          "Target and drafter model; default: the bundled models/tandem-target");
  cluster_cmd->add_option("--prompts-file", cluster->prompts_file,
                          "Prompt sets; default: <model>/fixtures/bench_prompts.json");
  cluster_cmd->add_option("--gamma", cluster->gamma, "Draft tokens per step")
      ->capture_default_str();
  cluster_cmd->add_option("--prompts", cluster->prompts, "Prompts per category")
      ->capture_default_str();
  cluster_cmd->add_option("--max-tokens", cluster->max_tokens, "Tokens per prompt")
      ->capture_default_str();
  cluster_cmd
      ->add_option("--threads", cluster->threads,
                   "CPU threads per process; 0 = half the cores each")
      ->capture_default_str();
  cluster_cmd
      ->add_option("--draft-timeout-ms", cluster->draft_timeout_ms,
                   "The verifier's wait for drafts before an AR step")
      ->capture_default_str();
  cluster_cmd->add_flag("--json", cluster->json, "Print JSON instead of a table");
  cluster_cmd->callback([cluster, exit_code] { *exit_code = RunBenchCluster(*cluster); });

  auto modes = std::make_shared<BenchModesArgs>();
  CLI::App* modes_cmd = bench->add_subcommand(
      "modes",
      "Decoding modes on held-out prompts of a model (greedy): tokens per target forward, "
      "acceptance length, CPU tokens/s and exact match with AR, per prompt category. Modes: " +
          absl::StrJoin(ImplementedModes(), ", "));
  modes_cmd->add_option("--model", modes->model_dir, "Target model directory")
      ->capture_default_str();
  modes_cmd->add_option("--drafter", modes->drafter_dir,
                        "spec: drafter model directory; default: the target itself (an upper "
                        "bound: every greedy draft is accepted)");
  modes_cmd->add_option("--prompts-file", modes->prompts_file,
                        "Prompt sets; default: <model>/fixtures/bench_prompts.json");
  modes_cmd
      ->add_option("--modes", modes->modes,
                   "Comma-separated mode names or variant labels (\"spec gamma=2\"); default: "
                   "all")
      ->delimiter(',');
  modes_cmd->add_option("--max-tokens", modes->max_tokens, "New tokens per prompt")
      ->capture_default_str();
  modes_cmd->add_option("--prompts", modes->prompts, "Prompts per category; 0 = all")
      ->capture_default_str();
  modes_cmd->add_flag("--json", modes->json, "Print JSON instead of a table");
  modes_cmd->add_option("--threads", modes->threads, "CPU threads; 0 = all cores");
  modes_cmd->callback([modes, exit_code] { *exit_code = RunBenchModes(*modes); });
}

}  // namespace tandem::cli
