// Held-out prompt sets of the benchmarks (<model>/fixtures/bench_prompts.json, written by
// tools/bench/make_bench_prompts.py): prompts to continue, grouped by category (code, prose).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

struct Prompt {
  std::string category;
  std::string source;
  std::string text;
};

// The first `per_category` prompts of each category (0 = all).
absl::StatusOr<std::vector<Prompt>> LoadPrompts(const std::string& path, int per_category);

// LoadPrompts of `prompts_file`, or where it is "" of <model>/fixtures/bench_prompts.json with
// the model directory found from `model_dir_flag` as FindModelDir (locate.h) finds it.
absl::StatusOr<std::vector<Prompt>> LoadBenchPrompts(const std::string& model_dir_flag,
                                                     const std::string& prompts_file,
                                                     int per_category);

}  // namespace tandem::cli
