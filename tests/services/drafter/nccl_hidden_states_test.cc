// A GrpcDraftChannel (the verifier side, GPU 0) and a DrafterService (GPU 1) over loopback
// gRPC choose NCCL for hidden states, set it up on the Draft stream, and the drafter engine
// receives the rows of every message by NCCL, exactly as counted with bytes. Skips unless two
// CUDA devices are visible.
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/common/hidden_transport.h"
#include "services/common/metrics.h"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/engine/draft_engine.h"

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
  DrafterService service(engine->get(), {.model_id = "tiny",
                                         .worker_id = "drafter-test",
                                         .hidden_transport = drafter_end,
                                         .metrics = &drafter_metrics});
  auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel(server->address, {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(*channel, server->address, chains.Callback(), 4096,
                                          {.local = verifier_end, .metrics = &verifier_metrics});
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

}  // namespace
}  // namespace tandem
