// tandem-verifier: serves the target model (tandem.v1.Verifier) to routers.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <random>

#include "CLI/CLI.hpp"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/periodic_thread.h"
#include "common/version.h"
#include "kernels/cpu/gemm.h"
#include "services/common/engine_metrics.h"
#include "services/common/hidden_transport.h"
#include "services/common/metrics.h"
#include "services/common/registry_publisher.h"
#include "services/common/server.h"
#include "services/verifier/grpc_draft_channel.h"
#include "services/verifier/verifier_service.h"
#include "worker/decoding/modes.h"
#include "worker/engine/calibration.h"
#include "worker/engine/engine.h"
#include "worker/model/device.h"

namespace {

struct Flags {
  std::string model;
  std::string drafter;
  std::string lora;        // LoRA adapter gated on isd / self_spec(_quadratic) draft positions
  std::string merge_lora;  // PEFT adapter merged into the weights (the served model)
  std::string default_mode = "ar";
  std::string tool_call_syntax = "auto";  // or a ToolCallSyntaxName
  std::string device = "cpu";
  bool cuda_graphs = true;
  std::string cpu_weights = "f32";
  int64_t kv_tokens = 65536;
  int max_batch_tokens = 1024;
  int max_mode_block = 64;
  int max_running = 64;
  int prefill_chunk = 256;
  int max_queued = 1024;
  int draft_timeout_ms = 50;
  int spec_gamma = 4;
  float diffusion_sampler = 0.0f;  // > 0: diffusion unmasks by the model's trained sampler
  bool adaptive_gamma = true;
  bool prefix_cache = true;
  tandem::HiddenTransportMode hidden_transport = tandem::HiddenTransportMode::kAuto;
  double calibration_seconds = 2;
  int threads = 0;
  int drain_seconds = 30;
  double watchdog_seconds = 30;
  std::string cluster_token_file;
  tandem::ServerFlags server;
  tandem::ClientFlags client_tls;
  tandem::MetricsFlags metrics;
  tandem::RegistryFlags registry;
};

std::string RandomWorkerId() {
  std::random_device random;
  return absl::StrFormat("verifier-%08x%08x", random(), random());
}

int Run(Flags flags) {
  absl::StatusOr<std::string> cluster_token = tandem::ReadClusterToken(flags.cluster_token_file);
  if (!cluster_token.ok()) {
    std::cerr << "tandem-verifier: --cluster-token-file: " << cluster_token.status().message()
              << "\n";
    return 1;
  }
  flags.client_tls.token = *cluster_token;  // sent to the drafters
  absl::StatusOr<tandem::DeviceOptions> device =
      tandem::ResolveDevice(flags.device, flags.cuda_graphs, flags.cpu_weights);
  if (!device.ok()) {
    std::cerr << "tandem-verifier: --device: " << device.status().message() << "\n";
    return 1;
  }
  const tandem::HiddenTransportEnd hidden_transport =
      tandem::LocalHiddenTransport(flags.hidden_transport);
  if (absl::Status usable = tandem::CheckHiddenTransportFlag(hidden_transport); !usable.ok()) {
    std::cerr << "tandem-verifier: " << usable.message() << "\n";
    return 1;
  }
  absl::StatusOr<tandem::LoadedModel> model =
      tandem::LoadModelDir(flags.model, *device, flags.merge_lora);
  if (!model.ok()) {
    std::cerr << "tandem-verifier: cannot load the model: " << model.status().message() << "\n";
    return 1;
  }
  if (flags.diffusion_sampler > 0.0f && model->sampler == nullptr) {
    std::cerr << "tandem-verifier: --diffusion-sampler needs the model's trained sampler, but "
              << flags.model << " has no sampler/ folder\n";
    return 1;
  }
  if (!flags.lora.empty()) {
    if (absl::Status attached = tandem::AttachLoraAdapter(*model, flags.lora); !attached.ok()) {
      std::cerr << "tandem-verifier: --lora: " << attached.message() << "\n";
      return 1;
    }
  }
  tandem::kernels::cpu::SetBlasThreads(flags.threads);
  // Created before the engine, which reports to it, and outliving it.
  tandem::ServiceMetrics metrics(tandem::MetricsRole::kVerifier);
  tandem::EngineMetricsObserver observer(&metrics);
  tandem::EngineOptions options;
  options.observer = &observer;
  options.kv_tokens = flags.kv_tokens;
  options.max_batch_tokens = flags.max_batch_tokens;
  options.max_mode_block = flags.max_mode_block;
  options.max_running = flags.max_running;
  options.prefill_chunk = flags.prefill_chunk;
  options.max_queued = flags.max_queued;
  options.default_mode = flags.default_mode;
  options.default_drafter = flags.drafter;
  options.draft_timeout = absl::Milliseconds(flags.draft_timeout_ms);
  options.adaptive_gamma = flags.adaptive_gamma;
  options.prefix_cache = flags.prefix_cache;
  // A named object, not a temporary: GCC 12 at -O3 warns (as an error) that the temporary's
  // std::function member may be destroyed uninitialised.
  tandem::DraftHiddenTransportOptions transport_options;
  transport_options.local = hidden_transport;
  transport_options.metrics = &metrics;
  absl::StatusOr<std::unique_ptr<tandem::Engine>> engine = tandem::Engine::Create(
      &*model, options, tandem::MakeGrpcDraftChannelFactory(flags.client_tls, transport_options));
  if (!engine.ok()) {
    std::cerr << "tandem-verifier: " << engine.status().message() << "\n";
    return 1;
  }
  if (flags.calibration_seconds > 0) {
    // Before serving, so that the first load report already carries a cost model.
    tandem::CalibrationOptions calibration;
    calibration.budget = absl::Seconds(flags.calibration_seconds);
    calibration.batch_sizes.erase(
        std::remove_if(calibration.batch_sizes.begin(), calibration.batch_sizes.end(),
                       [&](int size) { return size > flags.max_running; }),
        calibration.batch_sizes.end());
    if (calibration.batch_sizes.empty()) calibration.batch_sizes = {1};
    absl::StatusOr<tandem::CalibrationResult> calibrated = tandem::Calibrate(**engine, calibration);
    if (!calibrated.ok()) {
      std::cerr << "tandem-verifier: calibration: " << calibrated.status().message() << "\n";
      return 1;
    }
    std::cerr << "tandem-verifier: calibrated " << absl::StrJoin(calibrated->measured, ", ")
              << " with " << calibrated->requests << " requests in "
              << absl::FormatDuration(calibrated->took)
              << (calibrated->out_of_time ? " (out of time)" : "") << "\n";
    for (const std::string& skipped : calibrated->skipped) {
      std::cerr << "tandem-verifier: calibration skipped " << skipped << "\n";
    }
  }
  // With an adapter merged the verifier serves another model than the folder's: it gets its own
  // name (<model>+<adapter folder>).
  tandem::VerifierIdentity identity{
      .model_id = tandem::ServedModelId(flags.model, flags.merge_lora),
      .worker_id = RandomWorkerId(),
      .default_mode = flags.default_mode};
  if (flags.tool_call_syntax == "auto") {
    if (model->chat_template != nullptr) {
      identity.tool_call_syntax = model->chat_template->tool_call_syntax();
    }
  } else {
    // The flag's values are checked by the parser.
    identity.tool_call_syntax = *tandem::ToolCallSyntaxOf(flags.tool_call_syntax);
  }
  tandem::ModeOptions mode_defaults;
  mode_defaults.spec_gamma = flags.spec_gamma;
  mode_defaults.diffusion_sampler = flags.diffusion_sampler;
  mode_defaults.lora_drafts = !flags.lora.empty();
  tandem::VerifierService service(engine->get(), identity, mode_defaults, &metrics,
                                  absl::Seconds(flags.watchdog_seconds),
                                  tandem::ApiKeys({*cluster_token}));
  metrics.SetScrapeHook([engine = engine->get()](tandem::ServiceMetrics& m) {
    const tandem::EngineLoad load = engine->Load();
    m.SetQueueDepth(load.queued);
    m.SetRunningSequences(load.running);
    m.SetKvUsageRatio(load.kv_usage_ratio);
    m.SetPrefixCache(load.prefix_cache);
  });
  // The hook reads the engine: off before it goes.
  absl::Cleanup hook_off = [&metrics] { metrics.SetScrapeHook(nullptr); };
  if (!flags.metrics.listen.empty()) {
    absl::StatusOr<std::string> address = metrics.Serve(flags.metrics.listen);
    if (!address.ok()) {
      std::cerr << "tandem-verifier: " << address.status().message() << "\n";
      return 1;
    }
    tandem::AnnounceMetrics("tandem-verifier", *address);
  }
  absl::StatusOr<tandem::RunningServer> server = tandem::StartServer(flags.server, {&service});
  if (!server.ok()) {
    std::cerr << "tandem-verifier: " << server.status().message() << "\n";
    return 1;
  }
  tandem::AnnounceListening("tandem-verifier", server->address);
  // The watchdog: the health service follows the engine (NOT_SERVING while it is stalled), so
  // that probes and load balancers outside the router see what the router sees.
  tandem::PeriodicThread watchdog;
  if (flags.watchdog_seconds > 0) {
    watchdog.Start(absl::Seconds(1), [&service, &server, serving = true]() mutable {
      const bool now = !service.Stalled();
      if (now == serving) return;
      serving = now;
      std::cerr << "tandem-verifier: the engine "
                << (now ? "steps again; serving" : "has stalled with work; not serving") << "\n";
      tandem::SetServing(*server->server, now);
    });
  }
  std::unique_ptr<tandem::RegistryPublisher> registration;
  if (!flags.registry.redis.empty()) {
    const std::string advertise =
        flags.registry.advertise.empty() ? server->address : flags.registry.advertise;
    auto publisher = tandem::RegistryPublisher::Create(
        {.redis = flags.registry.redis,
         .auth = flags.registry.auth,
         .snapshot =
             [identity, advertise, engine = engine->get(),
              max_context = model->model->config().max_position_embeddings] {
               const tandem::EngineLoad load = engine->Load();
               return tandem::router::WorkerRecord{.role = "verifier",
                                                   .worker_id = identity.worker_id,
                                                   .address = advertise,
                                                   .model = identity.model_id,
                                                   .modes = tandem::ImplementedModes(),
                                                   .max_context = max_context,
                                                   .running = load.running,
                                                   .queued = load.queued,
                                                   .kv_usage_ratio = load.kv_usage_ratio,
                                                   .draining = load.draining};
             },
         .log_name = "tandem-verifier"});
    if (!publisher.ok()) {
      std::cerr << "tandem-verifier: " << publisher.status().message() << "\n";
      return 1;
    }
    registration = *std::move(publisher);
    registration->Start();
  }
  const int signo = tandem::WaitForShutdownSignal();
  std::cerr << "tandem-verifier: signal " << signo << ", draining\n";
  // Routers stop sending work as soon as the registration is gone.
  if (registration) registration->Stop();
  // Stop admitting, let running sequences finish (up to --drain-seconds), then stop.
  watchdog.Stop();
  tandem::SetNotServing(*server->server);
  (*engine)->Drain();
  const absl::Time give_up = absl::Now() + absl::Seconds(flags.drain_seconds);
  while (absl::Now() < give_up) {
    const tandem::EngineLoad load = (*engine)->Load();
    if (load.running == 0 && load.queued == 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  std::move(hook_off).Invoke();
  engine->reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem-verifier: serves a target model to Tandem routers (tandem.v1.Verifier)"};
  app.set_version_flag("--version", tandem::VersionString());
  Flags flags;
  app.add_option("--model", flags.model, "model directory (config.json, safetensors, tokenizer)")
      ->envname("TANDEM_VERIFIER_MODEL")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--drafter", flags.drafter,
                 "default drafter address (host:port) for spec requests that name none")
      ->envname("TANDEM_VERIFIER_DRAFTER");
  app.add_option("--lora", flags.lora,
                 "PEFT LoRA adapter directory that isd, self_spec and self_spec_quadratic run "
                 "on their draft (<|mask|>) rows only; verification keeps the base weights")
      ->envname("TANDEM_VERIFIER_LORA")
      ->check(CLI::ExistingDirectory);
  app.add_option("--merge-lora", flags.merge_lora,
                 "PEFT LoRA adapter directory merged into the model's weights at load: the "
                 "verifier serves the adapted model in every mode, named <model>+<adapter "
                 "folder> (e.g. the pcLLM adapter, which jacobi decodes in fewer forwards)")
      ->envname("TANDEM_VERIFIER_MERGE_LORA")
      ->check(CLI::ExistingDirectory);
  app.add_option("--default-mode", flags.default_mode, "mode of requests that ask for 'auto'")
      ->envname("TANDEM_VERIFIER_DEFAULT_MODE")
      ->capture_default_str();
  app.add_option("--tool-call-syntax", flags.tool_call_syntax,
                 "how the model writes tool calls, which the router constrains and parses: auto "
                 "(from the chat template), hermes, mistral or llama3_json")
      ->envname("TANDEM_VERIFIER_TOOL_CALL_SYNTAX")
      ->check(CLI::IsMember({"auto", "hermes", "mistral", "llama3_json"}))
      ->capture_default_str();
  app.add_option("--device", flags.device, "where the model runs: cpu (fp32) or cuda (bf16 GPU)")
      ->envname("TANDEM_VERIFIER_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--cuda-graphs", flags.cuda_graphs,
                 "with --device cuda: replay decode steps as CUDA graphs per batch-size bucket")
      ->envname("TANDEM_VERIFIER_CUDA_GRAPHS")
      ->capture_default_str();
  app.add_option("--cpu-weights", flags.cpu_weights, tandem::kCpuWeightsHelp)
      ->envname("TANDEM_VERIFIER_CPU_WEIGHTS")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--kv-tokens", flags.kv_tokens, "KV cache capacity in tokens (memory budget)")
      ->envname("TANDEM_VERIFIER_KV_TOKENS")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", flags.max_batch_tokens, "token budget of one forward")
      ->envname("TANDEM_VERIFIER_MAX_BATCH_TOKENS")
      ->capture_default_str();
  app.add_option("--max-mode-block", flags.max_mode_block,
                 "most tokens a request's block-like mode option (draft length, block size, "
                 "stride, gamma) may ask for; larger ones are refused as INVALID_ARGUMENT")
      ->envname("TANDEM_VERIFIER_MAX_MODE_BLOCK")
      ->capture_default_str();
  app.add_option("--max-running", flags.max_running, "most sequences decoded at once")
      ->envname("TANDEM_VERIFIER_MAX_RUNNING")
      ->capture_default_str();
  app.add_option("--prefill-chunk", flags.prefill_chunk, "longest prefill slice per step")
      ->envname("TANDEM_VERIFIER_PREFILL_CHUNK")
      ->capture_default_str();
  app.add_option("--max-queued", flags.max_queued,
                 "requests waiting beyond this are refused (RESOURCE_EXHAUSTED)")
      ->envname("TANDEM_VERIFIER_MAX_QUEUED")
      ->capture_default_str();
  app.add_option("--draft-timeout-ms", flags.draft_timeout_ms,
                 "how long a spec step waits for drafts before it takes an AR step")
      ->envname("TANDEM_VERIFIER_DRAFT_TIMEOUT_MS")
      ->capture_default_str();
  app.add_option("--spec-gamma", flags.spec_gamma, "default draft tokens per spec step")
      ->envname("TANDEM_VERIFIER_SPEC_GAMMA")
      ->capture_default_str();
  app.add_option("--diffusion-sampler", flags.diffusion_sampler,
                 "diffusion requests unmask by the model's trained sampler (its sampler/ "
                 "folder): slots whose probability of being final reaches this, in (0, 1]; 0 = "
                 "by the confidence threshold")
      ->check(CLI::Range(0.0f, 1.0f))
      ->envname("TANDEM_VERIFIER_DIFFUSION_SAMPLER")
      ->capture_default_str();
  app.add_option("--adaptive-gamma", flags.adaptive_gamma,
                 "choose each spec step's draft tokens from the live batch, up to the request's "
                 "(a request that names spec_gamma always gets it)")
      ->envname("TANDEM_VERIFIER_ADAPTIVE_GAMMA")
      ->capture_default_str();
  app.add_option("--prefix-cache", flags.prefix_cache,
                 "keep the KV of full blocks of committed tokens for later requests that begin "
                 "with the same tokens (on|off)")
      ->envname("TANDEM_VERIFIER_PREFIX_CACHE")
      ->capture_default_str();
  tandem::AddHiddenTransportFlag(app, &flags.hidden_transport, "TANDEM_VERIFIER");
  app.add_option("--calibration-seconds", flags.calibration_seconds,
                 "time bound of the start-up calibration of the cost model; 0 = none")
      ->envname("TANDEM_VERIFIER_CALIBRATION_SECONDS")
      ->capture_default_str();
  app.add_option("--threads", flags.threads, "CPU threads for matrix products; 0 = all cores")
      ->envname("TANDEM_VERIFIER_THREADS")
      ->capture_default_str();
  app.add_option("--watchdog-seconds", flags.watchdog_seconds,
                 "an engine that has had work and not stepped for this long is stalled: the "
                 "verifier reports itself not ready (load reports, health service) until it "
                 "steps again; 0 = off")
      ->envname("TANDEM_VERIFIER_WATCHDOG_SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--drain-seconds", flags.drain_seconds,
                 "on SIGTERM, how long running requests may take to finish")
      ->envname("TANDEM_VERIFIER_DRAIN_SECONDS")
      ->capture_default_str();
  tandem::AddServerFlags(app, &flags.server, "TANDEM_VERIFIER");
  tandem::AddClientTlsFlags(app, &flags.client_tls, "TANDEM_VERIFIER");
  tandem::AddMetricsFlags(app, &flags.metrics, "TANDEM_VERIFIER");
  tandem::AddRegistryFlags(app, &flags.registry, "TANDEM_VERIFIER");
  tandem::AddClusterTokenFlag(app, &flags.cluster_token_file);
  CLI11_PARSE(app, argc, argv);
  return Run(flags);
}
