// `tandem bench chaos`: faults injected into a local cluster under load, with figures. Each
// scenario starts its own cluster (tandem-drafter, tandem-verifier(s), tandem-router as child
// processes on loopback, as `tandem up` does), learns every prompt's greedy output from one
// `ar` request each, then runs closed-loop clients (greedy requests, the modes rotated across
// clients) through the router while it injects the fault, and counts what the clients saw:
// requests sent, failed, wrong (an OK stream whose tokens differ from the prompt's greedy
// output; every mode used is lossless), latency before, just after and well after the fault,
// and the time to recover.
//
// Scenarios:
//   verifier-kill     two verifiers; SIGKILL one. Goal: 0 failed, 0 wrong (migration).
//   verifier-drain    two verifiers; SIGTERM one (drain). Goal: 0 failed, 0 wrong.
//   verifier-restart  one verifier; SIGKILL it, start it again on its address after each
//                     --outages value. Requests during the outage fail (UNAVAILABLE: nothing
//                     serves them); goal: the router routes to it again within 2 s of its
//                     listening, and nothing fails after that.
//   drafter-kill      one verifier, `spec` requests; SIGKILL the drafter. Goal: 0 failed, and
//                     from 1 s after the kill the median latency within 1.25x of `ar`'s
//                     (on the same cluster, before and after the spec phase, averaged).
//   drafter-control   drafter-kill's phases with nothing killed (not run by default): whether
//                     `ar` after the spec phase is slower because of the kill or of the phase.
//   router-restart    SIGKILL the router and start it again on its address at once: the
//                     streams it carried fail; goal: the clients (gRPC channels reconnecting on
//                     their own) are served again within 2 s of its listening, nothing fails
//                     after that.
//   redis-restart     two verifiers and the drafter registered in a Redis registry, the router
//                     finding its verifiers there only; SIGKILL the redis-server and start it
//                     again, empty, on its port. Goal: 0 failed, 0 wrong (the router keeps
//                     serving from the verifiers it knows; they register again).
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

struct BenchChaosArgs {
  std::vector<std::string> scenarios = {"verifier-kill", "verifier-drain", "verifier-restart",
                                        "drafter-kill",  "router-restart", "redis-restart"};
  std::vector<int> outages = {5, 30, 90};  // verifier-restart: seconds down, one run each
  int clients = 8;                         // closed-loop clients
  int max_tokens = 24;                     // new tokens per request
  double before_seconds = 3;               // load before the fault
  double after_seconds = 6;                // load after the fault (or after the restart)
  std::string model_dir;                   // the cluster's target; "" = the launcher's default
  std::string drafter_dir;                 // the cluster's drafter; "" = the launcher's default
  int threads = 0;                         // the verifiers' and drafter's --threads; 0 = theirs
  bool json = false;
};

// Runs the scenarios; prints a table (or JSON) and returns 0 when every scenario ran, 1 when a
// cluster could not start or an argument is bad. Goals missed are reported, not failures.
int RunBenchChaos(const BenchChaosArgs& args);

}  // namespace tandem::cli
