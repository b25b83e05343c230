// `tandem bench sol`: the speed-of-light analysis of a model's diffusion pathway (NLD §4) on
// held-out prompts. Per block length, every block of a prompt's continuation is denoised
// serially (one slot per forward: the target t), then from the same all-masked block by greedy
// acceptance and recursive dynamic compaction (worker/decoding/diffusion_sol.h), whose tokens
// per forward bound what any diffusion sampler can reach; beside them the `diffusion` mode's
// confidence threshold and its trained sampler (when the model has one), with their agreement
// with t. The continuation is t itself, block after
// block, so every scheme sees the same prefixes.
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

struct BenchSolArgs {
  std::string model_dir;     // "" = FindModelDir (locate.h): the bundled target
  std::string prompts_file;  // empty = <model_dir>/fixtures/bench_prompts.json
  std::vector<int> block_sizes = {4, 8, 16, 32};
  std::vector<float> thresholds = {0.9f, 0.7f, 0.5f, 0.3f, 0.1f};
  // The trained sampler's thresholds, when the model has one (<model>/sampler/).
  std::vector<float> sampler_thresholds = {0.9f, 0.7f, 0.5f, 0.3f};
  int max_tokens = 64;  // per prompt, rounded up to whole blocks
  int prompts = 0;      // per category; 0 = all in the file
  int depth = 1;        // compaction recursion depth
  int probes = 5000;    // compaction safety-check forwards per block
  bool json = false;
  int threads = 0;
  std::string device = "cpu";
};

int RunBenchSol(const BenchSolArgs& args);

}  // namespace tandem::cli
