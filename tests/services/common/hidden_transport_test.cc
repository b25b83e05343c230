// The hidden-state transport choice (every combination of flags and capabilities), its
// WorkerInfo round trip, and the bytes transport's exact encoding; runs without a GPU.
#include "services/common/hidden_transport.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

HiddenTransportEnd Capable(HiddenTransportMode mode, std::string uuid, std::string host = "h") {
  return HiddenTransportEnd{
      .mode = mode, .nccl = true, .gpu_uuid = std::move(uuid), .hostname = std::move(host)};
}

HiddenTransportEnd Incapable(HiddenTransportMode mode, std::string why) {
  return HiddenTransportEnd{.mode = mode, .nccl = false, .why_not = std::move(why)};
}

constexpr auto kAuto = HiddenTransportMode::kAuto;
constexpr auto kBytes = HiddenTransportMode::kBytes;
constexpr auto kNccl = HiddenTransportMode::kNccl;

TEST(ChooseHiddenTransport, AutoOnBothSidesWithTwoGpusPicksNccl) {
  const HiddenTransportChoice choice =
      ChooseHiddenTransport(Capable(kAuto, "aa", "v-host"), Capable(kAuto, "bb", "d-host"));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kNccl);
  EXPECT_FALSE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("GPU aa on v-host"));
  EXPECT_THAT(choice.reason, HasSubstr("GPU bb on d-host"));
}

TEST(ChooseHiddenTransport, RequiredOnEitherSideWithTwoGpusPicksNccl) {
  for (auto [v, d] : std::vector<std::pair<HiddenTransportMode, HiddenTransportMode>>{
           {kNccl, kAuto}, {kAuto, kNccl}, {kNccl, kNccl}}) {
    const HiddenTransportChoice choice = ChooseHiddenTransport(Capable(v, "aa"), Capable(d, "bb"));
    EXPECT_EQ(choice.kind, HiddenTransportKind::kNccl);
    EXPECT_FALSE(choice.failed);
  }
}

TEST(ChooseHiddenTransport, OneSharedGpuMeansBytesUnderAuto) {
  const HiddenTransportChoice choice =
      ChooseHiddenTransport(Capable(kAuto, "aa"), Capable(kAuto, "aa"));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
  EXPECT_FALSE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("share GPU aa"));
  EXPECT_THAT(choice.reason, HasSubstr("NCCL needs two GPUs"));
}

TEST(ChooseHiddenTransport, OneSharedGpuFailsWhenNcclIsRequired) {
  HiddenTransportChoice choice = ChooseHiddenTransport(Capable(kNccl, "aa"), Capable(kAuto, "aa"));
  EXPECT_TRUE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("the verifier runs --hidden-transport nccl"));
  EXPECT_THAT(choice.reason, HasSubstr("share GPU aa"));
  choice = ChooseHiddenTransport(Capable(kAuto, "aa"), Capable(kNccl, "aa"));
  EXPECT_TRUE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("the drafter runs --hidden-transport nccl"));
  choice = ChooseHiddenTransport(Capable(kNccl, "aa"), Capable(kNccl, "aa"));
  EXPECT_TRUE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("both sides run --hidden-transport nccl"));
}

TEST(ChooseHiddenTransport, AnIncapableSideMeansBytesUnderAuto) {
  HiddenTransportChoice choice =
      ChooseHiddenTransport(Incapable(kAuto, "no CUDA device is visible"), Capable(kAuto, "bb"));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
  EXPECT_FALSE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("the verifier cannot use NCCL: no CUDA device"));
  choice = ChooseHiddenTransport(Capable(kAuto, "aa"), Incapable(kAuto, "built without CUDA"));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
  EXPECT_FALSE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("the drafter cannot use NCCL: built without CUDA"));
}

TEST(ChooseHiddenTransport, BytesFlagOnEitherSideMeansBytes) {
  // LocalHiddenTransport turns a bytes flag into an incapable side.
  HiddenTransportChoice choice =
      ChooseHiddenTransport(Incapable(kBytes, "--hidden-transport bytes"), Capable(kAuto, "bb"));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
  EXPECT_FALSE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("--hidden-transport bytes"));
  choice = ChooseHiddenTransport(Capable(kAuto, "aa"), FromInfo([] {
                                   v1::WorkerInfo info;
                                   *info.mutable_hidden_transport() =
                                       ToInfo(Incapable(kBytes, "--hidden-transport bytes"));
                                   return info;
                                 }()));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
  EXPECT_FALSE(choice.failed);
}

TEST(ChooseHiddenTransport, RequiredAgainstAnIncapablePeerFailsClearly) {
  HiddenTransportChoice choice = ChooseHiddenTransport(
      Capable(kNccl, "aa"), Incapable(kAuto, "no CUDA device is visible (0 devices)"));
  EXPECT_TRUE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("the verifier runs --hidden-transport nccl but the drafter "
                                       "cannot use NCCL: no CUDA device is visible"));
  // The drafter requires NCCL, the verifier was started with bytes.
  choice =
      ChooseHiddenTransport(Incapable(kBytes, "--hidden-transport bytes"), Capable(kNccl, "bb"));
  EXPECT_TRUE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("the drafter runs --hidden-transport nccl but the verifier "
                                       "cannot use NCCL: --hidden-transport bytes"));
}

TEST(ChooseHiddenTransport, AnOlderDrafterThatSaysNothingGetsBytes) {
  v1::WorkerInfo info;
  info.set_role("drafter");
  const HiddenTransportEnd drafter = FromInfo(info);
  EXPECT_FALSE(drafter.nccl);
  HiddenTransportChoice choice = ChooseHiddenTransport(Capable(kAuto, "aa"), drafter);
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
  EXPECT_FALSE(choice.failed);
  EXPECT_THAT(choice.reason, HasSubstr("does not advertise"));
  choice = ChooseHiddenTransport(Capable(kNccl, "aa"), drafter);
  EXPECT_TRUE(choice.failed);
}

TEST(ChooseHiddenTransport, AVerifierWithoutAGpuIdentityNeverPicksNccl) {
  const HiddenTransportChoice choice =
      ChooseHiddenTransport(Capable(kAuto, ""), Capable(kAuto, ""));
  EXPECT_EQ(choice.kind, HiddenTransportKind::kBytes);
}

TEST(HiddenTransportInfo, RoundTripsThroughWorkerInfo) {
  v1::WorkerInfo info;
  *info.mutable_hidden_transport() = ToInfo(Capable(kNccl, "0123abcd", "gpu-host"));
  const HiddenTransportEnd end = FromInfo(info);
  EXPECT_TRUE(end.nccl);
  EXPECT_EQ(end.mode, kNccl);
  EXPECT_EQ(end.gpu_uuid, "0123abcd");
  EXPECT_EQ(end.hostname, "gpu-host");
  *info.mutable_hidden_transport() = ToInfo(Incapable(kAuto, "no GPU"));
  const HiddenTransportEnd none = FromInfo(info);
  EXPECT_FALSE(none.nccl);
  EXPECT_EQ(none.mode, kAuto);
  EXPECT_EQ(none.why_not, "no GPU");
}

TEST(HiddenTransportMode, ParsesTheFlagValues) {
  EXPECT_EQ(*ParseHiddenTransportMode("auto"), kAuto);
  EXPECT_EQ(*ParseHiddenTransportMode("bytes"), kBytes);
  EXPECT_EQ(*ParseHiddenTransportMode("nccl"), kNccl);
  const absl::StatusOr<HiddenTransportMode> bad = ParseHiddenTransportMode("rdma");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("none of auto, bytes, nccl"));
}

TEST(LocalHiddenTransport, BytesIsNeverNcclAndNcclIsCheckedAtStartup) {
  const HiddenTransportEnd bytes = LocalHiddenTransport(kBytes);
  EXPECT_FALSE(bytes.nccl);
  EXPECT_FALSE(bytes.why_not.empty());
  EXPECT_FALSE(bytes.hostname.empty());
  EXPECT_TRUE(CheckHiddenTransportFlag(bytes).ok());
  const HiddenTransportEnd nccl = LocalHiddenTransport(kNccl);
  const absl::Status check = CheckHiddenTransportFlag(nccl);
  if (nccl.nccl) {
    EXPECT_TRUE(check.ok());
    EXPECT_FALSE(nccl.gpu_uuid.empty());
  } else {
    ASSERT_FALSE(check.ok());
    EXPECT_THAT(check.message(), HasSubstr("--hidden-transport nccl is impossible here"));
    EXPECT_THAT(check.message(), HasSubstr(nccl.why_not));
  }
}

HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int i = 0; i < layers * tokens * hidden_size; ++i) {
    rows.bf16.push_back(static_cast<uint16_t>(0x3f00 + 37 * i));
  }
  return rows;
}

TEST(BytesHiddenTransport, RoundTripsExactly) {
  const HiddenRows rows = Rows(2, 5, 3, 4);
  v1::HiddenStates wire;
  BytesHiddenSender sender;
  EXPECT_EQ(sender.kind(), HiddenTransportKind::kBytes);
  sender.Encode(rows, &wire);
  EXPECT_EQ(wire.transport(), v1::HIDDEN_TRANSPORT_BYTES);
  EXPECT_EQ(wire.bf16().size(), rows.bf16.size() * 2);
  BytesHiddenReceiver receiver;
  std::vector<absl::StatusOr<HiddenRows>> got;
  receiver.Receive(&wire, [&got](absl::StatusOr<HiddenRows> r) { got.push_back(std::move(r)); });
  receiver.Receive(nullptr, [&got](absl::StatusOr<HiddenRows> r) { got.push_back(std::move(r)); });
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(got[0]->layers, 2);
  EXPECT_EQ(got[0]->tokens, 3);
  EXPECT_EQ(got[0]->hidden_size, 4);
  EXPECT_EQ(got[0]->offset, 5);
  EXPECT_EQ(got[0]->bf16, rows.bf16);
  ASSERT_TRUE(got[1].ok());
  EXPECT_TRUE(got[1]->empty());
}

TEST(BytesHiddenTransport, RejectsHalfValuesAndNcclPayloads) {
  v1::HiddenStates wire;
  wire.set_num_layers(1);
  wire.set_num_tokens(1);
  wire.set_hidden_size(1);
  wire.set_bf16(std::string(3, 'x'));
  absl::StatusOr<HiddenRows> rows = HiddenRowsFromWire(wire);
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(rows.status().message(), HasSubstr("not whole bf16 values"));
  wire.clear_bf16();
  wire.set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  rows = HiddenRowsFromWire(wire);
  ASSERT_FALSE(rows.ok());
  EXPECT_THAT(rows.status().message(), HasSubstr("no NCCL communicator"));
}

TEST(NcclHiddenTransport, StartingWithoutAUsableBuildOrIdFailsClearly) {
  // A malformed id is refused before anything starts, with or without CUDA.
  auto sender = StartHiddenNcclSender("short", {}, [](absl::Status) {});
  ASSERT_FALSE(sender.ok());
  auto receiver = StartHiddenNcclReceiver("short", {}, [](absl::Status) {});
  ASSERT_FALSE(receiver.ok());
}

}  // namespace
}  // namespace tandem
