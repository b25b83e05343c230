// A GrpcDraftChannel (the verifier side, GPU 0) and a DrafterService (GPU 1) over loopback
// gRPC choose NCCL for hidden states, set it up on the Draft stream, and the drafter engine
// receives the rows of every message by NCCL, exactly as counted with bytes. With a DFlash
// drafter on CUDA the rows stay on its GPU (the receiver's device sink) and a verifier engine
// decoding `spec` against it gives AR's output. Skips unless two CUDA devices are visible.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/common/hidden_transport.h"
#include "services/common/metrics.h"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/support/source_dir.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/engine/draft_engine.h"
#include "worker/engine/engine.h"
#include "worker/engine/local_generator.h"
#include "worker/model/dflash.h"

namespace tandem {
namespace {

using ::tandem::testing::ChainCollector;
using ::tandem::testing::TinyArch;
using ::tandem::testing::TinyModel;

int CudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// The verifier's transport options, built as a named object: GCC 12 at -O3 reports the
// std::function inside a braced temporary of this type (and of DrafterServiceOptions) as maybe
// destroyed uninitialised, and warnings are errors.
DraftHiddenTransportOptions VerifierTransport(const HiddenTransportEnd& end,
                                              ServiceMetrics* metrics) {
  DraftHiddenTransportOptions options;
  options.local = end;
  options.metrics = metrics;
  return options;
}

HiddenTransportEnd EndOnDevice(int device) {
  cudaSetDevice(device);
  HiddenTransportEnd end = LocalHiddenTransport(HiddenTransportMode::kAuto);
  cudaSetDevice(0);
  return end;
}

HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int i = 0; i < layers * tokens * hidden_size; ++i) {
    rows.bf16.push_back(FloatToBf16(static_cast<float>(i % 977) / 8));
  }
  return rows;
}

double Count(const ServiceMetrics& metrics, const std::string& transport) {
  const std::string text = metrics.TextFormat();
  const std::string key = absl::StrCat("tandem_hidden_transport_streams_total{service=\"",
                                       std::string(MetricsRoleName(metrics.role())),
                                       "\",transport=\"", transport, "\"} ");
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
}

TEST(NcclHiddenStates, VerifierAndDrafterOnTwoGpusSendRowsByNccl) {
  if (CudaDevices() < 2) GTEST_SKIP() << "needs 2 CUDA devices, " << CudaDevices() << " visible";
  const HiddenTransportEnd verifier_end = EndOnDevice(0);
  const HiddenTransportEnd drafter_end = EndOnDevice(1);
  ASSERT_TRUE(verifier_end.nccl) << verifier_end.why_not;
  ASSERT_TRUE(drafter_end.nccl) << drafter_end.why_not;
  ASSERT_NE(verifier_end.gpu_uuid, drafter_end.gpu_uuid);

  ServiceMetrics verifier_metrics(MetricsRole::kVerifier);
  ServiceMetrics drafter_metrics(MetricsRole::kDrafter);
  std::unique_ptr<Transformer> model = TinyModel(TinyArch::kQwen2, 7, 128);
  auto engine = DraftEngine::Create(
      model.get(), {.kv_tokens = 4096, .max_sessions = 16, .hidden_layers = {1, 3}});
  ASSERT_TRUE(engine.ok()) << engine.status();
  DrafterServiceOptions service_options;  // named: see VerifierTransport
  service_options.model_id = "tiny";
  service_options.worker_id = "drafter-test";
  service_options.hidden_transport = drafter_end;
  service_options.metrics = &drafter_metrics;
  DrafterService service(engine->get(), service_options);
  auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel(server->address, {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(*channel, server->address, chains.Callback(), 4096,
                                          VerifierTransport(verifier_end, &verifier_metrics));
  ASSERT_TRUE(drafter->WaitForInfo(absl::Seconds(30)));
  const absl::Time end = absl::Now() + absl::Seconds(120);
  while (drafter->hidden_transport() != HiddenTransportKind::kNccl && absl::Now() < end &&
         Count(verifier_metrics, "bytes") == 0) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(drafter->hidden_transport(), HiddenTransportKind::kNccl)
      << "NCCL setup did not complete";
  EXPECT_EQ(Count(verifier_metrics, "nccl"), 1);

  const int h = 16;
  const int64_t before = (*engine)->Stats().hidden_rows;
  ASSERT_TRUE(drafter->Open(1, std::vector<int32_t>{1, 2, 3, 4}, 2).ok());
  ASSERT_TRUE(drafter->Advance(1, 4, std::vector<int32_t>{}, 0, Rows(2, 0, 3, h)).ok());
  ASSERT_TRUE(drafter->Advance(1, 4, std::vector<int32_t>{5, 6}, 0, Rows(2, 3, 2, h)).ok());
  ASSERT_TRUE(drafter->Open(2, std::vector<int32_t>{9, 8}, 2, Rows(2, 0, 1, h)).ok());
  const absl::Time rows_end = absl::Now() + absl::Seconds(60);
  while ((*engine)->Stats().hidden_rows - before != 6 && absl::Now() < rows_end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ((*engine)->Stats().hidden_rows - before, 6);
  auto chain = chains.WaitCovered(1, 6, 3);
  EXPECT_TRUE(chain.has_value());
  EXPECT_TRUE(chains.Get(1).error.ok()) << chains.Get(1).error;
  EXPECT_TRUE(chains.Get(2).error.ok()) << chains.Get(2).error;
  EXPECT_TRUE(drafter->healthy());
  EXPECT_EQ(Count(drafter_metrics, "nccl"), 1);

  drafter.reset();
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server->Wait();
}

// Collects one sequence's tokens.
class TokenSink : public SequenceSink {
 public:
  void OnEvent(SequenceEvent event) override {
    absl::MutexLock lock(&mu_);
    tokens_.insert(tokens_.end(), event.tokens.begin(), event.tokens.end());
    if (event.finish != FinishReason::kNone || !event.error.ok()) {
      error_ = event.error;
      done_ = true;
    }
  }
  bool Wait() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(60));
  }
  std::vector<int32_t> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  absl::Status error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// The drafter's DFlash model runs on GPU 0 (the engine thread's default device), the verifier's
// NCCL endpoint on GPU 1; both models' target stays on the CPU.
TEST(NcclHiddenStates, SpecAgainstACudaDFlashDrafterByNcclEqualsAr) {
  if (CudaDevices() < 2) GTEST_SKIP() << "needs 2 CUDA devices, " << CudaDevices() << " visible";
  const std::string models = test_support::SourceDir() + "/models/";
  if (!std::filesystem::exists(models + "tandem-target/config.json") ||
      !std::filesystem::exists(models + "tandem-dflash/config.json")) {
    GTEST_SKIP() << "no bundled models";
  }
  const HiddenTransportEnd verifier_end = EndOnDevice(1);
  const HiddenTransportEnd drafter_end = EndOnDevice(0);
  ASSERT_TRUE(verifier_end.nccl) << verifier_end.why_not;
  ASSERT_TRUE(drafter_end.nccl) << drafter_end.why_not;

  absl::StatusOr<LoadedModel> target = LoadModelDir(models + "tandem-target");
  ASSERT_TRUE(target.ok()) << target.status();
  absl::StatusOr<std::unique_ptr<DFlashModel>> dflash =
      DFlashModel::Load(models + "tandem-dflash", target->model.get());
  ASSERT_TRUE(dflash.ok()) << dflash.status();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_TRUE((*dflash)->UseDevice({.device = Device::kCuda}).ok());
  DraftEngineOptions draft_options;
  draft_options.dflash = dflash->get();
  auto draft_engine = DraftEngine::Create(target->model.get(), draft_options);
  ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
  absl::StatusOr<DeviceHiddenSink> sink = NewDeviceHiddenSink();
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_EQ(sink->device, 0);
  // Counts the payloads the drafter took on its GPU.
  auto taken = std::make_shared<std::atomic<int>>(0);
  DeviceHiddenSink counting{.device = sink->device,
                            .take = [take = sink->take, taken](const DeviceHiddenRows& rows) {
                              std::shared_ptr<const DeviceHiddenPayload> payload = take(rows);
                              if (payload != nullptr) ++*taken;
                              return payload;
                            }};
  ServiceMetrics drafter_metrics(MetricsRole::kDrafter);
  DrafterServiceOptions service_options;  // named: see VerifierTransport
  service_options.model_id = "tandem-dflash";
  service_options.worker_id = "drafter-test";
  service_options.hidden_transport = drafter_end;
  service_options.device_sink = counting;
  service_options.metrics = &drafter_metrics;
  DrafterService service(draft_engine->get(), service_options);
  auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  {
    ServiceMetrics verifier_metrics(MetricsRole::kVerifier);
    EngineOptions options;
    options.default_drafter = server->address;
    options.draft_timeout = absl::Seconds(10);
    options.prefill_chunk = 8;  // the prompt's rows come in several payloads
    auto engine = Engine::Create(
        &*target, options,
        MakeGrpcDraftChannelFactory({}, VerifierTransport(verifier_end, &verifier_metrics)));
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto run = [&](const std::vector<int32_t>& prompt, const std::string& mode) {
      SequenceRequest r;
      r.prompt_ids = prompt;
      r.mode = mode;
      r.mode_options.spec_gamma = 3;
      r.max_tokens = 24;
      auto sequence = std::make_shared<TokenSink>();
      absl::StatusOr<uint64_t> id = (*engine)->Submit(std::move(r), sequence);
      EXPECT_TRUE(id.ok()) << id.status();
      EXPECT_TRUE(sequence->Wait());
      EXPECT_TRUE(sequence->error().ok()) << sequence->error();
      return sequence->tokens();
    };
    const std::vector<std::vector<int32_t>> prompts = {
        {10, 200, 31, 4000, 52, 7, 7, 7, 19}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}};
    const std::vector<int32_t> ar = run(prompts[0], "ar");
    // The stream sends bytes until the NCCL setup completed: decode until rows came by NCCL.
    const absl::Time end = absl::Now() + absl::Seconds(120);
    while (*taken == 0 && absl::Now() < end) EXPECT_EQ(run(prompts[0], "spec"), ar);
    ASSERT_GT(*taken, 0) << "no hidden states reached the drafter on its GPU";
    EXPECT_EQ(Count(drafter_metrics, "nccl"), 1);
    const int before = *taken;
    for (const std::vector<int32_t>& prompt : prompts) {
      EXPECT_EQ(run(prompt, "spec"), run(prompt, "ar"));
    }
    EXPECT_GT(*taken, before);
    const DraftEngineStats stats = (*draft_engine)->Stats();
    EXPECT_GT(stats.forwards, 0);
    EXPECT_GT(stats.drafted_tokens, 0);
  }
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server->Wait();
}

}  // namespace
}  // namespace tandem
