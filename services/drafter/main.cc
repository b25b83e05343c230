// `tandem-drafter`: serves the Drafter API (proto/tandem/v1/drafter.proto) over an AR draft
// model or a DFlash block drafter: draft chains for the sessions of every verifier that connects.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/cleanup/cleanup.h"
#include "kernels/cpu/gemm.h"
#include "services/common/engine_metrics.h"
#include "services/common/hidden_transport.h"
#include "services/common/metrics.h"
#include "services/common/registry_publisher.h"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "worker/engine/draft_engine.h"
#include "worker/model/dflash.h"
#include "worker/model/transformer.h"
#include "worker/tokenizer/tokenizer.h"

namespace {

// The command line's own flags (the engine's, server's, metrics' and registry's go to their
// option structs).
struct Flags {
  std::string model_dir;
  std::string target_dir;  // a DFlash drafter's target
  std::string merge_lora;  // PEFT adapter merged into the weights the drafter loads
  int threads = 0;
  std::string device = "cpu";
  bool cuda_graphs = true;
  std::string cpu_weights = "f32";
  std::string cluster_token_file;
};

int Run(const Flags& flags, tandem::DraftEngineOptions engine_options,
        tandem::HiddenTransportMode hidden_transport_mode, const tandem::ServerFlags& server_flags,
        const tandem::MetricsFlags& metrics_flags, const tandem::RegistryFlags& registry_flags) {
  const std::string& model_dir = flags.model_dir;
  const std::string& target_dir = flags.target_dir;
  absl::StatusOr<std::string> cluster_token = tandem::ReadClusterToken(flags.cluster_token_file);
  if (!cluster_token.ok()) {
    std::fprintf(stderr, "tandem-drafter: --cluster-token-file: %s\n",
                 std::string(cluster_token.status().message()).c_str());
    return 1;
  }
  if (flags.threads > 0) omp_set_num_threads(flags.threads);
  tandem::kernels::cpu::SetBlasThreads(flags.threads);
  // A DFlash drafter runs on the target's embeddings and head: `model` is then the target.
  const bool dflash = tandem::IsDFlashCheckpoint(model_dir);
  if (dflash && target_dir.empty()) {
    std::fprintf(stderr,
                 "tandem-drafter: '%s' is a DFlash drafter; give its target with --target-model\n",
                 model_dir.c_str());
    return 1;
  }
  absl::StatusOr<tandem::DeviceOptions> device =
      tandem::ResolveDevice(flags.device, flags.cuda_graphs, flags.cpu_weights);
  if (!device.ok()) {
    std::fprintf(stderr, "tandem-drafter: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  const tandem::HiddenTransportEnd hidden_transport =
      tandem::LocalHiddenTransport(hidden_transport_mode);
  if (absl::Status usable = tandem::CheckHiddenTransportFlag(hidden_transport); !usable.ok()) {
    std::fprintf(stderr, "tandem-drafter: %s\n", std::string(usable.message()).c_str());
    return 1;
  }
  // The weights it loads (a DFlash drafter's target's), with --merge-lora merged into them.
  const std::string& weights_dir = dflash ? target_dir : model_dir;
  absl::StatusOr<std::unique_ptr<tandem::Transformer>> model =
      tandem::Transformer::Load(weights_dir, device->cpu_weights, flags.merge_lora);
  if (!model.ok()) {
    std::fprintf(stderr, "tandem-drafter: cannot load the model in '%s': %s\n", weights_dir.c_str(),
                 model.status().ToString().c_str());
    return 1;
  }
  // A DFlash drafter runs none of the target's layers: the target stays on the CPU and the
  // drafter uploads its embeddings and head itself (DFlashModel::UseDevice below). On the CPU
  // the drafter's products take the target's weight type (--cpu-weights).
  if (absl::Status moved = (*model)->UseDevice(dflash ? tandem::DeviceOptions{} : *device);
      !moved.ok()) {
    std::fprintf(stderr, "tandem-drafter: --device: %s\n", moved.ToString().c_str());
    return 1;
  }
  std::unique_ptr<tandem::DFlashModel> dflash_model;
  if (dflash) {
    absl::StatusOr<std::unique_ptr<tandem::DFlashModel>> loaded =
        tandem::DFlashModel::Load(model_dir, model->get());
    if (!loaded.ok()) {
      std::fprintf(stderr, "tandem-drafter: cannot load the DFlash drafter in '%s': %s\n",
                   model_dir.c_str(), loaded.status().ToString().c_str());
      return 1;
    }
    dflash_model = *std::move(loaded);
    if (absl::Status moved = dflash_model->UseDevice(*device); !moved.ok()) {
      std::fprintf(stderr, "tandem-drafter: --device: %s\n", moved.ToString().c_str());
      return 1;
    }
    engine_options.dflash = dflash_model.get();
  }
  // Created before the engine, which reports its steps to it, and outliving it.
  tandem::ServiceMetrics metrics(tandem::MetricsRole::kDrafter);
  tandem::EngineMetricsObserver observer(&metrics);
  engine_options.observer = &observer;
  absl::StatusOr<std::unique_ptr<tandem::DraftEngine>> engine =
      tandem::DraftEngine::Create(model->get(), engine_options);
  if (!engine.ok()) {
    std::fprintf(stderr, "tandem-drafter: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  // Scrapes run one at a time, so the hook may remember the forwards counted so far.
  metrics.SetScrapeHook([engine = engine->get(),
                         counted = tandem::DraftEngineStats{}](tandem::ServiceMetrics& m) mutable {
    const tandem::DraftEngineStats stats = engine->Stats();
    m.SetDrafterSessions(stats.sessions);
    m.SetKvUsageRatio(stats.kv_usage_ratio);
    m.SetPrefixCache(stats.prefix_cache);
    m.AddDrafterForwards(stats.forwards - counted.forwards);
    m.AddDrafterBranches(stats.branches - counted.branches,
                         stats.branch_tokens - counted.branch_tokens,
                         stats.branch_hits - counted.branch_hits);
    counted = stats;
  });
  // The hook reads the engine: off before it goes.
  absl::Cleanup hook_off = [&metrics] { metrics.SetScrapeHook(nullptr); };
  if (!metrics_flags.listen.empty()) {
    absl::StatusOr<std::string> address = metrics.Serve(metrics_flags.listen);
    if (!address.ok()) {
      std::fprintf(stderr, "tandem-drafter: %s\n", address.status().ToString().c_str());
      return 1;
    }
    tandem::AnnounceMetrics("tandem-drafter", *address);
  }
  // A DFlash drafter on the GPU takes hidden states received by NCCL straight from GPU memory.
  tandem::DeviceHiddenSink device_sink;
  if (dflash_model != nullptr && dflash_model->device() == tandem::Device::kCuda &&
      hidden_transport.nccl) {
    absl::StatusOr<tandem::DeviceHiddenSink> sink = tandem::NewDeviceHiddenSink();
    if (sink.ok()) {
      device_sink = *std::move(sink);
    } else {
      std::fprintf(stderr,
                   "tandem-drafter: hidden states received by NCCL pass through the host: %s\n",
                   std::string(sink.status().message()).c_str());
    }
  }
  // Structured output: a session with a grammar drafts under it, over the checkpoint's
  // tokenizer (the DFlash path drafts free text).
  std::unique_ptr<tandem::GrammarCompiler> grammars;
  if (!dflash) {
    absl::StatusOr<std::unique_ptr<tandem::Tokenizer>> tokenizer =
        tandem::Tokenizer::FromFile(model_dir + "/tokenizer.json");
    if (tokenizer.ok()) {
      const tandem::ModelConfig& config = (*model)->config();
      grammars = std::make_unique<tandem::GrammarCompiler>(
          tandem::GrammarTokenBytes(**tokenizer, config.vocab_size), config.vocab_size,
          config.eos_token_ids);
    } else {
      std::fprintf(stderr,
                   "tandem-drafter: no tokenizer (%s): sequences with structured output get "
                   "free-text drafts\n",
                   std::string(tokenizer.status().message()).c_str());
    }
  }
  const std::string worker_id = tandem::MakeWorkerId("drafter");
  // The model it hosts and the one it drafts for: a DFlash drafter's target, or its own model
  // when it drafts with that model's mask rows (split self-speculation); generic otherwise. A
  // merged adapter makes another model of the weights it loaded, named as the verifier names it.
  const std::string hosted =
      tandem::ServedModelId(model_dir, dflash ? std::string() : flags.merge_lora);
  const std::string target = dflash ? tandem::ServedModelId(target_dir, flags.merge_lora)
                             : engine_options.mask_drafts > 0 ? hosted
                                                              : std::string();
  tandem::DrafterService service(engine->get(), {.model_id = hosted,
                                                 .worker_id = worker_id,
                                                 .hidden_transport = hidden_transport,
                                                 .device_sink = std::move(device_sink),
                                                 .metrics = &metrics,
                                                 .peers = tandem::ApiKeys({*cluster_token}),
                                                 .grammars = grammars.get()});
  absl::StatusOr<tandem::RunningServer> server = tandem::StartServer(server_flags, {&service});
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-drafter: %s\n", server.status().ToString().c_str());
    return 1;
  }
  tandem::AnnounceListening("tandem-drafter", server->address);
  std::unique_ptr<tandem::RegistryPublisher> registration;
  if (!registry_flags.redis.empty()) {
    const std::string advertise =
        registry_flags.advertise.empty() ? server->address : registry_flags.advertise;
    auto publisher = tandem::RegistryPublisher::Create(
        {.redis = registry_flags.redis,
         .auth = registry_flags.auth,
         .snapshot =
             [worker_id, advertise, model = hosted, engine = engine->get(), target] {
               const tandem::DraftEngineStats stats = engine->Stats();
               return tandem::router::WorkerRecord{
                   .role = "drafter",
                   .worker_id = worker_id,
                   .address = advertise,
                   .model = model,
                   .modes = {engine->drafting()},
                   .max_context = engine->model_config().max_position_embeddings,
                   .target = target,
                   .running = stats.sessions,
                   .kv_usage_ratio = stats.kv_usage_ratio};
             },
         .log_name = "tandem-drafter"});
    if (!publisher.ok()) {
      std::fprintf(stderr, "tandem-drafter: %s\n", publisher.status().ToString().c_str());
      return 1;
    }
    registration = *std::move(publisher);
    registration->Start();
  }
  tandem::WaitForShutdownSignal();
  if (registration) registration->Stop();
  service.SetDraining();
  tandem::SetNotServing(*server->server);
  // Drafts are only proposals: open streams are cancelled rather than waited for (their
  // verifiers fall back to AR steps).
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server->server->Wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem-drafter: drafts greedy token chains for verifiers (Drafter gRPC API)."};
  Flags flags;
  tandem::DraftEngineOptions engine_options;
  tandem::ServerFlags server_flags;
  app.add_option("--model", flags.model_dir,
                 "Checkpoint directory of the draft model: an AR model, or a DFlash drafter "
                 "(architectures TandemDFlashDrafter; needs --target-model)")
      ->envname("TANDEM_DRAFTER_MODEL")
      ->required();
  app.add_option("--target-model", flags.target_dir,
                 "DFlash drafters: the target's checkpoint directory (its embeddings and LM head "
                 "are the drafter's). The drafter then asks verifiers for the hidden states of "
                 "its dflash.target_layer_ids and drafts blocks conditioned on them")
      ->envname("TANDEM_DRAFTER_TARGET_MODEL");
  app.add_option("--merge-lora", flags.merge_lora,
                 "PEFT LoRA adapter directory merged into the weights at load (a DFlash "
                 "drafter's: its target's), as the verifier's --merge-lora: give both the same "
                 "adapter, so that the drafter drafts for the model the verifier serves, named "
                 "<model>+<adapter folder>")
      ->envname("TANDEM_DRAFTER_MERGE_LORA")
      ->check(CLI::ExistingDirectory);
  app.add_option("--kv-tokens", engine_options.kv_tokens,
                 "KV cache capacity in tokens, all sessions together (at least the model's "
                 "context)")
      ->envname("TANDEM_DRAFTER_KV_TOKENS")
      ->capture_default_str();
  app.add_option("--max-sessions", engine_options.max_sessions,
                 "Open drafting sessions at most; further opens get an error chain")
      ->envname("TANDEM_DRAFTER_MAX_SESSIONS")
      ->capture_default_str();
  app.add_option("--max-batch-tokens", engine_options.max_batch_tokens,
                 "Token budget of one batched forward")
      ->envname("TANDEM_DRAFTER_MAX_BATCH_TOKENS")
      ->capture_default_str();
  app.add_option("--prefix-cache", engine_options.prefix_cache,
                 "keep the KV of full blocks of session tokens for later sessions that begin "
                 "with the same tokens (on|off)")
      ->envname("TANDEM_DRAFTER_PREFIX_CACHE")
      ->capture_default_str();
  app.add_option("--hidden-layers", engine_options.hidden_layers,
                 "Target layers (comma-separated, e.g. 1,3) whose hidden states verifiers send "
                 "with every final token, for drafters conditioned on them (DFlash-style). The "
                 "AR draft model ignores them: set this only to test the transport (a DFlash "
                 "drafter sets them itself)")
      ->envname("TANDEM_DRAFTER_HIDDEN_LAYERS")
      ->delimiter(',');
  app.add_option("--mask-drafts", engine_options.mask_drafts,
                 "Draft K tokens a forward with the model's block-diffusion pathway (<|mask|> "
                 "rows after the newest token) instead of one greedy token a forward. With the "
                 "verifier's own tri-mode target as --model this is self-speculation split "
                 "across two services (NLD linear self-speculation: the verifier verifies with "
                 "its AR pathway). 0 = off; needs a <|mask|> token")
      ->envname("TANDEM_DRAFTER_MASK_DRAFTS")
      ->check(CLI::Range(0, tandem::kMaxMaskDrafts))
      ->capture_default_str();
  app.add_option("--branches", engine_options.branches,
                 "Branch-ahead drafting: once a session's chain reaches its lookahead, draft up to "
                 "this many alternative chains for its likeliest partial acceptances (the "
                 "accepted drafts, the runner-up token at the first refused one, then gamma "
                 "more), so that a partially accepted step finds its next draft ready. 0 = off")
      ->envname("TANDEM_DRAFTER_BRANCHES")
      ->check(CLI::Range(0, tandem::kMaxBranches))
      ->capture_default_str();
  app.add_option("--threads", flags.threads,
                 "CPU threads (OpenMP and matrix products); 0 = all cores")
      ->envname("TANDEM_DRAFTER_THREADS")
      ->capture_default_str();
  app.add_option("--device", flags.device,
                 "Where the draft model runs: cpu (fp32) or cuda (bf16 GPU)")
      ->envname("TANDEM_DRAFTER_DEVICE")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--cuda-graphs", flags.cuda_graphs,
                 "With --device cuda: replay decode steps as CUDA graphs per batch-size bucket")
      ->envname("TANDEM_DRAFTER_CUDA_GRAPHS")
      ->capture_default_str();
  app.add_option("--cpu-weights", flags.cpu_weights, tandem::kCpuWeightsHelp)
      ->envname("TANDEM_DRAFTER_CPU_WEIGHTS")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  tandem::HiddenTransportMode hidden_transport = tandem::HiddenTransportMode::kAuto;
  tandem::AddHiddenTransportFlag(app, &hidden_transport, "TANDEM_DRAFTER");
  tandem::AddServerFlags(app, &server_flags, "TANDEM_DRAFTER");
  tandem::MetricsFlags metrics_flags;
  tandem::AddMetricsFlags(app, &metrics_flags, "TANDEM_DRAFTER");
  tandem::RegistryFlags registry_flags;
  tandem::AddRegistryFlags(app, &registry_flags, "TANDEM_DRAFTER");
  tandem::AddClusterTokenFlag(app, &flags.cluster_token_file);
  CLI11_PARSE(app, argc, argv);
  return Run(flags, engine_options, hidden_transport, server_flags, metrics_flags, registry_flags);
}
