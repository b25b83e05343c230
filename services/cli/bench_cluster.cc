#include "services/cli/bench_cluster.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/child_process.h"
#include "services/cli/locate.h"
#include "tandem/v1/verifier.grpc.pb.h"
#include "worker/engine/local_generator.h"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;

// Branches a chain of the branch-ahead drafter.
constexpr int kBenchBranches = 2;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct ForwardTimes {
  double verify = 0;  // one forward of gamma + 1 new tokens after a `context`-token prefix
  double draft = 0;   // gamma one-token forwards, each committed
};

// Times the target's forwards in this process, as the verifier and the drafter run them.
absl::StatusOr<ForwardTimes> TimeForwards(Transformer& model, int gamma, int context, int reps) {
  const int vocab = model.config().vocab_size;
  KvCache kv(model.KvOptions(context + gamma + 64 + reps * gamma));
  std::vector<int32_t> tokens(context);
  for (int i = 0; i < context; ++i) tokens[i] = (i * 7919) % vocab;
  std::vector<int32_t> positions(context);
  std::iota(positions.begin(), positions.end(), 0);
  const int32_t last = context - 1;
  if (!kv.AddSequence(0).ok() || !kv.Reserve(0, context)) {
    return absl::InternalError("bench KV cache too small");
  }
  Extend prefill{.seq = 0, .tokens = tokens, .positions = positions, .outputs = {&last, 1}};
  auto out = model.Forward({&prefill, 1}, kv);
  if (!out.ok()) return out.status();
  std::vector<int32_t> all(context);
  std::iota(all.begin(), all.end(), 0);
  if (auto s = kv.Commit(0, all); !s.ok()) return s;

  ForwardTimes times;
  std::vector<double> verify, draft;
  std::vector<int32_t> block(gamma + 1), block_pos(gamma + 1), block_out(gamma + 1);
  for (int r = 0; r < reps; ++r) {
    for (int i = 0; i <= gamma; ++i) {
      block[i] = (r * 31 + i * 17) % vocab;
      block_pos[i] = context + i;
      block_out[i] = i;
    }
    if (!kv.Reserve(0, gamma + 1)) return absl::InternalError("bench KV cache too small");
    Extend x{.seq = 0, .tokens = block, .positions = block_pos, .outputs = block_out};
    const auto start = Clock::now();
    auto v = model.Forward({&x, 1}, kv);
    verify.push_back(Seconds(start));
    if (!v.ok()) return v.status();
    if (auto s = kv.Commit(0, {}); !s.ok()) return s;  // drop: every rep sees the same prefix

    const auto draft_start = Clock::now();
    for (int i = 0; i < gamma; ++i) {
      const int32_t token = block[i];
      const int32_t position = context + i;
      const int32_t zero = 0;
      if (!kv.Reserve(0, 1)) return absl::InternalError("bench KV cache too small");
      Extend one{
          .seq = 0, .tokens = {&token, 1}, .positions = {&position, 1}, .outputs = {&zero, 1}};
      auto d = model.Forward({&one, 1}, kv);
      if (!d.ok()) return d.status();
      if (auto s = kv.Commit(0, std::vector<int32_t>{0}); !s.ok()) return s;
    }
    draft.push_back(Seconds(draft_start));
    if (auto s = kv.Truncate(0, context); !s.ok()) return s;
  }
  times.verify = Median(verify);
  times.draft = Median(draft);
  return times;
}

struct ClusterRun {
  double step_seconds = 0;  // median over prompts of decode time per target forward
  double tokens_per_forward = 0;
  double tokens_per_second = 0;
  int tokens = 0;
  int forwards = 0;
  int drafted = 0;
  int accepted = 0;
  int draft_steps = 0;         // steps that could verify drafts
  int drafts_ready = 0;        // of those, with the chain there when the verifier looked
  int drafts_waited = 0;       // of those, with a chain the verifier waited for
  int drafts_from_branch = 0;  // of the steps that verified drafts, those from a branch
};

double Share(int part, int whole) { return whole > 0 ? static_cast<double>(part) / whole : 0; }

// `prompts` through the verifier in `mode` (`spec`: from the drafter at `drafter`, "" = the
// verifier's own; `self_spec`: k = gamma).
absl::StatusOr<ClusterRun> RunThroughVerifier(v1::Verifier::Stub& stub,
                                              const std::vector<Prompt>& prompts,
                                              const std::string& mode, int gamma, int max_tokens,
                                              const std::string& drafter = "") {
  ClusterRun run;
  std::vector<double> steps;
  double decode_seconds = 0;
  int decode_tokens = 0;
  for (const Prompt& prompt : prompts) {
    v1::VerifyRequest request;
    request.mutable_request()->set_prompt(prompt.text);
    request.mutable_request()->set_max_tokens(max_tokens);
    request.mutable_request()->set_mode(mode);
    request.mutable_mode_options()->set_spec_gamma(gamma);
    request.mutable_mode_options()->set_self_spec_draft_len(gamma);
    request.set_drafter(drafter);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub.Generate(&context, request);
    v1::GenerateResponse response, last;
    int tokens = 0;
    while (reader->Read(&response)) {
      tokens += response.token_ids_size();
      if (!response.finish_reason().empty()) last = response;
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("verifier: ", status.error_message()));
    }
    const v1::Usage& usage = last.usage();
    const double decode =
        last.timings().total_seconds() - last.timings().time_to_first_token_seconds();
    if (usage.target_forwards() > 1) steps.push_back(decode / (usage.target_forwards() - 1));
    decode_seconds += decode;
    decode_tokens += std::max(0, tokens - 1);
    run.tokens += tokens;
    run.forwards += usage.target_forwards();
    run.drafted += usage.draft_tokens();
    run.accepted += usage.accepted_tokens();
    run.draft_steps += usage.draft_steps();
    run.drafts_ready += usage.drafts_ready();
    run.drafts_waited += usage.drafts_waited();
    run.drafts_from_branch += usage.drafts_from_branch();
  }
  run.step_seconds = Median(steps);
  run.tokens_per_forward = run.forwards > 0 ? static_cast<double>(run.tokens) / run.forwards : 0;
  run.tokens_per_second = decode_seconds > 0 ? decode_tokens / decode_seconds : 0;
  return run;
}

std::vector<double> LoopbackRoundTrips(v1::Verifier::Stub& stub, int calls) {
  std::vector<double> rtt;
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext context;
    v1::WorkerLoadRequest request;
    v1::WorkerLoad load;
    const auto start = Clock::now();
    if (stub.GetLoad(&context, request, &load).ok()) rtt.push_back(Seconds(start));
  }
  return rtt;
}

}  // namespace

int RunBenchCluster(const BenchClusterArgs& args) {
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "tandem bench cluster: %s\n", std::string(status.message()).c_str());
    return 1;
  };
  absl::StatusOr<std::string> model_dir = FindModelDir(args.model_dir);
  if (!model_dir.ok()) return fail(model_dir.status());
  const std::string prompts_file =
      args.prompts_file.empty() ? *model_dir + "/fixtures/bench_prompts.json" : args.prompts_file;
  absl::StatusOr<std::vector<Prompt>> prompts = LoadPrompts(prompts_file, args.prompts);
  if (!prompts.ok()) return fail(prompts.status());
  const int threads = args.threads > 0 ? args.threads : std::max(1, omp_get_num_procs() / 2);
  const std::string drafter_dir =
      args.drafter_dir.empty() ? DefaultDrafterDir(*model_dir) : args.drafter_dir;

  absl::StatusOr<std::string> drafter_bin = FindServiceBinary("tandem-drafter", "drafter");
  if (!drafter_bin.ok()) return fail(drafter_bin.status());
  absl::StatusOr<std::string> verifier_bin = FindServiceBinary("tandem-verifier", "verifier");
  if (!verifier_bin.ok()) return fail(verifier_bin.status());
  absl::StatusOr<LoadedModel> model = LoadModelDir(*model_dir);
  if (!model.ok()) return fail(model.status());
  // Split self-speculation needs a tri-mode target: its drafter hosts the target itself.
  const bool split = model->model->config().diffusion.mask_token_id.has_value() && args.gamma >= 1;
  auto start_drafter = [&](std::vector<std::string> flags)
      -> absl::StatusOr<std::pair<std::unique_ptr<ChildProcess>, std::string>> {
    std::vector<std::string> argv = {*drafter_bin, "--listen", "127.0.0.1:0", "--threads",
                                     std::to_string(threads)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start({.name = "drafter",
                             .argv = argv,
                             .forward_output = false,
                             .default_env = SharedCoresEnv()});
    if (!child.ok()) return child.status();
    absl::StatusOr<std::string> address = (*child)->WaitForAddress(absl::Seconds(60));
    if (!address.ok()) return address.status();
    return std::pair(std::move(*child), *address);
  };
  // The ways `spec` drafts, each from a drafter process of its own: the drafter's greedy chains;
  // the same with branch-ahead; and, for a tri-mode target, the target's own mask drafts (one
  // forward of the verifier's γ + 1 rows: self-speculation split across two services).
  struct Variant {
    std::string name;
    std::vector<std::string> flags;
    std::unique_ptr<ChildProcess> process;
    std::string address;
    bool mask_drafts = false;  // a draft is one forward of γ + 1 rows on the target
    ClusterRun run;
    double draft_seconds = 0;  // in-process
  };
  std::vector<Variant> variants;
  variants.push_back({.name = "drafter chains", .flags = {"--model", drafter_dir}});
  variants.push_back(
      {.name = absl::StrFormat("branch-ahead (%d branches)", kBenchBranches),
       .flags = {"--model", drafter_dir, "--branches", std::to_string(kBenchBranches)}});
  if (split) {
    variants.push_back(
        {.name = absl::StrFormat("split self-spec (k = %d)", args.gamma + 1),
         .flags = {"--model", *model_dir, "--mask-drafts", std::to_string(args.gamma + 1)},
         .mask_drafts = true});
  }
  for (Variant& v : variants) {
    auto started = start_drafter(v.flags);
    if (!started.ok()) return fail(started.status());
    v.process = std::move(started->first);
    v.address = started->second;
  }
  auto verifier = ChildProcess::Start(
      {.name = "verifier",
       .argv = {*verifier_bin, "--model", *model_dir, "--listen", "127.0.0.1:0", "--threads",
                std::to_string(threads), "--drafter", variants[0].address, "--draft-timeout-ms",
                std::to_string(args.draft_timeout_ms), "--calibration-seconds", "0"},
       .forward_output = false,
       .default_env = SharedCoresEnv()});
  if (!verifier.ok()) return fail(verifier.status());
  absl::StatusOr<std::string> verifier_address = (*verifier)->WaitForAddress(absl::Seconds(60));
  if (!verifier_address.ok()) return fail(verifier_address.status());
  auto stub = v1::Verifier::NewStub(
      grpc::CreateChannel(*verifier_address, grpc::InsecureChannelCredentials()));

  // Warm-up: the first requests pay for page faults, thread pools and drafter sessions.
  for (const Variant& v : variants) {
    if (auto warm = RunThroughVerifier(*stub, {prompts->front()}, "spec", args.gamma, 8, v.address);
        !warm.ok()) {
      return fail(warm.status());
    }
  }
  for (Variant& v : variants) {
    absl::StatusOr<ClusterRun> run =
        RunThroughVerifier(*stub, *prompts, "spec", args.gamma, args.max_tokens, v.address);
    if (!run.ok()) return fail(run.status());
    v.run = *run;
  }
  std::optional<ClusterRun> local_self_spec;
  if (split) {
    absl::StatusOr<ClusterRun> run =
        RunThroughVerifier(*stub, *prompts, "self_spec", args.gamma + 1, args.max_tokens);
    if (!run.ok()) return fail(run.status());
    local_self_spec = *run;
  }
  absl::StatusOr<ClusterRun> ar = RunThroughVerifier(*stub, *prompts, "ar", 0, args.max_tokens);
  if (!ar.ok()) return fail(ar.status());
  const std::vector<double> rtt = LoopbackRoundTrips(*stub, 200);
  verifier->reset();
  for (Variant& v : variants) v.process.reset();

  // The same forwards in this process, with one process's threads: verification on the
  // target, drafting on the drafter. A split self-spec draft is one forward of γ + 1 rows on
  // the target (the new tokens and the masks), like a verification.
  kernels::cpu::SetBlasThreads(threads);
  absl::StatusOr<ForwardTimes> times = TimeForwards(*model->model, args.gamma, 64, 30);
  if (!times.ok()) return fail(times.status());
  double chain_draft = times->draft;
  if (drafter_dir != *model_dir) {
    absl::StatusOr<LoadedModel> drafter_model = LoadModelDir(drafter_dir);
    if (!drafter_model.ok()) return fail(drafter_model.status());
    absl::StatusOr<ForwardTimes> drafter_times =
        TimeForwards(*drafter_model->model, args.gamma, 64, 30);
    if (!drafter_times.ok()) return fail(drafter_times.status());
    chain_draft = drafter_times->draft;
  }
  for (Variant& v : variants) v.draft_seconds = v.mask_drafts ? times->verify : chain_draft;

  auto overlap = [&](const Variant& v) {
    const double serial = v.draft_seconds + times->verify;
    return serial > 0 ? v.run.step_seconds / serial : 0;
  };
  const double rtt_p50 = Percentile(rtt, 0.5), rtt_p99 = Percentile(rtt, 0.99);
  if (args.json) {
    nlohmann::json j = {
        {"model", *model_dir},
        {"drafter", drafter_dir},
        {"gamma", args.gamma},
        {"threads_per_process", threads},
        {"prompts", prompts->size()},
        {"max_tokens", args.max_tokens},
        {"verify_seconds", times->verify},
        {"ar_step_seconds", ar->step_seconds},
        {"ar_tokens_per_second", ar->tokens_per_second},
        {"loopback_rtt_p50_seconds", rtt_p50},
        {"loopback_rtt_p99_seconds", rtt_p99},
    };
    for (const Variant& v : variants) {
      const ClusterRun& r = v.run;
      j["spec"].push_back({
          {"variant", v.name},
          {"draft_seconds", v.draft_seconds},
          {"step_seconds", r.step_seconds},
          {"overlap_ratio", overlap(v)},
          {"tokens_per_forward", r.tokens_per_forward},
          {"tokens_per_second", r.tokens_per_second},
          {"drafted", r.drafted},
          {"accepted", r.accepted},
          {"draft_steps", r.draft_steps},
          {"ready_on_arrival", Share(r.drafts_ready, r.draft_steps)},
          {"waited", Share(r.drafts_waited, r.draft_steps)},
          {"from_branch", Share(r.drafts_from_branch, r.draft_steps)},
      });
    }
    if (split) {
      j["self_spec_tokens_per_forward"] = local_self_spec->tokens_per_forward;
      j["self_spec_tokens_per_second"] = local_self_spec->tokens_per_second;
    }
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf(
      "speculation over loopback: target %s, drafter %s%s, gamma %d, %zu prompts x %d "
      "tokens, %d threads per process\n\n",
      model_dir->c_str(), drafter_dir.c_str(),
      drafter_dir == *model_dir ? " (self-drafting: an upper bound on acceptance)" : "", args.gamma,
      prompts->size(), args.max_tokens, threads);
  std::printf("| quantity |");
  for (const Variant& v : variants) std::printf(" spec, %s |", v.name.c_str());
  std::printf("\n|---|");
  for (size_t i = 0; i < variants.size(); ++i) std::printf("---|");
  std::printf("\n");
  auto row = [&](const char* name, const std::function<std::string(const Variant&)>& cell) {
    std::printf("| %s |", name);
    for (const Variant& v : variants) std::printf(" %s |", cell(v).c_str());
    std::printf("\n");
  };
  auto ms = [](double seconds) { return absl::StrFormat("%.2f ms", seconds * 1e3); };
  row("draft, in-process", [&](const Variant& v) {
    return v.mask_drafts ? absl::StrFormat("%s (1 forward)", ms(v.draft_seconds))
                         : absl::StrFormat("%s (%d forwards)", ms(v.draft_seconds), args.gamma);
  });
  row("verify: one forward of gamma + 1 tokens, in-process",
      [&](const Variant&) { return ms(times->verify); });
  row("spec step through the services", [&](const Variant& v) { return ms(v.run.step_seconds); });
  row("step / (draft + verify)",
      [&](const Variant& v) { return absl::StrFormat("%.2f", overlap(v)); });
  row("drafts ready on arrival / waited for / late", [](const Variant& v) {
    const ClusterRun& r = v.run;
    return absl::StrFormat("%.2f / %.2f / %.2f", Share(r.drafts_ready, r.draft_steps),
                           Share(r.drafts_waited, r.draft_steps),
                           Share(r.draft_steps - r.drafts_ready - r.drafts_waited, r.draft_steps));
  });
  row("steps drafting from a branch", [](const Variant& v) {
    return absl::StrFormat("%.2f", Share(v.run.drafts_from_branch, v.run.draft_steps));
  });
  row("tokens per target forward",
      [](const Variant& v) { return absl::StrFormat("%.2f", v.run.tokens_per_forward); });
  row("decode tokens/s",
      [](const Variant& v) { return absl::StrFormat("%.1f", v.run.tokens_per_second); });
  std::printf("\n| other modes through the verifier | value |\n|---|---|\n");
  if (split) {
    std::printf("| in-process self_spec (k = %d): tokens per target forward | %.2f |\n",
                args.gamma + 1, local_self_spec->tokens_per_forward);
    std::printf("| in-process self_spec decode tokens/s | %.1f |\n",
                local_self_spec->tokens_per_second);
  }
  std::printf("| AR step through the services | %.2f ms |\n", ar->step_seconds * 1e3);
  std::printf("| AR decode tokens/s | %.1f |\n", ar->tokens_per_second);
  std::printf("| loopback unary RPC round trip p50 / p99 | %.3f / %.3f ms |\n", rtt_p50 * 1e3,
              rtt_p99 * 1e3);
  return 0;
}

}  // namespace tandem::cli
