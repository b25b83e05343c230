// `tandem bench prefix` (see bench_prefix.h).
#include "services/cli/bench_prefix.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_stream.h"
#include "services/cli/local_cluster.h"
#include "services/cli/locate.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {

constexpr char kWho[] = "tandem bench prefix";
constexpr int kBlock = 16;  // the verifiers' default KV block size

struct Config {
  std::string name;
  std::vector<std::string> verifier_flags;
  std::vector<std::string> router_flags;
};

// One turn as the client saw it.
struct Turn {
  std::string prompt;
  TimedStream stream;
};

std::string SystemPrompt(int bytes) {
  static const char* const kRules[] = {
      "functions are small and named for what they return",
      "every public function has a one-line docstring",
      "errors are raised with a message a person can act on",
      "no global state; pass what a function needs",
      "tests name the behaviour they check",
  };
  std::string text = "# Project guidelines for the code below.\n";
  for (int i = 0; static_cast<int>(text.size()) < bytes; ++i) {
    text += absl::StrCat("# Rule ", i + 1, ": ", kRules[i % 5], ".\n");
  }
  return text;
}

std::string Question(int conversation, int turn) {
  static const char* const kTopics[] = {"mean", "median",         "largest gap", "running sum",
                                        "mode", "second largest", "range",       "product"};
  return absl::StrCat("\n# Request ", conversation, ".", turn, ": a function that returns the ",
                      kTopics[(conversation + turn) % 8], " of a list.\ndef task_", conversation,
                      "_", turn, "(values):\n");
}

// The turns of one conversation, each resending the history (greedy AR).
std::vector<Turn> Converse(v1::Generation::Stub& router, const std::string& system,
                           int conversation, const BenchPrefixArgs& args) {
  std::vector<Turn> turns;
  std::string history = system;
  for (int t = 1; t <= args.turns; ++t) {
    history += Question(conversation, t);
    v1::GenerateRequest request;
    request.set_prompt(history);
    request.set_mode("ar");
    request.set_max_tokens(args.max_tokens);
    request.mutable_sampling()->set_temperature(0);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    const BenchClock::time_point start = BenchClock::now();
    auto reader = router.Generate(&context, request);
    turns.push_back({history, ReadTimed(*reader, start)});
    if (!turns.back().stream.ok()) break;
    history += turns.back().stream.text;
  }
  return turns;
}

// One round of every conversation on one cluster, `concurrency` at a time; its wall time.
double RunRound(const std::string& router_address, const std::string& system, int round,
                const BenchPrefixArgs& args, std::vector<std::vector<Turn>>* out) {
  auto channel = grpc::CreateChannel(router_address, grpc::InsecureChannelCredentials());
  auto stub = v1::Generation::NewStub(channel);
  out->assign(args.conversations, {});
  std::atomic<int> next{0};
  const BenchClock::time_point start = BenchClock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < std::min(args.concurrency, args.conversations); ++c) {
    clients.emplace_back([&] {
      for (int i = next.fetch_add(1); i < args.conversations; i = next.fetch_add(1)) {
        (*out)[i] = Converse(*stub, system, round * args.conversations + i, args);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  return std::chrono::duration<double>(BenchClock::now() - start).count();
}

// A short request per verifier (too short to be cached or to steer the router): each
// process's first forward pays for its thread pool and first-touch memory outside the rounds.
void WarmUp(const LocalCluster& cluster) {
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(cluster.router_address(), grpc::InsecureChannelCredentials()));
  for (size_t v = 0; v < cluster.verifier_addresses().size(); ++v) {
    v1::GenerateRequest request;
    request.set_prompt(absl::StrCat("def warm_up_", v, "():"));
    request.set_mode("ar");
    request.set_max_tokens(4);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
    auto reader = stub->Generate(&context, request);
    ReadTimed(*reader, BenchClock::now());
  }
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// What an unbounded cache on one verifier could give each turn: the previous turn's prompt and
// completion (the system prompt for a first turn), in whole blocks, less the token the first
// step computes.
int64_t Shareable(const Tokenizer& tokenizer, const std::vector<int32_t>& system_tokens,
                  const std::vector<Turn>& turns) {
  int64_t total = 0;
  std::vector<int32_t> before = system_tokens;
  for (const Turn& turn : turns) {
    absl::StatusOr<std::vector<int32_t>> tokens = tokenizer.Encode(turn.prompt);
    if (!tokens.ok() || tokens->empty()) break;
    const size_t shared = std::min(CommonPrefix(*tokens, before), tokens->size() - 1);
    total += static_cast<int64_t>(shared / kBlock * kBlock);
    before = *tokens;
    // The completion's KV is cached too, all but its last token's.
    before.insert(before.end(), turn.stream.tokens.begin(), turn.stream.tokens.end());
    if (!before.empty()) before.pop_back();
  }
  return total;
}

struct Totals {
  std::vector<double> ttft;
  int64_t completion_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t shareable_tokens = 0;
  double seconds = 0;
  int failed = 0;
  int differing = 0;  // completions unlike the first configuration's
};

}  // namespace

int RunBenchPrefix(const BenchPrefixArgs& args) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", kWho, std::string(status.message()).c_str());
    return 1;
  };
  if (args.verifiers < 1 || args.conversations < 1 || args.turns < 1 || args.concurrency < 1 ||
      args.max_tokens < 1 || args.rounds < 1 || args.system_bytes < 0) {
    return fail(absl::InvalidArgumentError(
        "--verifiers, --conversations, --turns, --concurrency, --max-tokens and --rounds must be "
        ">= 1, --system-bytes >= 0"));
  }
  absl::StatusOr<std::string> model_dir = FindModelDir(args.model_dir);
  if (!model_dir.ok()) return fail(model_dir.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromFile(*model_dir + "/tokenizer.json");
  if (!tokenizer.ok()) return fail(tokenizer.status());

  std::vector<Config> configs = {
      {"cache off", {"--prefix-cache=false"}, {"--prefix-affinity=false"}},
      {"cache on", {}, {"--prefix-affinity=false"}}};
  if (args.verifiers > 1) {
    configs.push_back({"cache on + affinity",
                       {},
                       {absl::StrCat("--prefix-affinity-slack=", args.affinity_slack)}});
  }
  // The cores split among one cluster's verifiers: two verifiers with a thread per core each
  // spin against each other (on 2 cores that cost the least-loaded runs 5x their tokens/s).
  const int threads =
      args.threads > 0
          ? args.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / args.verifiers);
  std::vector<std::unique_ptr<LocalCluster>> clusters;
  for (const Config& config : configs) {
    std::vector<std::string> verifier_flags = {"--calibration-seconds", "0"};
    if (args.kv_tokens > 0) {
      verifier_flags.insert(verifier_flags.end(), {"--kv-tokens", std::to_string(args.kv_tokens)});
    }
    verifier_flags.insert(verifier_flags.end(), config.verifier_flags.begin(),
                          config.verifier_flags.end());
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
        LocalCluster::Start({.who = kWho,
                             .model_dir = *model_dir,
                             .metrics = false,
                             .threads = threads,
                             .verifiers = args.verifiers,
                             .verifier_flags = verifier_flags,
                             .router_flags = config.router_flags,
                             .forward_output = false});
    if (!cluster.ok()) return fail(cluster.status());
    WarmUp(**cluster);
    clusters.push_back(std::move(*cluster));
  }

  const std::string system = SystemPrompt(args.system_bytes);
  absl::StatusOr<std::vector<int32_t>> system_tokens = (*tokenizer)->Encode(system);
  if (!system_tokens.ok()) return fail(system_tokens.status());
  std::vector<Totals> totals(configs.size());
  for (int round = 0; round < args.rounds; ++round) {
    std::vector<std::vector<std::vector<Turn>>> results(configs.size());
    for (size_t k = 0; k < configs.size(); ++k) {
      // Alternating order: no configuration always runs first (or last) on a noisy machine.
      const size_t i = round % 2 == 0 ? k : configs.size() - 1 - k;
      totals[i].seconds +=
          RunRound(clusters[i]->router_address(), system, round, args, &results[i]);
    }
    for (size_t i = 0; i < configs.size(); ++i) {
      Totals& t = totals[i];
      for (size_t c = 0; c < results[i].size(); ++c) {
        const std::vector<Turn>& turns = results[i][c];
        t.failed += args.turns - static_cast<int>(turns.size());
        t.shareable_tokens += Shareable(**tokenizer, *system_tokens, turns);
        for (size_t n = 0; n < turns.size(); ++n) {
          const TimedStream& s = turns[n].stream;
          if (!s.ok()) {
            ++t.failed;
            std::fprintf(stderr, "%s: %s: %s\n", kWho, configs[i].name.c_str(),
                         DescribeStatus(s.status).c_str());
            continue;
          }
          t.ttft.push_back(s.FirstToken());
          t.completion_tokens += static_cast<int64_t>(s.tokens.size());
          t.prompt_tokens += s.usage.prompt_tokens();
          t.cached_tokens += s.usage.cached_tokens();
          const std::vector<Turn>& reference = results[0][c];
          if (n >= reference.size() || reference[n].stream.tokens != s.tokens) ++t.differing;
        }
      }
    }
  }

  const Totals& off = totals[0];
  auto per_second = [](const Totals& t) {
    return t.seconds > 0 ? static_cast<double>(t.completion_tokens) / t.seconds : 0.0;
  };
  auto ratio = [](int64_t a, int64_t b) {
    return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
  };
  nlohmann::json out = {{"verifiers", args.verifiers},
                        {"conversations_per_round", args.conversations},
                        {"turns", args.turns},
                        {"concurrency", args.concurrency},
                        {"rounds", args.rounds},
                        {"system_prompt_tokens", system_tokens->size()},
                        {"configurations", nlohmann::json::array()}};
  for (size_t i = 0; i < configs.size(); ++i) {
    const Totals& t = totals[i];
    out["configurations"].push_back(
        {{"name", configs[i].name},
         {"requests", t.ttft.size()},
         {"failed", t.failed},
         {"ttft_p50_seconds", Quantile(t.ttft, 0.5)},
         {"ttft_p99_seconds", Quantile(t.ttft, 0.99)},
         {"tokens_per_second", per_second(t)},
         {"prompt_tokens", t.prompt_tokens},
         {"cached_tokens", t.cached_tokens},
         {"hit_rate", ratio(t.cached_tokens, t.prompt_tokens)},
         {"shareable_rate", ratio(t.shareable_tokens, t.prompt_tokens)},
         {"ttft_p50_vs_off",
          Quantile(off.ttft, 0.5) > 0 ? Quantile(t.ttft, 0.5) / Quantile(off.ttft, 0.5) : 0.0},
         {"tokens_per_second_vs_off", per_second(off) > 0 ? per_second(t) / per_second(off) : 0.0},
         {"completions_unlike_cache_off", t.differing}});
  }
  if (args.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "%d verifier(s); %d conversations x %d turns per round, %d at a time, %d round(s); "
        "system prompt %zu tokens\n\n",
        args.verifiers, args.conversations, args.turns, args.concurrency, args.rounds,
        system_tokens->size());
    std::printf(
        "| configuration | TTFT p50 s | TTFT p99 s | tok/s | hit rate | shareable | "
        "TTFT p50 / off | tok/s / off | unlike off |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const nlohmann::json& c : out["configurations"]) {
      std::printf("| %s | %.3f | %.3f | %.1f | %.2f | %.2f | %.2f | %.2f | %d |\n",
                  c["name"].get<std::string>().c_str(), c["ttft_p50_seconds"].get<double>(),
                  c["ttft_p99_seconds"].get<double>(), c["tokens_per_second"].get<double>(),
                  c["hit_rate"].get<double>(), c["shareable_rate"].get<double>(),
                  c["ttft_p50_vs_off"].get<double>(), c["tokens_per_second_vs_off"].get<double>(),
                  c["completions_unlike_cache_off"].get<int>());
    }
  }
  int failed = 0;
  for (const Totals& t : totals) failed += t.failed;
  return failed > 0 ? 1 : 0;
}

}  // namespace tandem::cli
