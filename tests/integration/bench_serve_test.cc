// `tandem bench serve`, `router`, `chaos` and `prefix` end to end at tiny settings: bench serve,
// chaos and prefix start their own local clusters (the launcher `tandem up` uses), bench router
// measures a cluster started here through --server/--verifier. Checks the JSON they print and
// the file bench serve writes.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster.h"
#include "tests/worker/model/checkpoint/temp_dir.h"

namespace tandem::testing {
namespace {

using nlohmann::json;

struct CommandRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// A directory of this process's own: ctest runs this suite's tests as parallel processes.
const test::TempDir& OwnDir() {
  static const test::TempDir dir;
  return dir;
}

// Runs `tandem ARGS`, collecting stdout and stderr.
CommandRun RunTandem(const std::string& args) {
  static int counter = 0;
  const std::string err_file = OwnDir().File(absl::StrCat("stderr_", ++counter, ".txt"));
  const std::string command =
      absl::StrCat("'", BinaryPath("cli", "tandem"), "' ", args, " 2>'", err_file, "'");
  CommandRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.out.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_file);
  run.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return run;
}

bool HasMatplotlib() {
  return std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") == 0;
}

TEST(BenchServe, RunsEveryModeAtEveryLevelAndWritesJson) {
  const std::string out_dir = OwnDir().File("bench_serve_out");
  std::filesystem::remove_all(out_dir);
  const CommandRun run = RunTandem(absl::StrCat(
      "bench serve --concurrency 1,2 --modes ar,auto --max-tokens 8 --requests-per-level 3 "
      "--rounds 1 --pair-rounds 0 --warmup 0 --json --out-dir '",
      out_dir, "'"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  std::ifstream file(out_dir + "/serve.json");
  ASSERT_TRUE(file) << "no serve.json in " << out_dir;
  EXPECT_EQ(json::parse(file), j) << "serve.json differs from the printed JSON";

  EXPECT_EQ(j["concurrency"], json::array({1, 2}));
  EXPECT_EQ(j["modes"], json::array({"ar", "auto"}));
  EXPECT_EQ(j["max_tokens"], 8);
  EXPECT_EQ(j["rounds"], 1);
  EXPECT_EQ(j["warmup_seconds"], 0);
  ASSERT_EQ(j["levels"].size(), 4u);
  // Interleaved: every mode at C = 1, then every mode at C = 2.
  const std::pair<int, std::string> order[] = {{1, "ar"}, {1, "auto"}, {2, "ar"}, {2, "auto"}};
  for (size_t i = 0; i < 4; ++i) {
    const json& level = j["levels"][i];
    SCOPED_TRACE(level.dump());
    EXPECT_EQ(level["concurrency"], order[i].first);
    EXPECT_EQ(level["mode"], order[i].second);
    EXPECT_EQ(level["requests"], 3);
    EXPECT_EQ(level["errors"], 0);
    EXPECT_GT(level["output_tokens"].get<int>(), 0);
    EXPECT_LE(level["output_tokens"].get<int>(), 3 * 8);
    EXPECT_GT(level["tokens_per_second"].get<double>(), 0);
    EXPECT_GT(level["requests_per_second"].get<double>(), 0);
    EXPECT_GT(level["window_seconds"].get<double>(), 0);
    EXPECT_LE(level["window_seconds"].get<double>(), level["wall_seconds"].get<double>());
    EXPECT_LE(level["window_tokens"].get<int>(), level["output_tokens"].get<int>());
    for (const char* q : {"ttft", "itl", "e2e"}) {
      const double p50 = level[absl::StrCat(q, "_p50_seconds")];
      const double p99 = level[absl::StrCat(q, "_p99_seconds")];
      EXPECT_GE(p50, 0) << q;
      EXPECT_GE(p99, p50) << q;
    }
    EXPECT_LE(level["ttft_p50_seconds"].get<double>(), level["e2e_p50_seconds"].get<double>());
    if (order[i].second == "ar") {
      EXPECT_EQ(level["served_modes"], json({{"ar", 3}}));
    }
    // One round: the cell is its round.
    ASSERT_EQ(level["rounds"].size(), 1u);
    const json& round = level["rounds"][0];
    EXPECT_EQ(round["round"], 0);
    EXPECT_EQ(round["position"], i % 2);
    for (const char* key :
         {"requests", "errors", "served_modes", "output_tokens", "window_seconds", "window_tokens",
          "wall_seconds", "tokens_per_second", "requests_per_second"}) {
      EXPECT_EQ(round[key], level[key]) << key;
    }
    EXPECT_EQ(level["tokens_per_second_min"], level["tokens_per_second"]);
    EXPECT_EQ(level["tokens_per_second_max"], level["tokens_per_second"]);
  }
  ASSERT_EQ(j["auto_vs_best"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& ratio = j["auto_vs_best"][i];
    const json& ar = j["levels"][2 * i];
    const json& automatic = j["levels"][2 * i + 1];
    EXPECT_EQ(ratio["concurrency"], ar["concurrency"]);
    EXPECT_EQ(ratio["best_mode"], "ar");
    EXPECT_DOUBLE_EQ(ratio["ratio"].get<double>(), automatic["tokens_per_second"].get<double>() /
                                                       ar["tokens_per_second"].get<double>());
    // One round: the paired ratio is the ratio, and decides.
    EXPECT_EQ(ratio["pass"],
              ratio["paired_ratio_median"].get<double>() >= j["threshold"].get<double>());
    ASSERT_EQ(ratio["paired_ratios"].size(), 1u);
    EXPECT_DOUBLE_EQ(ratio["paired_ratios"][0].get<double>(), ratio["ratio"].get<double>());
  }
  if (HasMatplotlib()) {
    EXPECT_GT(std::filesystem::file_size(out_dir + "/serve.png"), 1000u) << run.err;
  } else {
    EXPECT_THAT(run.err, ::testing::HasSubstr("no plot:"));
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Rounds: every (mode, C) cell holds one window per round, the mode order rotated each round;
// the cell's tokens/s is the median of its rounds', its counts their sums, and auto / best
// compares medians, with the per-round paired ratios next to it.
TEST(BenchServe, RunsRoundsInRotatedOrderAndReportsMedians) {
  const CommandRun run = RunTandem(
      "bench serve --concurrency 1,2 --modes ar,auto --max-tokens 8 --requests-per-level 2 "
      "--rounds 2 --pair-rounds 0 --warmup 0.2 --json --out-dir ''");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["rounds"], 2);
  EXPECT_DOUBLE_EQ(j["warmup_seconds"].get<double>(), 0.2);
  const std::vector<std::string> modes = {"ar", "auto"};
  ASSERT_EQ(j["levels"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const json& level = j["levels"][i];
    SCOPED_TRACE(level.dump());
    EXPECT_EQ(level["concurrency"], i < 2 ? 1 : 2);
    EXPECT_EQ(level["mode"], modes[i % 2]);
    ASSERT_EQ(level["rounds"].size(), 2u);
    std::vector<double> tps, rps;
    int requests = 0, errors = 0, output_tokens = 0;
    std::map<std::string, int> served;
    for (int k = 0; k < 2; ++k) {
      const json& round = level["rounds"][k];
      EXPECT_EQ(round["round"], k);
      // Round k starts with mode k: ar runs first in round 0 and last in round 1.
      EXPECT_EQ(round["position"], (static_cast<int>(i % 2) - k + 2) % 2);
      EXPECT_EQ(round["requests"], 2);
      EXPECT_GT(round["tokens_per_second"].get<double>(), 0);
      EXPECT_TRUE(round["load_average"].is_number());
      tps.push_back(round["tokens_per_second"]);
      rps.push_back(round["requests_per_second"]);
      requests += round["requests"].get<int>();
      errors += round["errors"].get<int>();
      output_tokens += round["output_tokens"].get<int>();
      for (const auto& [mode, count] : round["served_modes"].items()) {
        served[mode] += count.get<int>();
      }
    }
    EXPECT_DOUBLE_EQ(level["tokens_per_second"].get<double>(), Median(tps));
    EXPECT_DOUBLE_EQ(level["tokens_per_second_min"].get<double>(), std::min(tps[0], tps[1]));
    EXPECT_DOUBLE_EQ(level["tokens_per_second_max"].get<double>(), std::max(tps[0], tps[1]));
    EXPECT_DOUBLE_EQ(level["requests_per_second"].get<double>(), Median(rps));
    EXPECT_EQ(level["requests"], requests);
    EXPECT_EQ(requests, 4);
    EXPECT_EQ(level["errors"], errors);
    EXPECT_EQ(level["output_tokens"], output_tokens);
    EXPECT_EQ(level["served_modes"], json(served));
  }
  ASSERT_EQ(j["auto_vs_best"].size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    const json& ratio = j["auto_vs_best"][l];
    const json& ar = j["levels"][2 * l];
    const json& automatic = j["levels"][2 * l + 1];
    SCOPED_TRACE(ratio.dump());
    EXPECT_EQ(ratio["best_mode"], "ar");
    EXPECT_DOUBLE_EQ(ratio["auto_tokens_per_second"].get<double>(),
                     automatic["tokens_per_second"].get<double>());
    EXPECT_DOUBLE_EQ(ratio["ratio"].get<double>(), automatic["tokens_per_second"].get<double>() /
                                                       ar["tokens_per_second"].get<double>());
    ASSERT_EQ(ratio["paired_ratios"].size(), 2u);
    std::vector<double> paired;
    for (int k = 0; k < 2; ++k) {
      const double expected = automatic["rounds"][k]["tokens_per_second"].get<double>() /
                              ar["rounds"][k]["tokens_per_second"].get<double>();
      EXPECT_DOUBLE_EQ(ratio["paired_ratios"][k].get<double>(), expected);
      paired.push_back(expected);
    }
    EXPECT_DOUBLE_EQ(ratio["paired_ratio_median"].get<double>(), Median(paired));
    EXPECT_EQ(ratio["pass"], Median(paired) >= j["threshold"].get<double>());
  }
}

// Pair rounds: after the rounds, auto and the leading fixed mode run alone, in ABBA order, and
// again with any other fixed mode that leads after them; their cells hold those windows too,
// and the paired ratios match windows by round.
TEST(BenchServe, PairRoundsRunAutoAndTheLeaderInAbbaOrder) {
  const CommandRun run = RunTandem(
      "bench serve --concurrency 2 --modes ar,jacobi,auto --max-tokens 8 "
      "--requests-per-level 2 --rounds 1 --pair-rounds 4 --warmup 0 --json --out-dir ''");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["pair_rounds"], 4);
  ASSERT_EQ(j["levels"].size(), 3u);
  ASSERT_EQ(j["auto_vs_best"].size(), 1u);
  const json& ratio = j["auto_vs_best"][0];
  std::map<std::string, const json*> cells;
  for (const json& level : j["levels"]) cells[level["mode"]] = &level;
  const std::string best = ratio["best_mode"];
  ASSERT_TRUE(best == "ar" || best == "jacobi") << best;
  // The mode that led after round 0 ran pair rounds 1-4; the other one ran none (1 window) or,
  // when it led after those, rounds 5-8 (5 windows). The final best always ran its own.
  const size_t ar_windows = cells["ar"]->at("rounds").size();
  const size_t jacobi_windows = cells["jacobi"]->at("rounds").size();
  ASSERT_TRUE((ar_windows == 5u && (jacobi_windows == 1u || jacobi_windows == 5u)) ||
              (jacobi_windows == 5u && ar_windows == 1u))
      << ar_windows << " " << jacobi_windows;
  ASSERT_EQ(cells[best]->at("rounds").size(), 5u);
  const size_t auto_windows = cells["auto"]->at("rounds").size();
  ASSERT_EQ(auto_windows, 1u + (ar_windows - 1) + (jacobi_windows - 1));
  // Each fixed mode's pair k: itself first in pairs 0 and 3, auto first in pairs 1 and 2.
  const int leader_position[] = {0, 1, 1, 0};
  std::vector<int> auto_rounds;
  for (const json& w : cells["auto"]->at("rounds")) auto_rounds.push_back(w["round"]);
  for (const std::string mode : {"ar", "jacobi"}) {
    const json& windows = cells[mode]->at("rounds");
    for (size_t k = 1; k < windows.size(); ++k) {
      SCOPED_TRACE(mode + " pair " + std::to_string(k));
      const int round = windows[k]["round"];
      EXPECT_GE(round, 1);
      EXPECT_EQ(windows[k]["position"], leader_position[(k - 1) % 4]);
      EXPECT_EQ(windows[k]["requests"], 2);
      // auto ran the same round, in the other position.
      const auto it = std::find(auto_rounds.begin(), auto_rounds.end(), round);
      ASSERT_NE(it, auto_rounds.end());
      const json& theirs = cells["auto"]->at("rounds")[it - auto_rounds.begin()];
      EXPECT_EQ(theirs["position"], 1 - leader_position[(k - 1) % 4]);
    }
  }
  // The criterion's medians are over every window of the cell.
  EXPECT_DOUBLE_EQ(ratio["auto_tokens_per_second"].get<double>(),
                   cells["auto"]->at("tokens_per_second").get<double>());
  EXPECT_DOUBLE_EQ(ratio["best_tokens_per_second"].get<double>(),
                   cells[best]->at("tokens_per_second").get<double>());
  for (const std::string mode : {"ar", "jacobi"}) {
    EXPECT_GE(ratio["best_tokens_per_second"].get<double>(),
              cells[mode]->at("tokens_per_second").get<double>());
  }
  // Paired by round: round 0 and the best's four pair rounds.
  ASSERT_EQ(ratio["paired_ratios"].size(), 5u);
  const json& best_windows = cells[best]->at("rounds");
  for (size_t k = 0; k < 5; ++k) {
    const int round = best_windows[k]["round"];
    const auto it = std::find(auto_rounds.begin(), auto_rounds.end(), round);
    ASSERT_NE(it, auto_rounds.end());
    EXPECT_DOUBLE_EQ(
        ratio["paired_ratios"][k].get<double>(),
        cells["auto"]->at("rounds")[it - auto_rounds.begin()]["tokens_per_second"].get<double>() /
            best_windows[k]["tokens_per_second"].get<double>());
  }
}

// Without --modes, every mode auto may choose that the cluster serves is a fixed mode (auto is
// held to the best of them), then auto: on the bundled models that is all of AutoModes().
TEST(BenchServe, DefaultModesAreEveryModeAutoMayChoose) {
  const CommandRun run = RunTandem(
      "bench serve --concurrency 1 --max-tokens 4 --requests-per-level 1 --rounds 1 "
      "--pair-rounds 0 --warmup 0 --json --out-dir ''");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["modes"], json::array({"ar", "spec", "self_spec", "self_spec_quadratic", "isd",
                                     "jacobi", "auto"}));
}

// --cpu-weights reaches the local verifier and drafter: with bf16 both start and serve ar and
// spec; a weight type they do not know is refused before a cluster starts.
TEST(BenchServe, CpuWeightsReachTheLocalServices) {
  const CommandRun run = RunTandem(
      "bench serve --concurrency 1 --max-tokens 4 --requests-per-level 1 --rounds 1 "
      "--pair-rounds 0 --warmup 0 --modes ar,spec --cpu-weights bf16 --json --out-dir ''");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["modes"], json::array({"ar", "spec"}));
  const CommandRun bad = RunTandem("bench serve --cpu-weights f16 --out-dir ''");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, ::testing::HasSubstr("--cpu-weights"));
}

// Bad values are refused before a cluster starts.
TEST(BenchServe, RefusesBadRoundsAndWarmup) {
  const std::pair<std::string, std::string> cases[] = {
      {"--rounds 0", "--rounds must be >= 1, got 0"},
      {"--rounds -2", "--rounds must be >= 1, got -2"},
      {"--pair-rounds -1", "--pair-rounds must be >= 0, got -1"},
      {"--warmup -1", "--warmup must be >= 0 seconds"},
      {"--duration -3", "--duration must be >= 0 seconds"},
      {"--concurrency 1,0", "--concurrency levels must be >= 1, got 0"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    const CommandRun run = RunTandem(absl::StrCat("bench serve ", flags, " --out-dir ''"));
    EXPECT_EQ(run.exit_code, 1);
    EXPECT_THAT(run.err, ::testing::HasSubstr(message));
    EXPECT_EQ(run.out, "");
  }
  // Not numbers: the command line parser refuses them.
  for (const auto& [flag, value] : {std::pair{"--rounds", "many"}, std::pair{"--warmup", "soon"}}) {
    SCOPED_TRACE(flag);
    const CommandRun run =
        RunTandem(absl::StrCat("bench serve ", flag, " ", value, " --out-dir ''"));
    EXPECT_NE(run.exit_code, 0);
    EXPECT_THAT(run.err, ::testing::HasSubstr(flag));
  }
}

TEST(BenchServe, RefusesUnservedAndRepeatedModes) {
  auto cluster = Cluster::Start({.drafter = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const CommandRun run =
      RunTandem(absl::StrCat("bench serve --server ", (*cluster)->router_address(),
                             " --modes ar,no_such_mode --out-dir ''"));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, ::testing::HasSubstr("mode 'no_such_mode' is not served"));
  const CommandRun twice = RunTandem(absl::StrCat(
      "bench serve --server ", (*cluster)->router_address(), " --modes ar,ar --out-dir ''"));
  EXPECT_EQ(twice.exit_code, 1);
  EXPECT_THAT(twice.err, ::testing::HasSubstr("mode 'ar' is listed twice"));
  const CommandRun format = RunTandem(absl::StrCat(
      "bench serve --server ", (*cluster)->router_address(), " --modes ar,ar@yaml --out-dir ''"));
  EXPECT_EQ(format.exit_code, 1);
  EXPECT_THAT(format.err, ::testing::HasSubstr("json_object or json_schema"));
}

// MODE@FORMAT runs MODE with structured output beside MODE, is served by MODE, is no rival of
// auto's, and gets its cost against MODE paired by round.
TEST(BenchServe, StructuredOutputVariantsRunBesideTheirMode) {
  const CommandRun run = RunTandem(
      "bench serve --concurrency 1 --modes ar,ar@json_schema,auto --max-tokens 24 "
      "--requests-per-level 2 --rounds 2 --pair-rounds 0 --warmup 0 --json --out-dir ''");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  std::map<std::string, const json*> cells;
  for (const json& level : j["levels"]) cells[level["mode"]] = &level;
  ASSERT_EQ(cells.count("ar@json_schema"), 1u);
  for (const json& window : cells["ar@json_schema"]->at("rounds")) {
    EXPECT_EQ(window["errors"], 0);
    EXPECT_EQ(window["served_modes"], json({{"ar", 2}}));
  }
  ASSERT_EQ(j["auto_vs_best"].size(), 1u);
  EXPECT_EQ(j["auto_vs_best"][0]["best_mode"], "ar");
  ASSERT_EQ(j["structured_output_cost"].size(), 1u);
  const json& cost = j["structured_output_cost"][0];
  EXPECT_EQ(cost["variant"], "ar@json_schema");
  EXPECT_EQ(cost["base"], "ar");
  ASSERT_EQ(cost["paired_ratios"].size(), 2u);
  EXPECT_GT(cost["paired_ratio_median"].get<double>(), 0.0);
}

TEST(BenchRouter, ComparesDirectAndRoutedStreamsOfARunningCluster) {
  auto cluster = Cluster::Start({.drafter = false});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const CommandRun run = RunTandem(
      absl::StrCat("bench router --server ", (*cluster)->router_address(), " --verifier ",
                   (*cluster)->verifier_address(), " --requests 4 --max-tokens 8 --json"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["pairs"], 4);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_EQ(j["token_mismatches"], 0) << "greedy AR gave different tokens on the two paths";
  EXPECT_GT(j["tokens_per_path"].get<int>(), 4);
  for (const char* q : {"token_gap", "decode_per_token", "ttft", "e2e"}) {
    SCOPED_TRACE(q);
    ASSERT_TRUE(j.contains(q));
    EXPECT_GT(j[q]["direct_p50_seconds"].get<double>(), 0);
    EXPECT_GT(j[q]["router_p50_seconds"].get<double>(), 0);
    EXPECT_GE(j[q]["direct_p99_seconds"].get<double>(), j[q]["direct_p50_seconds"].get<double>());
    EXPECT_GE(j[q]["diff_p99_seconds"].get<double>(), j[q]["diff_p50_seconds"].get<double>());
  }
}

TEST(BenchRouter, NeedsTheVerifierWithServer) {
  const CommandRun run = RunTandem("bench router --server 127.0.0.1:1");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, ::testing::HasSubstr("--server needs --verifier"));
}

// `tandem bench chaos` at tiny settings, the suite's short version of the fault table
// (docs/RELIABILITY.md): a verifier of two killed under load fails nothing and changes no
// output; the only verifier, killed and started again after a second, and the router, killed
// and started again, are served again and fail nothing after that; a killed drafter and a
// registry's Redis killed and started again empty fail nothing (the drafter's latency goal is
// timing, left to the full run).
TEST(BenchChaos, FaultsFailNothingTheyShouldNot) {
  const CommandRun run = RunTandem(
      "bench chaos --scenarios "
      "verifier-kill,verifier-restart,drafter-kill,router-restart,redis-restart "
      "--outages 1 --before 1 --after 2 --clients 4 --max-tokens 8 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json out = json::parse(run.out);
  ASSERT_EQ(out["scenarios"].size(), 5u) << run.out;
  std::map<std::string, json> by_name;
  for (const json& s : out["scenarios"]) by_name[s["scenario"].get<std::string>()] = s;
  for (const char* name :
       {"verifier-kill", "verifier-restart-1", "drafter-kill", "router-restart", "redis-restart"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(by_name.count(name)) << run.out;
    const json& s = by_name[name];
    EXPECT_GT(s["sent"].get<int>(), 0);
    EXPECT_EQ(s["wrong"].get<int>(), 0) << s.dump();
  }
  for (const char* name : {"verifier-kill", "drafter-kill", "redis-restart"}) {
    EXPECT_EQ(by_name[name]["failed"].get<int>(), 0) << by_name[name].dump();
  }
  for (const char* name : {"verifier-restart-1", "router-restart"}) {
    const json& restart = by_name[name];
    ASSERT_FALSE(restart["recovery_seconds"].is_null()) << restart.dump();
    EXPECT_EQ(restart["failed_after_recovery"].get<int>(), 0) << restart.dump();
  }
}

TEST(BenchChaos, RefusesUnknownScenarios) {
  const CommandRun run = RunTandem("bench chaos --scenarios router-kill");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, ::testing::HasSubstr("unknown scenario 'router-kill'"));
}

// `tandem bench prefix` starts its clusters (cache off, on, on with affinity) and reports them
// side by side: the cache takes most of what the workload shares, and changes no completion.
TEST(BenchPrefix, ComparesTheCacheOffOnAndWithAffinity) {
  const CommandRun run = RunTandem(
      "bench prefix --conversations 2 --turns 3 --concurrency 2 --rounds 1 --max-tokens 8 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json out = json::parse(run.out);
  ASSERT_EQ(out["configurations"].size(), 3u);
  for (const json& c : out["configurations"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    EXPECT_EQ(c["requests"], 6);
    EXPECT_EQ(c["failed"], 0);
    EXPECT_EQ(c["completions_unlike_cache_off"], 0);
    EXPECT_GT(c["tokens_per_second"].get<double>(), 0);
    EXPECT_GT(c["shareable_rate"].get<double>(), 0.5);
  }
  EXPECT_EQ(out["configurations"][0]["name"], "cache off");
  EXPECT_EQ(out["configurations"][0]["cached_tokens"], 0);
  for (int i : {1, 2}) {
    const json& c = out["configurations"][i];
    EXPECT_GT(c["hit_rate"].get<double>(), 0.5 * c["shareable_rate"].get<double>()) << c.dump();
    EXPECT_LE(c["hit_rate"].get<double>(), c["shareable_rate"].get<double>()) << c.dump();
  }
}

TEST(BenchModes, ReportsTheArNllAndTheDiffusionSamplerVariants) {
  const CommandRun run =
      RunTandem("bench modes --modes ar,diffusion --prompts 1 --max-tokens 16 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  std::map<std::string, const json*> code;  // variant -> its row on the code prompt
  for (const json& row : j["results"]) {
    if (row["category"] == "code") code[row["variant"].get<std::string>()] = &row;
  }
  // The bundled target has a trained sampler: its variants run beside the thresholds.
  for (const char* variant : {"ar", "diffusion", "diffusion sampler=0.5", "diffusion t=0"}) {
    ASSERT_TRUE(code.count(variant)) << variant;
    const double nll = (*code[variant])["ar_nll"];
    EXPECT_GT(nll, 0.0) << variant;
    EXPECT_LT(nll, 20.0) << variant;
  }
  EXPECT_EQ((*code["diffusion sampler=0.5"])["options"]["diffusion_sampler"], 0.5);
  // A whole block per forward is far less plausible to the AR model than its own greedy text.
  EXPECT_GT((*code["diffusion t=0"])["ar_nll"].get<double>(),
            (*code["ar"])["ar_nll"].get<double>());
}

TEST(BenchSol, ReportsTheCeilingPerBlockLengthBesideTheThreshold) {
  const CommandRun run = RunTandem(
      "bench sol --blocks 1,4 --thresholds 0.9,0 --sampler-thresholds 0.5 --max-tokens 8 "
      "--prompts 1 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  EXPECT_EQ(j["depth"], 1);
  EXPECT_EQ(j["sampler"], true);
  int all_rows = 0;
  for (const json& row : j["rows"]) {
    SCOPED_TRACE(row.dump());
    const int block = row["block_size"];
    const int blocks = row["blocks"];
    ASSERT_GT(blocks, 0);
    EXPECT_EQ(row["tokens"], blocks * block);
    all_rows += row["category"] == "all" ? 1 : 0;
    // Every scheme commits at least one slot per forward and at most the whole block.
    for (const json* scheme : {&row["greedy"], &row["compaction"]}) {
      EXPECT_GE((*scheme)["forwards"].get<int>(), blocks);
      EXPECT_LE((*scheme)["forwards"].get<int>(), blocks * block);
    }
    EXPECT_GT(row["compaction"]["exact_blocks"].get<int>(), 0);
    // Confidence 0.9 and 0, then the bundled target's trained sampler at 0.5.
    const json& rules = row["rules"];
    ASSERT_EQ(rules.size(), 3u);
    EXPECT_EQ(rules[0]["rule"], "confidence");
    EXPECT_EQ(rules[2]["rule"], "sampler");
    EXPECT_EQ(rules[1]["forwards"], blocks);  // threshold 0 unmasks a block in one forward
    const double agreement = rules[0]["agreement"];
    for (const json& rule : rules) {
      EXPECT_GE(rule["agreement"].get<double>(), 0.0);
      EXPECT_LE(rule["agreement"].get<double>(), 1.0);
      EXPECT_GE(rule["forwards"].get<int>(), blocks);
    }
    if (block == 1) {  // one slot: every scheme is the serial decode
      EXPECT_EQ(row["greedy"]["exact_blocks"], blocks);
      EXPECT_EQ(row["compaction"]["forwards"], blocks);
      EXPECT_EQ(agreement, 1.0);
    }
  }
  EXPECT_EQ(all_rows, 2);  // one per block length
}

TEST(BenchSol, RefusesBadSettings) {
  for (const std::string args : {"--blocks 0", "--blocks 65", "--thresholds 1.5", "--depth 0",
                                 "--probes -1", "--max-tokens 0"}) {
    const CommandRun run = RunTandem("bench sol " + args);
    EXPECT_EQ(run.exit_code, 1) << args;
    EXPECT_THAT(run.err, ::testing::HasSubstr("bench sol: --")) << args;
  }
}

}  // namespace
}  // namespace tandem::testing
