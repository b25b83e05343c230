// `tandem bench serve` and `tandem bench router` end to end at tiny settings: bench serve starts
// its own local cluster (the launcher `tandem up` uses), bench router measures a cluster started
// here through --server/--verifier. Checks the JSON both print and the file bench serve writes.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

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
      "--json --out-dir '",
      out_dir, "'"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json j = json::parse(run.out);
  std::ifstream file(out_dir + "/serve.json");
  ASSERT_TRUE(file) << "no serve.json in " << out_dir;
  EXPECT_EQ(json::parse(file), j) << "serve.json differs from the printed JSON";

  EXPECT_EQ(j["concurrency"], json::array({1, 2}));
  EXPECT_EQ(j["modes"], json::array({"ar", "auto"}));
  EXPECT_EQ(j["max_tokens"], 8);
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
    EXPECT_EQ(ratio["pass"], ratio["ratio"].get<double>() >= j["threshold"].get<double>());
  }
  if (HasMatplotlib()) {
    EXPECT_GT(std::filesystem::file_size(out_dir + "/serve.png"), 1000u) << run.err;
  } else {
    EXPECT_THAT(run.err, ::testing::HasSubstr("no plot:"));
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

}  // namespace
}  // namespace tandem::testing
