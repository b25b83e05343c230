// `tandem bench serve`: a cluster under load. Closed-loop clients (C streams, each sending its
// next greedy request as soon as the previous one finished) through a router, for each fixed
// decoding mode and for `auto` (the router's choice), at each concurrency level; throughput
// and latency per (mode, concurrency), and auto's throughput against the best fixed mode's.
// Modes run interleaved per level (every mode at C = 1, then every mode at C = 2, ...) so that
// the ratios compare measurements taken side by side in time, in several rounds per level with
// the mode order rotated each round; each cell reports the median over its rounds
// (bench_serve_stats.h). Nothing is measured before the router knows its verifiers and every
// mode has had a warm-up.
//
// `tandem bench router`: the router's cost per streamed token. The same AR greedy requests go
// straight to the verifier and through the router, alternately, and the client-observed token
// gaps and end-to-end times of the two paths are compared.
#pragma once

#include <string>
#include <vector>

#include "services/common/server.h"

namespace tandem::cli {

struct BenchServeArgs {
  std::string server;  // a running router's host:port; "" = start a local cluster
  ClientFlags tls;
  std::string model_dir;    // the launched cluster's target; also where the prompts come from
  std::string drafter_dir;  // the launched cluster's drafter; "" = the launcher's default
  int threads = 0;          // the launched verifier's and drafter's --threads; 0 = theirs
  std::string device;       // the launched verifier's and drafter's --device; "" = theirs (cpu)
  std::string cpu_weights;  // the launched verifier's and drafter's --cpu-weights; "" = theirs
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32, 64};
  std::vector<std::string> modes;  // "" = ar + the lossless modes served + auto
  int requests_per_level = 0;      // per window; 0 = max(16, 4 x concurrency)
  double duration_seconds = 0;     // > 0: run each window this long instead
  int rounds = 3;                  // windows (rounds) per (mode, concurrency); >= 1
  // After a level's rounds, this many more rounds of just auto and the best fixed mode so far,
  // in ABBA order (bench_serve_stats.h PairOrder), and as many again with any other fixed mode
  // that leads after them; 0 = none.
  int pair_rounds = 4;
  double warmup_seconds = 2;  // per mode before measuring; 0 = none
  int max_tokens = 64;
  std::string prompts_file;   // "" = <model>/fixtures/bench_prompts.json
  std::string out_dir = ".";  // serve.json and serve.png go here; "" = write neither
  double threshold = 0.95;    // auto's throughput / the best fixed mode's, to pass
  bool json = false;
};

int RunBenchServe(const BenchServeArgs& args);

struct BenchRouterArgs {
  std::string server;    // a running router; "" = start a local cluster
  std::string verifier;  // that router's verifier (needed with --server)
  ClientFlags tls;
  std::string model_dir;
  int threads = 0;
  int requests = 40;  // pairs (one direct, one through the router)
  int max_tokens = 64;
  std::string prompts_file;
  bool json = false;
};

int RunBenchRouter(const BenchRouterArgs& args);

}  // namespace tandem::cli
