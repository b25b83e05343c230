#include <memory>

#include "services/cli/bench_engine.h"
#include "services/cli/commands.h"

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
}

}  // namespace tandem::cli
