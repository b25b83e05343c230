// `tandem bench cluster`: speculation over the network. Starts a tandem-drafter and a
// tandem-verifier as separate processes on loopback (and, when the target is tri-mode, a second
// drafter hosting the target with --mask-drafts γ + 1: split self-speculation, a column of its
// own beside in-process self_spec) and measures, side by side in one run:
// the in-process cost of one draft (γ drafter forwards) and one verification (a γ+1-token target
// forward), the spec step time through the services (how much of drafting hides behind
// verification: step / (draft + verify)) with the share of spec steps whose drafts were ready on
// arrival, waited for or late, the AR step time through the services, and the loopback round
// trip of one small RPC.
#pragma once

#include <string>

namespace tandem::cli {

struct BenchClusterArgs {
  std::string model_dir;     // target; empty = the bundled models/tandem-target
  std::string drafter_dir;   // empty = DefaultDrafterDir(target): the bundled tandem-drafter
  std::string prompts_file;  // empty = <model_dir>/fixtures/bench_prompts.json
  int gamma = 4;
  int prompts = 4;  // per category
  int max_tokens = 64;
  int threads = 0;  // per process; 0 = half the cores each (drafter and verifier run at once)
  int draft_timeout_ms = 50;
  bool json = false;
};

int RunBenchCluster(const BenchClusterArgs& args);

}  // namespace tandem::cli
