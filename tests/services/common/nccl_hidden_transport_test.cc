// The NCCL hidden-state transport's endpoints in one process: the sender as rank 0 on GPU 0 and
// the receiver as rank 1 on GPU 1 (threads of their own), rows round-tripping exactly and in
// message order between bytes messages, and failures (a payload that never comes, a peer that
// never joins) ending in errors rather than hangs. Skips without two CUDA devices (one for the
// peer-never-joins case).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/hidden_transport.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

int CudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

HiddenRows Rows(int layers, int offset, int tokens, int hidden_size, int seed) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int i = 0; i < layers * tokens * hidden_size; ++i) {
    rows.bf16.push_back(static_cast<uint16_t>(seed * 7919 + i * 31));
  }
  return rows;
}

// Records an endpoint's status reports.
struct StatusLog {
  absl::Mutex mu;
  std::vector<absl::Status> reports ABSL_GUARDED_BY(mu);

  std::function<void(absl::Status)> Callback() {
    return [this](absl::Status status) {
      absl::MutexLock lock(&mu);
      reports.push_back(std::move(status));
    };
  }
  // The first report, after waiting up to `timeout` for one.
  std::optional<absl::Status> First(absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !reports.empty(); };
    if (!mu.AwaitWithTimeout(absl::Condition(&any), timeout)) return std::nullopt;
    return reports.front();
  }
  std::optional<absl::Status> Nth(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return reports.size() > n; };
    if (!mu.AwaitWithTimeout(absl::Condition(&enough), timeout)) return std::nullopt;
    return reports[n];
  }
};

// Deliveries in order.
struct Deliveries {
  absl::Mutex mu;
  std::vector<absl::StatusOr<HiddenRows>> got ABSL_GUARDED_BY(mu);

  HiddenReceiver::Done Callback() {
    return [this](absl::StatusOr<HiddenRows> rows) {
      absl::MutexLock lock(&mu);
      got.push_back(std::move(rows));
    };
  }
  std::vector<absl::StatusOr<HiddenRows>> WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return got.size() >= n; };
    mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return got;
  }
};

struct Pair {
  HiddenNcclSender sender;
  std::unique_ptr<HiddenReceiver> receiver;
  StatusLog sender_log;
  StatusLog receiver_log;
};

// Both endpoints joined and warmed up; the sender told that the receiver is ready.
void Connect(Pair& pair, double transfer_timeout_seconds = 10) {
  absl::StatusOr<std::string> id = NewHiddenNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto sender = StartHiddenNcclSender(
      *id, {.device = 0, .transfer_timeout_seconds = transfer_timeout_seconds},
      pair.sender_log.Callback());
  ASSERT_TRUE(sender.ok()) << sender.status();
  pair.sender = std::move(*sender);
  auto receiver = StartHiddenNcclReceiver(
      *id, {.device = 1, .transfer_timeout_seconds = transfer_timeout_seconds},
      pair.receiver_log.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  pair.receiver = std::move(*receiver);
  const std::optional<absl::Status> sender_ready = pair.sender_log.First(absl::Seconds(120));
  ASSERT_TRUE(sender_ready.has_value()) << "the sender never joined";
  ASSERT_TRUE(sender_ready->ok()) << *sender_ready;
  const std::optional<absl::Status> receiver_ready = pair.receiver_log.First(absl::Seconds(120));
  ASSERT_TRUE(receiver_ready.has_value()) << "the receiver never joined";
  ASSERT_TRUE(receiver_ready->ok()) << *receiver_ready;
  // Bytes until the drafter's answer arrives.
  EXPECT_EQ(pair.sender.sender->kind(), HiddenTransportKind::kBytes);
  v1::HiddenTransportStatus ready;
  ready.set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  ready.set_ready(true);
  pair.sender.link->PeerStatus(ready);
  EXPECT_EQ(pair.sender.sender->kind(), HiddenTransportKind::kNccl);
}

TEST(NcclHiddenTransport, RowsRoundTripExactlyAndInOrderBetweenTwoGpus) {
  if (CudaDevices() < 2) GTEST_SKIP() << "needs 2 CUDA devices, " << CudaDevices() << " visible";
  Pair pair;
  Connect(pair);
  if (::testing::Test::HasFatalFailure()) return;
  // NCCL payloads of several sizes, with bytes messages and messages without rows between
  // them: the receiver must hand all of them over in the order they came.
  std::vector<HiddenRows> sent = {Rows(2, 0, 7, 64, 1), Rows(2, 7, 1, 64, 2),
                                  Rows(2, 8, 300, 64, 3), Rows(1, 0, 3, 4096, 4)};
  Deliveries deliveries;
  BytesHiddenSender bytes;
  for (size_t i = 0; i < sent.size(); ++i) {
    v1::HiddenStates wire;
    pair.sender.sender->Encode(sent[i], &wire);
    EXPECT_EQ(wire.transport(), v1::HIDDEN_TRANSPORT_NCCL);
    EXPECT_TRUE(wire.bf16().empty());
    pair.receiver->Receive(&wire, deliveries.Callback());
    v1::HiddenStates in_stream;
    bytes.Encode(Rows(1, static_cast<int>(i), 1, 8, 100 + static_cast<int>(i)), &in_stream);
    pair.receiver->Receive(&in_stream, deliveries.Callback());
    pair.receiver->Receive(nullptr, deliveries.Callback());
  }
  const auto got = deliveries.WaitFor(3 * sent.size(), absl::Seconds(60));
  ASSERT_EQ(got.size(), 3 * sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    const auto& nccl = got[3 * i];
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    EXPECT_EQ(nccl->layers, sent[i].layers);
    EXPECT_EQ(nccl->tokens, sent[i].tokens);
    EXPECT_EQ(nccl->hidden_size, sent[i].hidden_size);
    EXPECT_EQ(nccl->offset, sent[i].offset);
    EXPECT_EQ(nccl->bf16, sent[i].bf16) << "payload " << i;
    const auto& in_stream = got[3 * i + 1];
    ASSERT_TRUE(in_stream.ok()) << in_stream.status();
    EXPECT_EQ(in_stream->bf16, Rows(1, static_cast<int>(i), 1, 8, 100 + static_cast<int>(i)).bf16);
    ASSERT_TRUE(got[3 * i + 2].ok());
    EXPECT_TRUE(got[3 * i + 2]->empty());
  }
}

TEST(NcclHiddenTransport, APayloadThatNeverComesFailsItsMessageAndTheStreamGoesOn) {
  if (CudaDevices() < 2) GTEST_SKIP() << "needs 2 CUDA devices, " << CudaDevices() << " visible";
  Pair pair;
  Connect(pair, /*transfer_timeout_seconds=*/2);
  if (::testing::Test::HasFatalFailure()) return;
  // A message announcing an NCCL payload the sender never sends.
  v1::HiddenStates announced;
  announced.set_num_layers(1);
  announced.set_num_tokens(2);
  announced.set_hidden_size(8);
  announced.set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  Deliveries deliveries;
  pair.receiver->Receive(&announced, deliveries.Callback());
  v1::HiddenStates in_stream;
  BytesHiddenSender().Encode(Rows(1, 0, 1, 8, 5), &in_stream);
  pair.receiver->Receive(&in_stream, deliveries.Callback());
  pair.receiver->Receive(&announced, deliveries.Callback());
  const auto got = deliveries.WaitFor(3, absl::Seconds(60));
  ASSERT_EQ(got.size(), 3u);
  ASSERT_FALSE(got[0].ok());
  EXPECT_THAT(got[0].status().message(), HasSubstr("receiving hidden states"));
  ASSERT_TRUE(got[1].ok()) << got[1].status();  // bytes still arrive, in order
  EXPECT_EQ(got[1]->bf16, Rows(1, 0, 1, 8, 5).bf16);
  ASSERT_FALSE(got[2].ok());  // NCCL is off for good
  EXPECT_THAT(got[2].status().message(), HasSubstr("after it failed"));
  const std::optional<absl::Status> failure = pair.receiver_log.Nth(1, absl::Seconds(10));
  ASSERT_TRUE(failure.has_value());
  EXPECT_FALSE(failure->ok());
  // The sender learns it from the drafter's status and goes back to bytes.
  v1::HiddenTransportStatus failed;
  failed.set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  failed.set_error(std::string(failure->message()));
  pair.sender.link->PeerStatus(failed);
  EXPECT_EQ(pair.sender.sender->kind(), HiddenTransportKind::kBytes);
  v1::HiddenStates after;
  pair.sender.sender->Encode(Rows(1, 0, 1, 8, 6), &after);
  EXPECT_EQ(after.transport(), v1::HIDDEN_TRANSPORT_BYTES);
  EXPECT_EQ(after.bf16().size(), 16u);
}

TEST(NcclHiddenTransport, APeerThatNeverJoinsFailsTheSetupInTime) {
  if (CudaDevices() < 1) GTEST_SKIP() << "needs a CUDA device, none visible";
  absl::StatusOr<std::string> id = NewHiddenNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  StatusLog log;
  auto receiver =
      StartHiddenNcclReceiver(*id, {.device = 0, .setup_timeout_seconds = 3}, log.Callback());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  // Bytes messages are delivered while the setup waits.
  Deliveries deliveries;
  v1::HiddenStates in_stream;
  BytesHiddenSender().Encode(Rows(1, 0, 1, 8, 7), &in_stream);
  (*receiver)->Receive(&in_stream, deliveries.Callback());
  EXPECT_EQ(deliveries.WaitFor(1, absl::Seconds(1)).size(), 1u);
  const std::optional<absl::Status> failure = log.First(absl::Seconds(60));
  ASSERT_TRUE(failure.has_value()) << "the setup did not give up";
  EXPECT_FALSE(failure->ok());
  (*receiver)->Shutdown();
}

}  // namespace
}  // namespace tandem
