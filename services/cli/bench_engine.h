// `tandem bench engine`: how close the engine runs to the machine's limits on a synthetic model
// with random weights, measured side by side in one run. Decode (batch 1) against the copy
// bandwidth of the same memory (host memcpy on the CPU, device-to-device copies on a GPU),
// prefill against the CPU's sgemm, and on request a step-time grid over batch size x extend
// length x context length (the cost model's input: a k-token verify against a decode step).
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

struct BenchEngineArgs {
  bool json = false;
  int threads = 0;
  int decode_steps = 48;
  int prefill_tokens = 256;  // also the context of the decode steps
  // "small" (a Qwen3-style 124.7M model at 12 layers) or "qwen3-8b" (Qwen3-8B's shape).
  std::string shape = "small";
  int layers = 0;              // 0 = the shape's
  std::string device = "cpu";  // cpu or cuda
  bool cuda_graphs = true;
  std::string cpu_weights = "f32";  // f32 or bf16 (kernels/cpu/packed_gemm.h)
  // The grid (empty batches: none): every batch x extend at every context, each point the
  // median of grid_reps steps after two warm-up steps.
  std::vector<int> grid_batches;
  std::vector<int> grid_extends = {1, 2, 4, 8, 16};
  std::vector<int> grid_contexts = {512};
  int grid_reps = 5;
  // The extend-cost table (bench_engine_cost.h), at the first grid context, grid_reps rounds.
  bool extend_cost = false;
};

int RunBenchEngine(const BenchEngineArgs& args);

}  // namespace tandem::cli
