// `tandem bench router` (see bench_serve.h).
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/bench_serve.h"
#include "services/cli/bench_stream.h"
#include "services/cli/local_cluster.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem::cli {

namespace {

constexpr char kWho[] = "tandem bench router";

v1::GenerateRequest ArRequest(const std::string& prompt, int max_tokens) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_mode("ar");
  request.set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);
  return request;
}

TimedStream ThroughRouter(v1::Generation::Stub& router, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  const BenchClock::time_point start = BenchClock::now();
  auto reader = router.Generate(&context, request);
  return ReadTimed(*reader, start);
}

TimedStream Direct(v1::Verifier::Stub& verifier, const v1::GenerateRequest& request) {
  v1::VerifyRequest verify;
  *verify.mutable_request() = request;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  const BenchClock::time_point start = BenchClock::now();
  auto reader = verifier.Generate(&context, verify);
  return ReadTimed(*reader, start);
}

// Decode time per token after the first: from the first token-bearing message to the last.
double DecodePerToken(const TimedStream& s) {
  if (s.tokens.size() < 2) return 0;
  return (s.chunks.back().time - s.chunks.front().time) / static_cast<double>(s.tokens.size() - 1);
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

int RunBenchRouter(const BenchRouterArgs& args) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", kWho, std::string(status.message()).c_str());
    return 1;
  };
  if (!args.server.empty() && args.verifier.empty()) {
    return fail(absl::InvalidArgumentError(
        "--server needs --verifier: the address of a verifier behind that router, to compare "
        "the direct path with"));
  }
  if (args.requests < 1) return fail(absl::InvalidArgumentError("--requests must be >= 1"));
  absl::StatusOr<std::vector<Prompt>> prompts =
      LoadBenchPrompts(args.model_dir, args.prompts_file, 0);
  if (!prompts.ok()) return fail(prompts.status());

  std::unique_ptr<LocalCluster> cluster;
  std::string router_address = args.server;
  std::string verifier_address = args.verifier;
  if (router_address.empty()) {
    if (!args.json) std::fprintf(stderr, "%s: starting a local cluster\n", kWho);
    auto started = LocalCluster::Start({.who = kWho,
                                        .model_dir = args.model_dir,
                                        .metrics = false,
                                        .threads = args.threads,
                                        .forward_output = false});
    if (!started.ok()) return fail(started.status());
    cluster = std::move(*started);
    router_address = cluster->router_address();
    verifier_address = cluster->verifier_address();
  }
  auto router_channel = MakeChannel(router_address, args.tls);
  if (!router_channel.ok()) return fail(router_channel.status());
  auto verifier_channel = MakeChannel(verifier_address, args.tls);
  if (!verifier_channel.ok()) return fail(verifier_channel.status());
  auto router = v1::Generation::NewStub(*router_channel);
  auto verifier = v1::Verifier::NewStub(*verifier_channel);

  // Warm-up on both paths.
  for (int i = 0; i < 4; ++i) {
    const v1::GenerateRequest request = ArRequest(prompts->at(i % prompts->size()).text, 8);
    for (const TimedStream& warm : {Direct(*verifier, request), ThroughRouter(*router, request)}) {
      if (!warm.ok()) {
        return fail(
            absl::UnavailableError(absl::StrCat("warm-up request: ", DescribeStatus(warm.status))));
      }
    }
  }

  // The same request on both paths, back to back, alternating which goes first.
  std::vector<double> gaps_direct, gaps_router, gap_diff;
  std::vector<double> per_token_direct, per_token_router, per_token_diff;
  std::vector<double> ttft_direct, ttft_router, ttft_diff;
  std::vector<double> e2e_direct, e2e_router, e2e_diff;
  int pairs = 0, errors = 0, mismatches = 0;
  int64_t tokens = 0;
  std::string first_error;
  for (int k = 0; k < args.requests; ++k) {
    const v1::GenerateRequest request =
        ArRequest(prompts->at(static_cast<size_t>(k) % prompts->size()).text, args.max_tokens);
    TimedStream direct, routed;
    if (k % 2 == 0) {
      direct = Direct(*verifier, request);
      routed = ThroughRouter(*router, request);
    } else {
      routed = ThroughRouter(*router, request);
      direct = Direct(*verifier, request);
    }
    if (!direct.ok() || !routed.ok()) {
      if (errors++ == 0) {
        first_error = DescribeStatus(direct.ok() ? routed.status : direct.status);
      }
      continue;
    }
    ++pairs;
    if (direct.tokens != routed.tokens) ++mismatches;
    tokens += static_cast<int64_t>(routed.tokens.size());
    const std::vector<double> d = direct.InterTokenLatencies();
    const std::vector<double> r = routed.InterTokenLatencies();
    gaps_direct.insert(gaps_direct.end(), d.begin(), d.end());
    gaps_router.insert(gaps_router.end(), r.begin(), r.end());
    for (size_t i = 0; i < std::min(d.size(), r.size()); ++i) gap_diff.push_back(r[i] - d[i]);
    per_token_direct.push_back(DecodePerToken(direct));
    per_token_router.push_back(DecodePerToken(routed));
    per_token_diff.push_back(per_token_router.back() - per_token_direct.back());
    ttft_direct.push_back(direct.FirstToken());
    ttft_router.push_back(routed.FirstToken());
    ttft_diff.push_back(ttft_router.back() - ttft_direct.back());
    e2e_direct.push_back(direct.end);
    e2e_router.push_back(routed.end);
    e2e_diff.push_back(e2e_router.back() - e2e_direct.back());
  }
  if (cluster) cluster->Stop();
  if (pairs == 0) {
    return fail(absl::UnavailableError(absl::StrCat("every request failed: ", first_error)));
  }

  struct Row {
    const char* name;
    const std::vector<double>* direct;
    const std::vector<double>* router;
    const std::vector<double>* diff;
  };
  const Row rows[] = {
      {"token_gap", &gaps_direct, &gaps_router, &gap_diff},
      {"decode_per_token", &per_token_direct, &per_token_router, &per_token_diff},
      {"ttft", &ttft_direct, &ttft_router, &ttft_diff},
      {"e2e", &e2e_direct, &e2e_router, &e2e_diff},
  };
  if (args.json) {
    nlohmann::json j = {
        {"server", cluster ? "local cluster" : router_address},
        {"pairs", pairs},
        {"errors", errors},
        {"first_error", first_error},
        {"token_mismatches", mismatches},
        {"max_tokens", args.max_tokens},
        {"tokens_per_path", tokens},
    };
    for (const Row& row : rows) {
      j[row.name] = {
          {"direct_p50_seconds", Quantile(*row.direct, 0.5)},
          {"direct_p99_seconds", Quantile(*row.direct, 0.99)},
          {"router_p50_seconds", Quantile(*row.router, 0.5)},
          {"router_p99_seconds", Quantile(*row.router, 0.99)},
          {"diff_p50_seconds", Quantile(*row.diff, 0.5)},
          {"diff_p99_seconds", Quantile(*row.diff, 0.99)},
          {"diff_mean_seconds", Mean(*row.diff)},
      };
    }
    std::printf("%s\n", j.dump(1).c_str());
    return errors > 0 || mismatches > 0 ? 1 : 0;
  }
  std::printf(
      "router overhead on loopback: %d request pairs (AR, greedy, %d tokens; one straight to the "
      "verifier, one through the router, alternating which goes first), %d errors, %d token "
      "mismatches\n\n",
      pairs, args.max_tokens, errors, mismatches);
  std::printf(
      "| quantity (ms) | direct p50 / p99 | through router p50 / p99 | router - direct, paired: "
      "p50 / p99 / mean |\n|---|---|---|---|\n");
  const char* labels[] = {"gap between streamed tokens", "decode time per token (per request)",
                          "time to first token", "end to end"};
  for (size_t i = 0; i < std::size(rows); ++i) {
    const Row& row = rows[i];
    std::printf("| %s | %.3f / %.3f | %.3f / %.3f | %.3f / %.3f / %.3f |\n", labels[i],
                Quantile(*row.direct, 0.5) * 1e3, Quantile(*row.direct, 0.99) * 1e3,
                Quantile(*row.router, 0.5) * 1e3, Quantile(*row.router, 0.99) * 1e3,
                Quantile(*row.diff, 0.5) * 1e3, Quantile(*row.diff, 0.99) * 1e3,
                Mean(*row.diff) * 1e3);
  }
  if (!first_error.empty()) std::printf("\nfirst error: %s\n", first_error.c_str());
  return errors > 0 || mismatches > 0 ? 1 : 0;
}

}  // namespace tandem::cli
