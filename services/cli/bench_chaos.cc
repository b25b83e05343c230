#include "services/cli/bench_chaos.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/bench_stream.h"
#include "services/cli/local_cluster.h"
#include "services/cli/redis_process.h"

namespace tandem::cli {
namespace {

constexpr char kWho[] = "tandem bench chaos";
constexpr absl::Duration kReadyTimeout = absl::Seconds(60);
constexpr int kPrompts = 8;
constexpr std::chrono::seconds kRequestTimeout(
    120);  // prompts cycled through (their greedy outputs are learnt first)
// A client whose request failed waits this long before its next one (a router with no verifier
// answers at once).
constexpr auto kRetryPause = std::chrono::milliseconds(100);
// Latency windows: "just after" the fault is [fault, fault + kSettleSeconds).
constexpr double kSettleSeconds = 1.0;
constexpr double kRestartGoalSeconds = 2.0;
constexpr double kDrafterLatencyGoal = 1.25;  // x ar's median

double Since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// What one request saw, times in seconds from the scenario's start.
struct Outcome {
  double start = 0, end = 0;
  bool ok = false;
  bool wrong = false;
  std::string error;
};

// Closed-loop clients through the router: client c sends prompt (c + k) % P in mode
// modes[(c + k) % M] on its k-th request, greedy, until stopped.
class Load {
 public:
  Load(v1::Generation::Stub* stub, const std::vector<std::string>* prompts,
       const std::vector<std::vector<int32_t>>* expected, std::vector<std::string> modes,
       int clients, int max_tokens, BenchClock::time_point t0)
      : stub_(stub),
        prompts_(prompts),
        expected_(expected),
        modes_(std::move(modes)),
        max_tokens_(max_tokens),
        t0_(t0) {
    for (int c = 0; c < clients; ++c) threads_.emplace_back([this, c] { Client(c); });
  }
  ~Load() { Stop(); }

  // Waits for the requests in flight to end and returns every outcome.
  std::vector<Outcome> Stop() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    absl::MutexLock lock(&mu_);
    return outcomes_;
  }

 private:
  void Client(int c) {
    for (int k = 0; !stop_; ++k) {
      const size_t i = static_cast<size_t>(c + k) % prompts_->size();
      const std::string& mode = modes_[static_cast<size_t>(c + k) % modes_.size()];
      Outcome o;
      o.start = Since(t0_);
      const TimedStream stream =
          Generate(*stub_, (*prompts_)[i], mode, max_tokens_, BenchClock::now(), kRequestTimeout);
      o.end = Since(t0_);
      o.ok = stream.ok();
      o.wrong = o.ok && stream.tokens != (*expected_)[i];
      if (!o.ok) o.error = DescribeStatus(stream.status);
      {
        absl::MutexLock lock(&mu_);
        outcomes_.push_back(std::move(o));
      }
      if (!stream.ok()) std::this_thread::sleep_for(kRetryPause);
    }
  }

  v1::Generation::Stub* stub_;
  const std::vector<std::string>* prompts_;
  const std::vector<std::vector<int32_t>>* expected_;
  const std::vector<std::string> modes_;
  const int max_tokens_;
  const BenchClock::time_point t0_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

// Median end-to-end latency of the OK requests that started in [from, to); 0 when none.
double MedianLatency(const std::vector<Outcome>& outcomes, double from, double to) {
  std::vector<double> latencies;
  for (const Outcome& o : outcomes) {
    if (o.ok && o.start >= from && o.start < to) latencies.push_back(o.end - o.start);
  }
  return Quantile(std::move(latencies), 0.5);
}

struct ScenarioResult {
  std::string name;
  std::string fault;  // what was done, in words
  int sent = 0, failed = 0, wrong = 0;
  bool restart = false;           // a kill-and-restart scenario: the two fields below apply
  int failed_after_recovery = 0;  // failures that started after the first request served
  std::string first_error;
  double latency_before = 0, latency_settling = 0, latency_after = 0;  // medians, seconds
  double ar_latency = 0;                 // drafter-kill: ar's median on the same cluster (mean of:)
  double ar_latency_phases[2] = {0, 0};  // before the spec phase, and after it
  double recovery_seconds = -1;          // listening again -> first request served
  bool goal_met = false;
  std::string goal;
};

// The three latency medians of `r`: requests started before `fault`, in the second from
// `settle` (the fault, or the restart's listening), and after that.
void SetLatencies(const std::vector<Outcome>& outcomes, double fault, double settle,
                  ScenarioResult& r) {
  r.latency_before = MedianLatency(outcomes, 0, fault);
  r.latency_settling = MedianLatency(outcomes, settle, settle + kSettleSeconds);
  r.latency_after = MedianLatency(outcomes, settle + kSettleSeconds, 1e9);
}

// A started local cluster with its router stub, the prompts and their greedy outputs.
struct Bench {
  std::unique_ptr<LocalCluster> cluster;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
  std::vector<std::string> prompts;
  std::vector<std::vector<int32_t>> expected;
};

// `redis`: the cluster's registry (LocalClusterOptions::redis), "" for none.
absl::StatusOr<Bench> StartBench(const BenchChaosArgs& args, int verifiers,
                                 const std::vector<std::string>& prompts,
                                 const std::string& redis = "") {
  Bench bench;
  auto cluster = LocalCluster::Start({.who = kWho,
                                      .model_dir = args.model_dir,
                                      .drafter_model_dir = args.drafter_dir,
                                      .metrics = false,
                                      .threads = args.threads,
                                      .verifiers = verifiers,
                                      .redis = redis,
                                      .forward_output = false});
  if (!cluster.ok()) return cluster.status();
  bench.cluster = std::move(*cluster);
  bench.channel =
      grpc::CreateChannel(bench.cluster->router_address(), grpc::InsecureChannelCredentials());
  bench.stub = v1::Generation::NewStub(bench.channel);
  absl::StatusOr<v1::ListModelsResponse> models =
      WaitForModels(*bench.stub, bench.cluster->router_address(), kReadyTimeout);
  if (!models.ok()) return models.status();
  bench.prompts = prompts;
  for (const std::string& prompt : prompts) {
    const TimedStream stream =
        Generate(*bench.stub, prompt, "ar", args.max_tokens, BenchClock::now(), kRequestTimeout);
    if (!stream.ok()) {
      return absl::UnavailableError(absl::StrCat("the greedy output of a prompt before any fault: ",
                                                 DescribeStatus(stream.status)));
    }
    bench.expected.push_back(stream.tokens);
  }
  return bench;
}

void Count(const std::vector<Outcome>& outcomes, ScenarioResult& r) {
  for (const Outcome& o : outcomes) {
    ++r.sent;
    if (!o.ok) {
      ++r.failed;
      if (r.first_error.empty()) r.first_error = o.error;
    }
    if (o.wrong) ++r.wrong;
  }
}

void SleepSeconds(double seconds) { absl::SleepFor(absl::Seconds(seconds)); }

// The index of the verifier `n` (0-based) among the cluster's children: drafter, verifiers,
// router.
size_t VerifierChild(int n) { return static_cast<size_t>(1 + n); }
constexpr size_t kDrafterChild = 0;

// What a scenario's clients saw around its fault; times in seconds from the load's start.
struct FaultedLoad {
  std::vector<Outcome> outcomes;
  double fault = 0;    // `inject` called
  double settled = 0;  // `inject` returned (a restarted service listening again)
};

// Closed-loop clients on `bench` (`modes` rotated) for args.before_seconds, then `inject` (the
// fault, and the restart where the scenario has one), then args.after_seconds of load more.
absl::StatusOr<FaultedLoad> LoadAroundFault(const BenchChaosArgs& args, Bench& bench,
                                            std::vector<std::string> modes,
                                            const std::function<absl::Status()>& inject) {
  FaultedLoad run;
  const BenchClock::time_point t0 = BenchClock::now();
  Load load(bench.stub.get(), &bench.prompts, &bench.expected, std::move(modes), args.clients,
            args.max_tokens, t0);
  SleepSeconds(args.before_seconds);
  run.fault = Since(t0);
  if (absl::Status injected = inject(); !injected.ok()) return injected;
  run.settled = Since(t0);
  SleepSeconds(args.after_seconds);
  run.outcomes = load.Stop();
  return run;
}

absl::StatusOr<ScenarioResult> VerifierFault(const BenchChaosArgs& args,
                                             const std::vector<std::string>& prompts, int signo) {
  ScenarioResult r;
  r.name = signo == SIGKILL ? "verifier-kill" : "verifier-drain";
  r.fault = signo == SIGKILL ? "SIGKILL one of two verifiers" : "SIGTERM one of two verifiers";
  absl::StatusOr<Bench> bench = StartBench(args, 2, prompts);
  if (!bench.ok()) return bench.status();
  absl::StatusOr<FaultedLoad> run = LoadAroundFault(args, *bench, {"ar", "spec", "auto"}, [&] {
    bench->cluster->children()[VerifierChild(1)]->Signal(signo);
    return absl::OkStatus();
  });
  if (!run.ok()) return run.status();
  Count(run->outcomes, r);
  SetLatencies(run->outcomes, run->fault, run->fault, r);
  r.goal = "0 failed, 0 wrong";
  r.goal_met = r.failed == 0 && r.wrong == 0;
  return r;
}

// SIGKILLs a service (the only verifier, or the router) and starts it again on its address
// after `outage` seconds; `restart.name` and `restart.fault` are the result's.
struct RestartSpec {
  std::string name, fault;
  bool router = false;  // else the verifier
  int outage = 0;
};

absl::StatusOr<ScenarioResult> KillAndRestart(const BenchChaosArgs& args,
                                              const std::vector<std::string>& prompts,
                                              const RestartSpec& spec) {
  ScenarioResult r;
  r.name = spec.name;
  r.fault = spec.fault;
  r.restart = true;
  absl::StatusOr<Bench> bench = StartBench(args, 1, prompts);
  if (!bench.ok()) return bench.status();
  const size_t child = spec.router ? bench->cluster->children().size() - 1 : VerifierChild(0);
  absl::StatusOr<FaultedLoad> run = LoadAroundFault(args, *bench, {"ar", "spec", "auto"}, [&] {
    const BenchClock::time_point killed = BenchClock::now();
    ChildProcess& service = *bench->cluster->children()[child];
    service.Signal(SIGKILL);
    service.WaitForExit(absl::Seconds(10));
    SleepSeconds(std::max(0.0, spec.outage - Since(killed)));
    return bench->cluster->Restart(child);
  });
  if (!run.ok()) return run.status();
  const std::vector<Outcome>& outcomes = run->outcomes;
  const double listening = run->settled;
  Count(outcomes, r);
  for (const Outcome& o : outcomes) {
    if (o.ok && o.start >= listening &&
        (r.recovery_seconds < 0 || o.start - listening < r.recovery_seconds)) {
      r.recovery_seconds = o.start - listening;
    }
  }
  if (r.recovery_seconds >= 0) {
    for (const Outcome& o : outcomes) {
      if (!o.ok && o.start >= listening + r.recovery_seconds) ++r.failed_after_recovery;
    }
  }
  SetLatencies(outcomes, run->fault, listening, r);
  r.goal = absl::StrCat("served again within ", kRestartGoalSeconds,
                        " s of listening, then 0 failed; 0 wrong");
  r.goal_met = r.recovery_seconds >= 0 && r.recovery_seconds <= kRestartGoalSeconds &&
               r.failed_after_recovery == 0 && r.wrong == 0;
  return r;
}

// `kill` false: the control run, the same phases with nothing killed.
absl::StatusOr<ScenarioResult> DrafterKill(const BenchChaosArgs& args,
                                           const std::vector<std::string>& prompts, bool kill) {
  ScenarioResult r;
  r.name = kill ? "drafter-kill" : "drafter-control";
  r.fault = kill ? "SIGKILL the drafter under spec requests" : "none (drafter-kill's control)";
  absl::StatusOr<Bench> bench = StartBench(args, 1, prompts);
  if (!bench.ok()) return bench.status();
  // ar's median on the same cluster, for as long as the load runs before the kill.
  const auto ar_median = [&] {
    Load ar(bench->stub.get(), &bench->prompts, &bench->expected, {"ar"}, args.clients,
            args.max_tokens, BenchClock::now());
    SleepSeconds(args.before_seconds);
    return MedianLatency(ar.Stop(), 0, 1e9);
  };
  // Taken on both sides of the spec phase and averaged (the second with the drafter dead, as
  // the spec sequences then run): the machine's speed drifts between phases.
  r.ar_latency_phases[0] = ar_median();
  absl::StatusOr<FaultedLoad> run = LoadAroundFault(args, *bench, {"spec"}, [&] {
    if (kill) bench->cluster->children()[kDrafterChild]->Signal(SIGKILL);
    return absl::OkStatus();
  });
  if (!run.ok()) return run.status();
  r.ar_latency_phases[1] = ar_median();
  r.ar_latency = (r.ar_latency_phases[0] + r.ar_latency_phases[1]) / 2;
  Count(run->outcomes, r);
  SetLatencies(run->outcomes, run->fault, run->fault, r);
  if (!kill) {
    r.goal = "0 failed, 0 wrong (the latencies are the reference for drafter-kill's)";
    r.goal_met = r.failed == 0 && r.wrong == 0;
    return r;
  }
  r.goal = absl::StrCat("0 failed, 0 wrong; from ", kSettleSeconds, " s after the kill, median ",
                        "latency <= ", kDrafterLatencyGoal, " x ar's");
  r.goal_met = r.failed == 0 && r.wrong == 0 && r.latency_after > 0 &&
               r.latency_after <= kDrafterLatencyGoal * r.ar_latency;
  return r;
}

absl::StatusOr<ScenarioResult> RedisRestart(const BenchChaosArgs& args,
                                            const std::vector<std::string>& prompts) {
  ScenarioResult r;
  r.name = "redis-restart";
  r.fault = "SIGKILL the registry's Redis, start it again empty on its port";
  RedisProcess redis;
  const int port = FreeLoopbackPort();
  if (port == 0) return absl::UnavailableError("no free loopback port for redis-server");
  if (absl::Status started = redis.Start(port); !started.ok()) return started;
  absl::StatusOr<Bench> bench = StartBench(args, 2, prompts, redis.address());
  if (!bench.ok()) return bench.status();
  absl::StatusOr<FaultedLoad> run = LoadAroundFault(args, *bench, {"ar", "spec", "auto"}, [&] {
    redis.Kill();
    return redis.Start(port);
  });
  if (!run.ok()) return run.status();
  Count(run->outcomes, r);
  SetLatencies(run->outcomes, run->fault, run->settled, r);
  r.goal = "0 failed, 0 wrong";
  r.goal_met = r.failed == 0 && r.wrong == 0;
  return r;
}

nlohmann::json ResultJson(const ScenarioResult& r) {
  nlohmann::json j = {{"scenario", r.name},
                      {"fault", r.fault},
                      {"sent", r.sent},
                      {"failed", r.failed},
                      {"wrong", r.wrong},
                      {"first_error", r.first_error},
                      {"latency_before_seconds", r.latency_before},
                      {"latency_settling_seconds", r.latency_settling},
                      {"latency_after_seconds", r.latency_after},
                      {"goal", r.goal},
                      {"goal_met", r.goal_met}};
  if (r.ar_latency > 0) {
    j["ar_latency_seconds"] = r.ar_latency;
    j["ar_latency_phases_seconds"] = {r.ar_latency_phases[0], r.ar_latency_phases[1]};
  }
  if (r.restart) {
    j["recovery_seconds"] =
        r.recovery_seconds >= 0 ? nlohmann::json(r.recovery_seconds) : nlohmann::json(nullptr);
    j["failed_after_recovery"] = r.failed_after_recovery;
  }
  return j;
}

void PrintTable(const std::vector<ScenarioResult>& results) {
  std::printf("%-20s %6s %6s %6s %9s %9s %9s %9s  %s\n", "scenario", "sent", "failed", "wrong",
              "p50 pre", "p50 +1s", "p50 post", "recovery", "goal");
  for (const ScenarioResult& r : results) {
    const std::string recovery =
        r.restart ? (r.recovery_seconds >= 0 ? absl::StrFormat("%.2fs", r.recovery_seconds)
                                             : std::string("never"))
                  : std::string("-");
    // A window with no request served shows "-".
    auto latency = [](double seconds) {
      return seconds > 0 ? absl::StrFormat("%.3fs", seconds) : std::string("-");
    };
    std::printf("%-20s %6d %6d %6d %9s %9s %9s %9s  %s: %s\n", r.name.c_str(), r.sent, r.failed,
                r.wrong, latency(r.latency_before).c_str(), latency(r.latency_settling).c_str(),
                latency(r.latency_after).c_str(), recovery.c_str(), r.goal_met ? "MET" : "MISSED",
                r.goal.c_str());
    if (r.ar_latency > 0) {
      std::printf("%-20s ar's p50 latency %.3fs (%.3fs before the spec phase, %.3fs after)\n", "",
                  r.ar_latency, r.ar_latency_phases[0], r.ar_latency_phases[1]);
    }
    if (!r.first_error.empty()) {
      std::printf("%-20s first error: %s\n", "", r.first_error.c_str());
    }
  }
}

absl::Status CheckArgs(const BenchChaosArgs& args) {
  for (const std::string& s : args.scenarios) {
    if (s != "verifier-kill" && s != "verifier-drain" && s != "verifier-restart" &&
        s != "drafter-kill" && s != "drafter-control" && s != "router-restart" &&
        s != "redis-restart") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown scenario '", s,
                       "'; expected verifier-kill, verifier-drain, verifier-restart, "
                       "drafter-kill, drafter-control, router-restart or redis-restart"));
    }
  }
  if (args.clients < 1 || args.clients > 256) {
    return absl::InvalidArgumentError("--clients must be in [1, 256]");
  }
  if (args.max_tokens < 1 || args.max_tokens > 4096) {
    return absl::InvalidArgumentError("--max-tokens must be in [1, 4096]");
  }
  if (!(args.before_seconds > 0) || !(args.after_seconds > kSettleSeconds) ||
      args.before_seconds > 600 || args.after_seconds > 600) {
    return absl::InvalidArgumentError(
        "--before must be in (0, 600] and --after in (1, 600] seconds");
  }
  for (int outage : args.outages) {
    if (outage < 0 || outage > 3600) {
      return absl::InvalidArgumentError("--outages must be in [0, 3600] seconds");
    }
  }
  return absl::OkStatus();
}

}  // namespace

int RunBenchChaos(const BenchChaosArgs& args) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", kWho, std::string(status.message()).c_str());
    return 1;
  };
  if (absl::Status checked = CheckArgs(args); !checked.ok()) return fail(checked);
  absl::StatusOr<std::vector<Prompt>> loaded = LoadBenchPrompts(args.model_dir, "", 0);
  if (!loaded.ok()) return fail(loaded.status());
  std::vector<std::string> prompts;
  for (const Prompt& p : *loaded) {
    if (prompts.size() < kPrompts) prompts.push_back(p.text);
  }
  if (prompts.empty()) return fail(absl::NotFoundError("no benchmark prompts"));

  std::vector<ScenarioResult> results;
  auto run = [&](absl::StatusOr<ScenarioResult> result) {
    if (!result.ok()) return false;
    if (!args.json) {
      std::fprintf(stderr, "%s: %s: sent %d, failed %d, wrong %d\n", kWho, result->name.c_str(),
                   result->sent, result->failed, result->wrong);
    }
    results.push_back(*std::move(result));
    return true;
  };
  for (const std::string& scenario : args.scenarios) {
    if (!args.json) std::fprintf(stderr, "%s: %s\n", kWho, scenario.c_str());
    absl::Status status;
    if (scenario == "verifier-kill" || scenario == "verifier-drain") {
      auto r = VerifierFault(args, prompts, scenario == "verifier-kill" ? SIGKILL : SIGTERM);
      status = r.status();
      run(std::move(r));
    } else if (scenario == "verifier-restart") {
      for (int outage : args.outages) {
        auto r =
            KillAndRestart(args, prompts,
                           {.name = absl::StrCat("verifier-restart-", outage),
                            .fault = absl::StrCat(
                                "SIGKILL the only verifier, start it again after ", outage, " s"),
                            .outage = outage});
        status = r.status();
        if (!run(std::move(r))) break;
      }
    } else if (scenario == "router-restart") {
      auto r = KillAndRestart(args, prompts,
                              {.name = "router-restart",
                               .fault = "SIGKILL the router, start it again",
                               .router = true});
      status = r.status();
      run(std::move(r));
    } else if (scenario == "redis-restart") {
      auto r = RedisRestart(args, prompts);
      status = r.status();
      run(std::move(r));
    } else {
      auto r = DrafterKill(args, prompts, scenario == "drafter-kill");
      status = r.status();
      run(std::move(r));
    }
    if (!status.ok())
      return fail(absl::Status(status.code(), absl::StrCat(scenario, ": ", status.message())));
  }
  if (args.json) {
    nlohmann::json out = {{"clients", args.clients},
                          {"max_tokens", args.max_tokens},
                          {"before_seconds", args.before_seconds},
                          {"after_seconds", args.after_seconds},
                          {"scenarios", nlohmann::json::array()}};
    for (const ScenarioResult& r : results) out["scenarios"].push_back(ResultJson(r));
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    PrintTable(results);
  }
  return 0;
}

}  // namespace tandem::cli
