#include "services/cli/bench_serve.h"

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/bench_stream.h"
#include "services/cli/child_process.h"
#include "services/cli/local_cluster.h"
#include "services/cli/locate.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::cli {

namespace {

constexpr char kWho[] = "tandem bench serve";
// The lossless fixed modes benchmarked by default, when the model serves them.
const char* const kDefaultFixedModes[] = {"ar", "spec", "self_spec", "jacobi"};
constexpr char kPlotScript[] = "tools/bench/plot_serve.py";
constexpr char kPython[] = "/usr/bin/python3";

double SecondsBetween(BenchClock::time_point from, BenchClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// One (mode, concurrency) cell.
struct Level {
  std::string mode;
  int concurrency = 0;
  int issued = 0;
  int completed = 0;
  int errors = 0;
  std::string first_error;
  // The measurement window, in which every client was busy: from the start until the first
  // client found no more work (--requests-per-level), or the level's duration (--duration).
  // Throughput counts the tokens that arrived inside it.
  double window_seconds = 0;
  double wall_seconds = 0;  // until the last request finished
  int64_t window_tokens = 0;
  int64_t output_tokens = 0;  // all completed requests
  std::vector<double> ttft, itl, e2e;
  std::map<std::string, int> served_modes;  // what the server reported per request

  double TokensPerSecond() const {
    return window_seconds > 0 ? static_cast<double>(window_tokens) / window_seconds : 0;
  }
  // Tokens/s over the mean tokens of a completed request: the rate at which the window's
  // token throughput completes requests (a count of completions inside the window would say
  // nothing when a request lasts about as long as the window).
  double RequestsPerSecond() const {
    return output_tokens > 0 ? TokensPerSecond() * completed / static_cast<double>(output_tokens)
                             : 0;
  }
};

v1::GenerateRequest MakeRequest(const std::string& prompt, const std::string& mode,
                                int max_tokens) {
  v1::GenerateRequest request;
  request.set_prompt(prompt);
  request.set_mode(mode);
  request.set_max_tokens(max_tokens);
  request.mutable_sampling()->set_temperature(0);  // greedy
  return request;
}

int RequestsFor(const BenchServeArgs& args, int concurrency) {
  if (args.requests_per_level > 0) return std::max(args.requests_per_level, concurrency);
  return std::max(16, 4 * concurrency);
}

// Closed loop: `concurrency` clients, each sending its next request when the previous one
// finished, until the level's requests (or its duration) are used up.
Level RunLevel(v1::Generation::Stub& stub, const std::vector<Prompt>& prompts,
               const std::string& mode, int concurrency, const BenchServeArgs& args) {
  Level level{.mode = mode, .concurrency = concurrency};
  const int requests = RequestsFor(args, concurrency);
  const bool timed = args.duration_seconds > 0;
  std::atomic<int> next{0};
  absl::Mutex mu;
  struct Done {
    double start = 0;  // seconds after the level started
    TimedStream stream;
  };
  std::vector<Done> done;
  double first_idle = -1;  // when the first client found no more work
  const BenchClock::time_point level_start = BenchClock::now();
  const BenchClock::time_point deadline =
      level_start + std::chrono::duration_cast<BenchClock::duration>(
                        std::chrono::duration<double>(args.duration_seconds));
  auto client = [&] {
    for (;;) {
      const BenchClock::time_point start = BenchClock::now();
      const int i = next.fetch_add(1);
      if (timed ? start >= deadline : i >= requests) {
        absl::MutexLock lock(&mu);
        const double idle = SecondsBetween(level_start, start);
        if (first_idle < 0 || idle < first_idle) first_idle = idle;
        return;
      }
      const Prompt& prompt = prompts[static_cast<size_t>(i) % prompts.size()];
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
      auto reader = stub.Generate(&context, MakeRequest(prompt.text, mode, args.max_tokens));
      TimedStream stream = ReadTimed(*reader, start);
      absl::MutexLock lock(&mu);
      done.push_back({SecondsBetween(level_start, start), std::move(stream)});
    }
  };
  std::vector<std::thread> clients;
  clients.reserve(static_cast<size_t>(concurrency));
  for (int c = 0; c < concurrency; ++c) clients.emplace_back(client);
  for (std::thread& t : clients) t.join();
  level.wall_seconds = SecondsBetween(level_start, BenchClock::now());
  level.window_seconds = timed ? args.duration_seconds : first_idle;

  for (const Done& d : done) {
    ++level.issued;
    const TimedStream& s = d.stream;
    if (!s.ok()) {
      if (level.errors++ == 0) level.first_error = DescribeStatus(s.status);
      continue;
    }
    ++level.completed;
    ++level.served_modes[s.mode.empty() ? "?" : s.mode];
    level.output_tokens += static_cast<int64_t>(s.tokens.size());
    for (const TimedStream::Chunk& chunk : s.chunks) {
      if (d.start + chunk.time <= level.window_seconds) level.window_tokens += chunk.tokens;
    }
    if (!s.chunks.empty()) level.ttft.push_back(s.FirstToken());
    const std::vector<double> itl = s.InterTokenLatencies();
    level.itl.insert(level.itl.end(), itl.begin(), itl.end());
    level.e2e.push_back(s.end);
  }
  return level;
}

nlohmann::json LevelJson(const Level& l) {
  return {
      {"mode", l.mode},
      {"concurrency", l.concurrency},
      {"requests", l.completed},
      {"errors", l.errors},
      {"first_error", l.first_error},
      {"served_modes", l.served_modes},
      {"output_tokens", l.output_tokens},
      {"window_seconds", l.window_seconds},
      {"window_tokens", l.window_tokens},
      {"wall_seconds", l.wall_seconds},
      {"tokens_per_second", l.TokensPerSecond()},
      {"requests_per_second", l.RequestsPerSecond()},
      {"ttft_p50_seconds", Quantile(l.ttft, 0.5)},
      {"ttft_p99_seconds", Quantile(l.ttft, 0.99)},
      {"itl_p50_seconds", Quantile(l.itl, 0.5)},
      {"itl_p99_seconds", Quantile(l.itl, 0.99)},
      {"e2e_p50_seconds", Quantile(l.e2e, 0.5)},
      {"e2e_p99_seconds", Quantile(l.e2e, 0.99)},
  };
}

std::string ServedModes(const Level& l) {
  std::vector<std::string> parts;
  for (const auto& [mode, count] : l.served_modes) {
    parts.push_back(l.served_modes.size() == 1 ? mode : absl::StrCat(mode, " ", count));
  }
  return absl::StrJoin(parts, ", ");
}

void PrintRow(const Level& l) {
  auto ms = [](const std::vector<double>& v, double q) { return Quantile(v, q) * 1e3; };
  std::printf(
      "| %d | %s | %s | %d | %d | %.1f | %.2f | %.1f / %.1f | %.2f / %.2f | %.0f / %.0f |\n",
      l.concurrency, l.mode.c_str(), ServedModes(l).c_str(), l.completed, l.errors,
      l.TokensPerSecond(), l.RequestsPerSecond(), ms(l.ttft, 0.5), ms(l.ttft, 0.99), ms(l.itl, 0.5),
      ms(l.itl, 0.99), ms(l.e2e, 0.5), ms(l.e2e, 0.99));
  std::fflush(stdout);
}

struct Ratio {
  int concurrency = 0;
  double auto_tps = 0;
  std::string best_mode;
  double best_tps = 0;
  double ratio = 0;
  bool pass = false;
};

// Runs `/usr/bin/python3 tools/bench/plot_serve.py JSON PNG`. A message saying why not (and how
// to make the plot by hand) when it cannot.
absl::Status Plot(const std::string& json_path, const std::string& png_path) {
  absl::StatusOr<std::string> script = FindRepoFile(kPlotScript);
  if (!script.ok()) return script.status();
  auto child = ChildProcess::Start({.name = "plot script",
                                    .argv = {kPython, *script, json_path, png_path},
                                    .forward_output = false});
  const std::string by_hand =
      absl::StrCat("; to plot by hand: ", kPython, " ", kPlotScript, " ", json_path, " ", png_path);
  if (!child.ok()) return absl::UnavailableError(absl::StrCat(child.status().message(), by_hand));
  std::optional<int> status = (*child)->WaitForExit(absl::Seconds(120));
  if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "the plot script ",
        status ? ChildProcess::DescribeExit(*status) : std::string("did not finish in 120 s"), ": ",
        (*child)->StderrTail(), by_hand));
  }
  return absl::OkStatus();
}

}  // namespace

int RunBenchServe(const BenchServeArgs& args) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", kWho, std::string(status.message()).c_str());
    return 1;
  };
  if (args.concurrency.empty()) return fail(absl::InvalidArgumentError("--concurrency is empty"));
  for (int c : args.concurrency) {
    if (c < 1) return fail(absl::InvalidArgumentError("--concurrency levels must be >= 1"));
  }
  std::string prompts_file = args.prompts_file;
  if (prompts_file.empty()) {
    absl::StatusOr<std::string> model_dir = FindModelDir(args.model_dir);
    if (!model_dir.ok()) return fail(model_dir.status());
    prompts_file = *model_dir + "/fixtures/bench_prompts.json";
  }
  absl::StatusOr<std::vector<Prompt>> prompts = LoadPrompts(prompts_file, 0);
  if (!prompts.ok()) return fail(prompts.status());

  std::unique_ptr<LocalCluster> cluster;
  std::string address = args.server;
  if (address.empty()) {
    if (!args.json) std::fprintf(stderr, "%s: starting a local cluster\n", kWho);
    auto started = LocalCluster::Start({.who = kWho,
                                        .model_dir = args.model_dir,
                                        .drafter_model_dir = args.drafter_dir,
                                        .metrics = false,
                                        .threads = args.threads,
                                        .forward_output = false});
    if (!started.ok()) return fail(started.status());
    cluster = std::move(*started);
    address = cluster->router_address();
  }
  auto channel = MakeChannel(address, args.tls);
  if (!channel.ok()) return fail(channel.status());
  auto stub = v1::Generation::NewStub(*channel);

  // The modes the cluster serves, to pick the defaults and to refuse unknown ones up front.
  v1::ListModelsResponse models;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status status = stub->ListModels(&context, {}, &models);
    if (!status.ok()) {
      return fail(absl::UnavailableError(
          absl::StrCat("ListModels at ", address, ": ", DescribeStatus(status))));
    }
    if (models.models_size() == 0) {
      return fail(absl::UnavailableError(absl::StrCat(address, " serves no model")));
    }
  }
  const auto& served = models.models(0).modes();
  auto is_served = [&served](const std::string& mode) {
    return mode == "auto" || std::find(served.begin(), served.end(), mode) != served.end();
  };
  std::vector<std::string> modes = args.modes;
  if (modes.empty()) {
    for (const char* mode : kDefaultFixedModes) {
      if (is_served(mode)) modes.push_back(mode);
    }
    modes.push_back("auto");
  }
  for (size_t i = 0; i < modes.size(); ++i) {
    const std::string& mode = modes[i];
    if (std::find(modes.begin(), modes.begin() + static_cast<std::ptrdiff_t>(i), mode) !=
        modes.begin() + static_cast<std::ptrdiff_t>(i)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' is listed twice")));
    }
    if (!is_served(mode)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' is not served by ",
                                                          address, " (it serves: auto, ",
                                                          absl::StrJoin(served, ", "), ")")));
    }
  }

  // Warm-up: the first requests of each mode pay for page faults, thread pools, drafter
  // sessions.
  for (const std::string& mode : modes) {
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
      auto reader = stub->Generate(&context, MakeRequest(prompts->at(i % prompts->size()).text,
                                                         mode, std::min(8, args.max_tokens)));
      TimedStream warm = ReadTimed(*reader, BenchClock::now());
      if (!warm.ok()) {
        return fail(absl::UnavailableError(
            absl::StrCat("warm-up request in mode ", mode, ": ", DescribeStatus(warm.status))));
      }
    }
  }

  const std::string model_label = cluster ? cluster->model_dir() : models.models(0).id();
  if (!args.json) {
    std::printf(
        "serving under load: %s, %zu prompts, %d tokens each, greedy; %s per level\n",
        cluster ? absl::StrCat("local cluster (", model_label, ")").c_str() : address.c_str(),
        prompts->size(), args.max_tokens,
        args.duration_seconds > 0
            ? absl::StrCat(args.duration_seconds, " s").c_str()
            : (args.requests_per_level > 0
                   ? absl::StrCat(args.requests_per_level, " requests").c_str()
                   : "max(16, 4 x C) requests"));
    std::printf(
        "tokens/s over the window in which all C clients were busy; requests/s = tokens/s / "
        "mean tokens per request; latencies over every request, in ms\n\n");
    std::printf(
        "| C | mode | served as | requests | errors | tokens/s | requests/s | TTFT p50 / p99 | "
        "ITL p50 / p99 | E2E p50 / p99 |\n|---|---|---|---|---|---|---|---|---|---|\n");
  }
  std::vector<Level> levels;
  std::vector<Ratio> ratios;
  bool broken = false;
  for (int concurrency : args.concurrency) {
    Ratio ratio{.concurrency = concurrency};
    bool have_auto = false;
    for (const std::string& mode : modes) {
      Level level = RunLevel(*stub, *prompts, mode, concurrency, args);
      if (level.completed == 0) {
        broken = true;
        std::fprintf(stderr, "%s: every request failed in mode %s at concurrency %d: %s\n", kWho,
                     mode.c_str(), concurrency, level.first_error.c_str());
      }
      if (!args.json) PrintRow(level);
      if (mode == "auto") {
        have_auto = true;
        ratio.auto_tps = level.TokensPerSecond();
      } else if (level.TokensPerSecond() > ratio.best_tps) {
        ratio.best_tps = level.TokensPerSecond();
        ratio.best_mode = mode;
      }
      levels.push_back(std::move(level));
    }
    if (have_auto && ratio.best_tps > 0) {
      ratio.ratio = ratio.auto_tps / ratio.best_tps;
      ratio.pass = ratio.ratio >= args.threshold;
      ratios.push_back(ratio);
    }
  }

  nlohmann::json j = {
      {"server", cluster ? "local cluster" : address},
      {"model", model_label},
      {"drafter_model", cluster ? cluster->drafter_model_dir() : ""},
      {"prompts", prompts->size()},
      {"max_tokens", args.max_tokens},
      {"requests_per_level", args.requests_per_level},
      {"duration_seconds", args.duration_seconds},
      {"concurrency", args.concurrency},
      {"modes", modes},
      {"threshold", args.threshold},
      {"cpus", std::thread::hardware_concurrency()},
      {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
  };
  j["levels"] = nlohmann::json::array();
  for (const Level& l : levels) j["levels"].push_back(LevelJson(l));
  j["auto_vs_best"] = nlohmann::json::array();
  for (const Ratio& r : ratios) {
    j["auto_vs_best"].push_back({{"concurrency", r.concurrency},
                                 {"auto_tokens_per_second", r.auto_tps},
                                 {"best_mode", r.best_mode},
                                 {"best_tokens_per_second", r.best_tps},
                                 {"ratio", r.ratio},
                                 {"pass", r.pass}});
  }

  if (!args.json && !ratios.empty()) {
    std::printf(
        "\n| C | auto tokens/s | best fixed mode | its tokens/s | auto / best | >= %.2f |\n",
        args.threshold);
    std::printf("|---|---|---|---|---|---|\n");
    for (const Ratio& r : ratios) {
      std::printf("| %d | %.1f | %s | %.1f | %.3f | %s |\n", r.concurrency, r.auto_tps,
                  r.best_mode.c_str(), r.best_tps, r.ratio, r.pass ? "PASS" : "FAIL");
    }
  }
  if (cluster) cluster->Stop();

  if (!args.out_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(args.out_dir, error);
    const std::string json_path = (std::filesystem::path(args.out_dir) / "serve.json").string();
    const std::string png_path = (std::filesystem::path(args.out_dir) / "serve.png").string();
    std::ofstream out(json_path);
    out << j.dump(1) << "\n";
    out.close();
    if (!out) return fail(absl::UnavailableError(absl::StrCat("cannot write ", json_path)));
    absl::Status plotted = Plot(json_path, png_path);
    // With --json stdout carries the JSON only; the file notes go to stderr.
    FILE* notes = args.json ? stderr : stdout;
    std::fprintf(notes, "\n%s: wrote %s\n", kWho, json_path.c_str());
    if (plotted.ok()) {
      std::fprintf(notes, "%s: wrote %s\n", kWho, png_path.c_str());
    } else {
      std::fprintf(stderr, "%s: no plot: %s\n", kWho, std::string(plotted.message()).c_str());
    }
  }
  if (args.json) std::printf("%s\n", j.dump(1).c_str());
  return broken ? 1 : 0;
}

}  // namespace tandem::cli
