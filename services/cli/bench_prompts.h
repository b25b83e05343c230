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

}  // namespace tandem::cli
