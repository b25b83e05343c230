#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/cli/bench_chaos.h"
#include "services/cli/bench_cluster.h"
#include "services/cli/bench_engine.h"
#include "services/cli/bench_modes.h"
#include "services/cli/bench_prefix.h"
#include "services/cli/bench_serve.h"
#include "services/cli/bench_sol.h"
#include "services/cli/commands.h"
#include "worker/decoding/modes.h"
#include "worker/model/device.h"

namespace tandem::cli {

void RegisterBench(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (print a table; --json for machines)");
  bench->require_subcommand(1);
  auto engine = std::make_shared<BenchEngineArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "engine",
      "The engine on a synthetic model with random weights: batch-1 decode tokens/s and "
      "bandwidth efficiency against a copy of the same memory (host memcpy, or device-to-device "
      "copies with --device cuda), prefill GFLOP/s (against OpenBLAS sgemm on the CPU), and "
      "with --grid-batches a step-time grid over batch x extend x context");
  cmd->add_flag("--json", engine->json, "Print JSON instead of a table");
  cmd->add_option("--threads", engine->threads, "CPU threads; 0 = all cores");
  cmd->add_option("--decode-steps", engine->decode_steps, "Timed decode steps")
      ->capture_default_str();
  cmd->add_option("--prefill-tokens", engine->prefill_tokens, "Prompt length of the prefill run")
      ->capture_default_str();
  cmd->add_option("--shape", engine->shape,
                  "Synthetic model: small (Qwen3-style, 124.7M parameters at 12 layers) or "
                  "qwen3-8b (Qwen3-8B's shape: 36 layers, hidden 4096, 32/8 heads of 128, MLP "
                  "12288, vocab 151936)")
      ->check(CLI::IsMember({"small", "qwen3-8b"}))
      ->capture_default_str();
  cmd->add_option("--layers", engine->layers, "Layers of the synthetic model; 0 = the shape's")
      ->capture_default_str();
  cmd->add_option("--grid-batches", engine->grid_batches,
                  "Comma-separated batch sizes of the step-time grid; none = no grid")
      ->delimiter(',');
  cmd->add_option("--grid-extends", engine->grid_extends,
                  "Comma-separated tokens per sequence per grid step (1 = decode)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--grid-contexts", engine->grid_contexts,
                  "Comma-separated committed context lengths of the grid (KV filled with random "
                  "values, not computed)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--grid-reps", engine->grid_reps, "Timed steps per grid point (median)")
      ->capture_default_str();
  cmd->add_flag("--extend-cost", engine->extend_cost,
                "The extend-cost table: batch 1 x extends 1-32 and batch 2-16 decode at the first "
                "--grid-contexts value, --grid-reps interleaved rounds, each step over the decode "
                "step's, beside the bandwidth and compute floors");
  cmd->add_option("--device", engine->device, "Where the model runs: cpu (fp32) or cuda (bf16)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--cuda-graphs", engine->cuda_graphs,
                  "With --device cuda: replay decode steps as CUDA graphs")
      ->capture_default_str();
  cmd->add_option("--cpu-weights", engine->cpu_weights, kCpuWeightsHelp)
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->callback([engine, exit_code] { *exit_code = RunBenchEngine(*engine); });

  auto cluster = std::make_shared<BenchClusterArgs>();
  CLI::App* cluster_cmd = bench->add_subcommand(
      "cluster",
      "Speculation over the network: starts a tandem-drafter and a tandem-verifier on loopback "
      "(and, for a tri-mode target, a second drafter hosting the target with --mask-drafts: "
      "self-speculation split across two services) and compares each spec step time through "
      "them with the in-process draft and verify times (overlap), with the share of steps whose "
      "drafts were ready on arrival, next to in-process self_spec, AR through the services and "
      "the loopback RPC round trip");
  cluster_cmd->add_option("--model", cluster->model_dir,
                          "Target model; default: the bundled models/tandem-target");
  cluster_cmd->add_option("--drafter", cluster->drafter_dir,
                          "Drafter model; default: tandem-drafter next to the target when present "
                          "with the same tokenizer, else the target itself");
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
  modes_cmd->add_option("--model", modes->model_dir,
                        "Target model directory; default: the bundled target");
  modes_cmd->add_option("--drafter", modes->drafter_dir,
                        "spec: drafter model directory; default: tandem-drafter next to the "
                        "target when present with the same tokenizer (the bundled "
                        "models/tandem-drafter), else the target itself; pass the target's "
                        "directory for the self-drafting upper bound (every greedy draft is "
                        "accepted)");
  modes_cmd->add_option("--lora", modes->lora_dir,
                        "LoRA adapter directory for the model: each isd / self_spec / "
                        "self_spec_quadratic variant also runs with the adapter gated on its draft "
                        "positions (label \" +lora\")");
  modes_cmd
      ->add_option("--merge-lora", modes->merge_lora,
                   "PEFT LoRA adapter directory merged into the model's weights at load: every "
                   "variant runs the adapted model (e.g. the pcLLM adapter for jacobi)")
      ->check(CLI::ExistingDirectory);
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
  modes_cmd->add_flag("--tokens", modes->tokens,
                      "With --json: every variant's token ids per prompt (\"outputs\")");
  modes_cmd->add_option("--threads", modes->threads, "CPU threads; 0 = all cores");
  modes_cmd
      ->add_option("--device", modes->device, "Where the models run: cpu (fp32) or cuda (bf16)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  modes_cmd
      ->add_option("--cuda-graphs", modes->cuda_graphs,
                   "With --device cuda: replay decode steps as CUDA graphs")
      ->capture_default_str();
  modes_cmd->add_option("--cpu-weights", modes->cpu_weights, kCpuWeightsHelp)
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  modes_cmd->callback([modes, exit_code] { *exit_code = RunBenchModes(*modes); });

  auto sol = std::make_shared<BenchSolArgs>();
  CLI::App* sol_cmd = bench->add_subcommand(
      "sol",
      "Speed-of-light analysis of a model's diffusion pathway on held-out prompts (NLD §4): per "
      "block length, the tokens per forward that greedy acceptance and recursive dynamic "
      "compaction reach for the serial-denoising target of each block, beside the diffusion "
      "mode's confidence threshold and trained sampler (when the model has one) and their "
      "agreement with that target");
  sol_cmd->add_option("--model", sol->model_dir,
                      "Model directory with a block-diffusion pathway; default: the bundled "
                      "target");
  sol_cmd->add_option("--prompts-file", sol->prompts_file,
                      "Prompt sets; default: <model>/fixtures/bench_prompts.json");
  sol_cmd->add_option("--blocks", sol->block_sizes, "Comma-separated block lengths")
      ->delimiter(',')
      ->capture_default_str();
  sol_cmd
      ->add_option("--thresholds", sol->thresholds,
                   "Comma-separated confidence thresholds of the diffusion mode's rule")
      ->delimiter(',')
      ->capture_default_str();
  sol_cmd
      ->add_option("--sampler-thresholds", sol->sampler_thresholds,
                   "Comma-separated thresholds of the trained sampler's rule (models with a "
                   "sampler/ folder)")
      ->delimiter(',')
      ->capture_default_str();
  sol_cmd->add_option("--max-tokens", sol->max_tokens, "New tokens per prompt (whole blocks)")
      ->capture_default_str();
  sol_cmd->add_option("--prompts", sol->prompts, "Prompts per category; 0 = all")
      ->capture_default_str();
  sol_cmd->add_option("--depth", sol->depth, "Compaction recursion depth (1 = greedy checks)")
      ->capture_default_str();
  sol_cmd->add_option("--probes", sol->probes, "Compaction safety-check forwards per block")
      ->capture_default_str();
  sol_cmd->add_flag("--json", sol->json, "Print JSON instead of a table");
  sol_cmd->add_option("--threads", sol->threads, "CPU threads; 0 = all cores");
  sol_cmd->add_option("--device", sol->device, "Where the model runs: cpu (fp32) or cuda (bf16)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  sol_cmd->callback([sol, exit_code] { *exit_code = RunBenchSol(*sol); });

  auto serve = std::make_shared<BenchServeArgs>();
  CLI::App* serve_cmd = bench->add_subcommand(
      "serve",
      "A cluster under load: closed-loop clients (C concurrent greedy streams, each sending its "
      "next request when one finishes) through a router, per fixed mode and auto, per "
      "concurrency; tokens/s, requests/s, TTFT / inter-token / end-to-end p50 and p99, and "
      "auto's tokens/s against the best fixed mode's. Waits until the router knows its "
      "verifiers and warms every mode up first; runs each level in --rounds rounds (the mode "
      "order rotated each round) and reports the median per (mode, concurrency). Starts a "
      "local cluster as `tandem up` does unless --server is given; writes serve.json and "
      "serve.png to --out-dir");
  serve_cmd->add_option("--server", serve->server,
                        "A running router host:port (default: start a local cluster)");
  AddClientTlsFlags(*serve_cmd, &serve->tls, "TANDEM");
  serve_cmd->add_option("--concurrency", serve->concurrency, "Comma-separated concurrency levels")
      ->delimiter(',')
      ->capture_default_str();
  serve_cmd
      ->add_option(
          "--modes", serve->modes,
          "Comma-separated modes (auto: the router's choice; MODE@json_object or "
          "MODE@json_schema: MODE with structured output, set against MODE); default: every mode "
          "auto may choose that the model serves (ar, spec, self_spec, "
          "self_spec_quadratic, isd, jacobi), then auto")
      ->delimiter(',');
  serve_cmd
      ->add_option("--requests-per-level", serve->requests_per_level,
                   "Requests per (mode, concurrency, round), at least the concurrency; 0 = "
                   "max(16, 4 x concurrency)")
      ->capture_default_str();
  serve_cmd->add_option("--duration", serve->duration_seconds,
                        "Seconds per (mode, concurrency, round) instead of a request count");
  serve_cmd
      ->add_option("--rounds", serve->rounds,
                   "Rounds per concurrency level, each running every mode once (round k starts "
                   "with mode k, the order rotated); tokens/s per (mode, concurrency) is the "
                   "median over the rounds, and auto / best compares medians")
      ->capture_default_str();
  serve_cmd
      ->add_option("--pair-rounds", serve->pair_rounds,
                   "After each level's rounds, rounds of only auto and the fixed mode leading so "
                   "far, alternately first (ABBA), so that the criterion's two medians have the "
                   "most windows (again with a mode that leads after them); 0 = none")
      ->capture_default_str();
  serve_cmd
      ->add_option("--warmup", serve->warmup_seconds,
                   "Seconds of unrecorded closed-loop traffic per mode before measuring, half "
                   "at C = 1 and half at the first level's C (each client sends at least one "
                   "request); 0 = no warm-up")
      ->capture_default_str();
  serve_cmd->add_option("--max-tokens", serve->max_tokens, "New tokens per request")
      ->capture_default_str();
  serve_cmd->add_option(
      "--prompts-file", serve->prompts_file,
      "Prompt sets, cycled through; default: <model>/fixtures/bench_prompts.json");
  serve_cmd->add_option("--model", serve->model_dir,
                        "Target model of the local cluster (default: $TANDEM_MODEL_DIR, else the "
                        "bundled models/tandem-target)");
  serve_cmd->add_option("--drafter", serve->drafter_dir,
                        "Drafter model of the local cluster (default: as `tandem up`)");
  serve_cmd->add_option("--threads", serve->threads,
                        "CPU threads of the local verifier and drafter; 0 = their default");
  serve_cmd
      ->add_option("--device", serve->device,
                   "Where the local verifier's and drafter's models run: cpu or cuda (both "
                   "share the GPU); default: cpu")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  serve_cmd
      ->add_option("--cpu-weights", serve->cpu_weights,
                   absl::StrCat("The local verifier's and drafter's --cpu-weights. ",
                                kCpuWeightsHelp, "; default: f32"))
      ->check(CLI::IsMember({"f32", "bf16"}));
  serve_cmd
      ->add_option("--out-dir", serve->out_dir, "Where serve.json and serve.png go ('' = nowhere)")
      ->capture_default_str();
  serve_cmd
      ->add_option("--threshold", serve->threshold,
                   "auto's median tokens/s over the best fixed mode's median needed to PASS")
      ->capture_default_str();
  serve_cmd->add_flag("--json", serve->json, "Print JSON instead of a table");
  serve_cmd->callback([serve, exit_code] { *exit_code = RunBenchServe(*serve); });

  auto chaos = std::make_shared<BenchChaosArgs>();
  CLI::App* chaos_cmd = bench->add_subcommand(
      "chaos",
      "Faults under load: each scenario starts a local cluster, learns its prompts' greedy "
      "outputs, runs closed-loop greedy clients through the router and injects a fault "
      "(SIGKILL or SIGTERM a verifier of two, SIGKILL the only verifier and restart it after "
      "each outage, SIGKILL the drafter under spec, SIGKILL and restart the router, SIGKILL and "
      "restart the registry's Redis empty); prints sent, failed, wrong, median latency before, "
      "in the second after and after the fault, and the recovery time, each against its goal");
  chaos_cmd
      ->add_option("--scenarios", chaos->scenarios,
                   "Comma-separated: verifier-kill, verifier-drain, verifier-restart, "
                   "drafter-kill, drafter-control (drafter-kill without the kill), "
                   "router-restart, redis-restart")
      ->delimiter(',')
      ->capture_default_str();
  chaos_cmd
      ->add_option("--outages", chaos->outages,
                   "verifier-restart: comma-separated seconds the verifier stays down, a run each")
      ->delimiter(',')
      ->capture_default_str();
  chaos_cmd->add_option("--clients", chaos->clients, "Closed-loop clients")->capture_default_str();
  chaos_cmd->add_option("--max-tokens", chaos->max_tokens, "New tokens per request")
      ->capture_default_str();
  chaos_cmd->add_option("--before", chaos->before_seconds, "Seconds of load before the fault")
      ->capture_default_str();
  chaos_cmd
      ->add_option("--after", chaos->after_seconds,
                   "Seconds of load after the fault (verifier-restart: after the restart)")
      ->capture_default_str();
  chaos_cmd->add_option("--model", chaos->model_dir,
                        "Target model (default: $TANDEM_MODEL_DIR, else the bundled target)");
  chaos_cmd->add_option("--drafter", chaos->drafter_dir, "Drafter model (default: as `tandem up`)");
  chaos_cmd->add_option("--threads", chaos->threads,
                        "CPU threads of the verifiers and the drafter; 0 = their default");
  chaos_cmd->add_flag("--json", chaos->json, "Print JSON instead of a table");
  chaos_cmd->callback([chaos, exit_code] { *exit_code = RunBenchChaos(*chaos); });

  auto router = std::make_shared<BenchRouterArgs>();
  CLI::App* router_cmd = bench->add_subcommand(
      "router",
      "The router's cost per streamed token on loopback: the same AR greedy requests straight "
      "to the verifier and through the router, alternating, one at a time; token gaps, decode "
      "time per token, TTFT and end-to-end on both paths and their paired differences");
  router_cmd->add_option("--server", router->server,
                         "A running router host:port (default: start a local cluster)");
  router_cmd->add_option("--verifier", router->verifier,
                         "With --server: a verifier behind that router");
  AddClientTlsFlags(*router_cmd, &router->tls, "TANDEM");
  router_cmd->add_option("--requests", router->requests, "Request pairs")->capture_default_str();
  router_cmd->add_option("--max-tokens", router->max_tokens, "New tokens per request")
      ->capture_default_str();
  router_cmd->add_option("--prompts-file", router->prompts_file,
                         "Prompt sets; default: <model>/fixtures/bench_prompts.json");
  router_cmd->add_option("--model", router->model_dir,
                         "Target model of the local cluster (default: the bundled one)");
  router_cmd->add_option("--threads", router->threads,
                         "CPU threads of the local verifier and drafter; 0 = their default");
  router_cmd->add_flag("--json", router->json, "Print JSON instead of a table");
  router_cmd->callback([router, exit_code] { *exit_code = RunBenchRouter(*router); });

  auto prefix = std::make_shared<BenchPrefixArgs>();
  CLI::App* prefix_cmd = bench->add_subcommand(
      "prefix",
      "Prefix caching on a shared-prefix workload: conversations of several turns over one "
      "long system prompt, on local clusters with the prefix cache off, on, and on with the "
      "router's prefix affinity; TTFT, tokens/s and hit rates side by side");
  prefix_cmd->add_option("--model", prefix->model_dir, "Target model (default: the bundled one)");
  prefix_cmd->add_option("--threads", prefix->threads,
                         "CPU threads of each verifier; 0 = the cores split among them");
  prefix_cmd->add_option("--verifiers", prefix->verifiers, "Verifiers per cluster")
      ->capture_default_str();
  prefix_cmd->add_option("--conversations", prefix->conversations, "Conversations per round")
      ->capture_default_str();
  prefix_cmd->add_option("--turns", prefix->turns, "Turns per conversation")->capture_default_str();
  prefix_cmd->add_option("--concurrency", prefix->concurrency, "Conversations in flight")
      ->capture_default_str();
  prefix_cmd->add_option("--max-tokens", prefix->max_tokens, "New tokens per turn")
      ->capture_default_str();
  prefix_cmd->add_option("--system-bytes", prefix->system_bytes, "Length of the system prompt")
      ->capture_default_str();
  prefix_cmd->add_option("--rounds", prefix->rounds, "Rounds, configurations in alternating order")
      ->capture_default_str();
  prefix_cmd->add_option("--kv-tokens", prefix->kv_tokens,
                         "Each verifier's KV cache in tokens (a small one puts the prefix cache "
                         "under pressure); 0 = the verifiers' default");
  prefix_cmd
      ->add_option("--affinity-slack", prefix->affinity_slack,
                   "The affinity router's --prefix-affinity-slack")
      ->capture_default_str();
  prefix_cmd->add_flag("--json", prefix->json, "Print JSON instead of a table");
  prefix_cmd->callback([prefix, exit_code] { *exit_code = RunBenchPrefix(*prefix); });
}

}  // namespace tandem::cli
