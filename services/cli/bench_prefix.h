// `tandem bench prefix`: a shared-prefix workload against local clusters that differ only in
// prefix caching. Conversations of several turns over one long common system prompt, each turn
// resending the whole history; the same workload, round by round in alternating order, on a
// cluster with the verifiers' prefix cache off, on (router balancing by load alone) and on with
// the router's prefix affinity (with two or more verifiers). Reports per configuration TTFT
// p50/p99, completion tokens/s, the prefix-cache hit rate from the responses' usage next to the
// workload's own sharing (what an unbounded cache on one verifier could take, counted with the
// model's tokenizer), and whether every completion equals the cache-off one.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::cli {

struct BenchPrefixArgs {
  std::string model_dir;  // "" = the bundled target
  int threads = 0;        // each verifier's --threads; 0 = the cores / verifiers
  int verifiers = 2;
  int conversations = 8;  // per round
  int turns = 4;
  int concurrency = 4;     // conversations in flight
  int max_tokens = 24;     // per turn
  int system_bytes = 800;  // about 240 tokens: four turns fit the bundled 512-token context
  int rounds = 2;
  int affinity_slack = 2;  // the affinity router's --prefix-affinity-slack
  int64_t kv_tokens = 0;   // each verifier's --kv-tokens; 0 = its default (65536)
  bool json = false;
};

int RunBenchPrefix(const BenchPrefixArgs& args);

}  // namespace tandem::cli
