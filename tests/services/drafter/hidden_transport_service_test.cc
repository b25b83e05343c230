// The hidden-state transport choice between a real GrpcDraftChannel and DrafterService over
// loopback gRPC, where no GPU is needed: a verifier that requires NCCL against a drafter that
// cannot fails the stream's sessions with the reason instead of sending bytes; under auto the
// rows go as bytes, and both sides count the stream in tandem_hidden_transport_streams_total.
// (The NCCL path itself is in nccl_hidden_states_test.cc, on two GPUs.)
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/hidden_transport.h"
#include "services/common/metrics.h"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tandem/v1/drafter.grpc.pb.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/engine/draft_engine.h"

namespace tandem {
namespace {

using ::tandem::testing::ChainCollector;
using ::tandem::testing::TinyArch;
using ::tandem::testing::TinyModel;
using ::testing::HasSubstr;

HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int i = 0; i < layers * tokens * hidden_size; ++i) {
    rows.bf16.push_back(FloatToBf16(static_cast<float>(i) / 8));
  }
  return rows;
}

class HiddenTransportServiceTest : public ::testing::Test {
 protected:
  void Start(DraftHiddenTransportOptions verifier, HiddenTransportEnd drafter) {
    model_ = TinyModel(TinyArch::kQwen2, 7, 128);
    auto engine = DraftEngine::Create(
        model_.get(),
        {.kv_tokens = 4096, .max_sessions = 16, .hidden_layers = std::vector<int32_t>{1, 3}});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    service_ = std::make_unique<DrafterService>(
        engine_.get(), DrafterServiceOptions{.model_id = "tiny",
                                             .worker_id = "drafter-test",
                                             .hidden_transport = std::move(drafter),
                                             .metrics = &drafter_metrics_});
    auto server = StartServer({.listen = "127.0.0.1:0"}, {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = MakeChannel(server_.address, {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    verifier.metrics = &verifier_metrics_;
    drafter_ = GrpcDraftChannel::Create(*channel, server_.address, chains_.Callback(), 4096,
                                        std::move(verifier));
    ASSERT_TRUE(drafter_->WaitForInfo(absl::Seconds(30)));
  }

  void TearDown() override {
    drafter_.reset();
    if (server_.server) {
      server_.server->Shutdown(std::chrono::system_clock::now());
      server_.server->Wait();
    }
  }

  // tandem_hidden_transport_streams_total{transport}.
  static double Count(const ServiceMetrics& metrics, const std::string& transport) {
    return Counter(metrics, "tandem_hidden_transport_streams_total", "transport", transport);
  }

  // The value of `family`{label=value} in the metrics' text (-1 when absent).
  static double Counter(const ServiceMetrics& metrics, const std::string& family,
                        const std::string& label, const std::string& value) {
    const std::string text = metrics.TextFormat();
    // The service label (a constant one) comes first.
    const std::string key =
        absl::StrCat(family, "{service=\"", std::string(MetricsRoleName(metrics.role())), "\",",
                     label, "=\"", value, "\"} ");
    const size_t at = text.find(key);
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + key.size()));
  }

  // tandem_draft_stream_breaks_total{reason} of the verifier's side.
  double Breaks(const std::string& reason) const {
    return Counter(verifier_metrics_, "tandem_draft_stream_breaks_total", "reason", reason);
  }

  bool WaitForRows(int64_t rows) {
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (engine_->Stats().hidden_rows != rows) {
      if (absl::Now() > end) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  ServiceMetrics verifier_metrics_{MetricsRole::kVerifier};
  ServiceMetrics drafter_metrics_{MetricsRole::kDrafter};
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<DraftEngine> engine_;
  std::unique_ptr<DrafterService> service_;
  RunningServer server_;
  ChainCollector chains_;
  std::unique_ptr<GrpcDraftChannel> drafter_;
};

TEST_F(HiddenTransportServiceTest, RequiredNcclAgainstADrafterThatCannotFailsTheSessions) {
  // A verifier claiming a GPU and requiring NCCL; the drafter takes bytes only.
  Start({.local = {.mode = HiddenTransportMode::kNccl,
                   .nccl = true,
                   .gpu_uuid = "00aa",
                   .hostname = "verifier-host"}},
        HiddenTransportEnd{.mode = HiddenTransportMode::kAuto,
                           .nccl = false,
                           .why_not = "no CUDA device is visible (0 devices)"});
  // The choice was made with the drafter's answer: the stream is broken with the reason, and
  // every session (the engine's error chain path) is refused with it.
  EXPECT_FALSE(drafter_->healthy());
  EXPECT_EQ(Count(verifier_metrics_, "failed"), 1);
  EXPECT_EQ(Count(verifier_metrics_, "bytes"), 0);
  EXPECT_EQ(Breaks("hidden_transport"), 1);
  EXPECT_EQ(Breaks("ended"), 0);
  const absl::Status refused = drafter_->Open(1, std::vector<int32_t>{1, 2, 3}, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("the verifier runs --hidden-transport nccl"));
  EXPECT_THAT(refused.message(), HasSubstr("no CUDA device is visible"));
}

TEST_F(HiddenTransportServiceTest, AutoAgainstADrafterWithoutNcclSendsBytes) {
  Start({.local = {.mode = HiddenTransportMode::kAuto,
                   .nccl = true,
                   .gpu_uuid = "00aa",
                   .hostname = "verifier-host"}},
        HiddenTransportEnd{.mode = HiddenTransportMode::kBytes,
                           .nccl = false,
                           .why_not = "--hidden-transport bytes"});
  EXPECT_EQ(drafter_->hidden_transport(), HiddenTransportKind::kBytes);
  const int h = 16;
  ASSERT_TRUE(drafter_->Open(1, std::vector<int32_t>{1, 2, 3, 4}, 2, Rows(2, 0, 3, h)).ok());
  ASSERT_TRUE(drafter_->Advance(1, 4, std::vector<int32_t>{5}, 0, Rows(2, 3, 1, h)).ok());
  EXPECT_TRUE(WaitForRows(4));
  EXPECT_TRUE(drafter_->healthy());
  EXPECT_TRUE(chains_.Get(1).error.ok());
  EXPECT_EQ(Count(verifier_metrics_, "bytes"), 1);
  EXPECT_EQ(Count(verifier_metrics_, "nccl"), 0);
  // The drafter counts the stream when the first rows arrive.
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (Count(drafter_metrics_, "bytes") != 1 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(Count(drafter_metrics_, "bytes"), 1);
  // A drafter that goes away breaks the stream, counted once with its reason.
  EXPECT_EQ(Breaks("ended"), 0);
  server_.server->Shutdown(std::chrono::system_clock::now());
  server_.server->Wait();
  server_.server.reset();
  const absl::Time gone = absl::Now() + absl::Seconds(10);
  while (drafter_->healthy() && absl::Now() < gone) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(drafter_->healthy());
  EXPECT_EQ(Breaks("ended"), 1);
  EXPECT_EQ(Breaks("hidden_transport"), 0);
}

// The drafter's side of the protocol, on a raw stream: an NCCL setup it cannot honour is
// answered with a failed status (the verifier then sends bytes), and rows announced by NCCL on a
// stream without a communicator end only their session.
TEST_F(HiddenTransportServiceTest, ADrafterWithoutNcclAnswersTheSetupWithTheReason) {
  Start({}, HiddenTransportEnd{.mode = HiddenTransportMode::kAuto,
                               .nccl = false,
                               .why_not = "no CUDA device is visible (0 devices)"});
  auto stub = v1::Drafter::NewStub(*MakeChannel(server_.address, {}));
  grpc::ClientContext context;
  auto stream = stub->Draft(&context);
  v1::DraftClientMessage setup;
  setup.mutable_hidden_transport()->set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  setup.mutable_hidden_transport()->set_nccl_unique_id(std::string(128, '\1'));
  ASSERT_TRUE(stream->Write(setup));
  v1::DraftChain reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_hidden_transport());
  EXPECT_FALSE(reply.hidden_transport().ready());
  EXPECT_THAT(reply.hidden_transport().error(), HasSubstr("this drafter cannot use NCCL"));
  EXPECT_THAT(reply.hidden_transport().error(), HasSubstr("no CUDA device is visible"));
  EXPECT_EQ(Count(drafter_metrics_, "bytes"), 1);

  v1::DraftClientMessage m;
  m.set_session(9);
  m.mutable_open()->add_tokens(3);
  m.mutable_open()->set_gamma(2);
  v1::HiddenStates* hidden = m.mutable_open()->mutable_hidden();
  hidden->set_num_layers(2);
  hidden->set_num_tokens(1);
  hidden->set_hidden_size(16);
  hidden->set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  ASSERT_TRUE(stream->Write(m));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.session(), 9u);
  EXPECT_THAT(reply.error(), HasSubstr("no NCCL communicator"));
  ASSERT_TRUE(stream->WritesDone());
  while (stream->Read(&reply)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace tandem
