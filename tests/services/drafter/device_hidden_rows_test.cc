// Hidden rows that stay on the GPU: NewDeviceHiddenSink copies rows out of a receiver's device
// buffer into its pool, stream-ordered, and a DraftEngine serving a DFlash drafter on CUDA
// appends them with AppendContextDevice. The drafts equal those of the same rows sent through
// the host. Skips without a CUDA device.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/common/hidden_transport.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/engine/draft_engine.h"

namespace tandem {
namespace {

using ::tandem::testing::ChainCollector;
using ::tandem::testing::TinyArch;

int CudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Rows [offset, offset + tokens) of `layers` layers, bf16, deterministic.
HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int l = 0; l < layers; ++l) {
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < hidden_size; ++h) {
        rows.bf16.push_back(
            FloatToBf16(static_cast<float>((l * 7 + (offset + t) * 3 + h) % 11) / 4 - 1));
      }
    }
  }
  return rows;
}

// A receiver's side in miniature: a device buffer and the stream the rows are ready on.
class Staging {
 public:
  Staging() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~Staging() {
    cudaStreamSynchronize(stream_);
    if (data_ != nullptr) cudaFree(data_);
    cudaStreamDestroy(stream_);
  }

  // Uploads `rows`, offers them to `sink`, then overwrites the buffer in stream order (as the
  // receiver's next payload would): the payload must hold the rows as they were.
  std::shared_ptr<const DeviceHiddenPayload> Offer(const DeviceHiddenSink& sink,
                                                   const HiddenRows& rows, int device) {
    const size_t bytes = rows.bf16.size() * sizeof(uint16_t);
    if (bytes > bytes_) {
      if (data_ != nullptr) cudaFree(data_);
      EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
      bytes_ = bytes;
    }
    EXPECT_EQ(cudaMemcpyAsync(data_, rows.bf16.data(), bytes, cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
    std::shared_ptr<const DeviceHiddenPayload> taken =
        sink.take(DeviceHiddenRows{.layers = rows.layers,
                                   .tokens = rows.tokens,
                                   .hidden_size = rows.hidden_size,
                                   .offset = rows.offset,
                                   .bf16 = data_,
                                   .stream = stream_,
                                   .device = device});
    EXPECT_EQ(cudaMemsetAsync(data_, 0xff, bytes, stream_), cudaSuccess);
    return taken;
  }

 private:
  cudaStream_t stream_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The payload's values, read through DeviceHiddenPayload::Read.
std::vector<uint16_t> Download(const DeviceHiddenPayload& payload, size_t values) {
  std::vector<uint16_t> out(values);
  absl::Status read = payload.Read([&](const void* rows, CUstream_st* stream) -> absl::Status {
    if (cudaMemcpyAsync(out.data(), rows, values * sizeof(uint16_t), cudaMemcpyDeviceToHost,
                        stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return absl::InternalError("download failed");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(read.ok()) << read;
  return out;
}

TEST(DeviceHiddenSink, KeepsEachPayloadIntactWhileBuffersAreReused) {
  if (CudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<DeviceHiddenSink> sink = NewDeviceHiddenSink();
  ASSERT_TRUE(sink.ok()) << sink.status();
  EXPECT_EQ(sink->device, 0);
  Staging staging;
  // Refused (host path): rows on another GPU.
  EXPECT_EQ(staging.Offer(*sink, Rows(2, 0, 3, 8), 1), nullptr);
  // Sizes that grow and shrink; some payloads held across later ones, some dropped unread.
  std::vector<std::shared_ptr<const DeviceHiddenPayload>> held;
  std::vector<HiddenRows> held_rows;
  for (int i = 0; i < 40; ++i) {
    const HiddenRows rows = Rows(2, i, 1 + (i * 37) % 300, 64);
    std::shared_ptr<const DeviceHiddenPayload> payload = staging.Offer(*sink, rows, 0);
    ASSERT_NE(payload, nullptr);
    EXPECT_EQ(payload->device(), 0);
    if (i % 3 == 0) {
      held.push_back(payload);
      held_rows.push_back(rows);
    } else if (i % 3 == 1) {
      EXPECT_EQ(Download(*payload, rows.bf16.size()), rows.bf16) << "payload " << i;
    }
  }
  for (size_t j = 0; j < held.size(); ++j) {
    EXPECT_EQ(Download(*held[j], held_rows[j].bf16.size()), held_rows[j].bf16) << "held " << j;
  }
}

TEST(DeviceHiddenSink, DeviceRowsDraftAsTheSameRowsThroughTheHost) {
  if (CudaDevices() == 0) GTEST_SKIP() << "no CUDA device visible";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 8);
  std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target.get(), 4, 5);
  ASSERT_NE(dflash, nullptr);
  ASSERT_TRUE(dflash->UseDevice({.device = Device::kCuda}).ok());
  absl::StatusOr<DeviceHiddenSink> sink = NewDeviceHiddenSink();
  ASSERT_TRUE(sink.ok()) << sink.status();
  DraftEngineOptions options;
  options.dflash = dflash.get();
  auto engine = DraftEngine::Create(target.get(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ChainCollector chains;
  const uint64_t stream = (*engine)->AddStream(chains.Callback());
  const int layers = static_cast<int>(dflash->config().target_layer_ids.size());
  const int h = target->config().hidden_size;
  Staging staging;
  auto device_rows = [&](const HiddenRows& rows) {
    HiddenRows shape{.layers = rows.layers,
                     .tokens = rows.tokens,
                     .hidden_size = rows.hidden_size,
                     .offset = rows.offset};
    shape.device = staging.Offer(*sink, rows, sink->device);
    EXPECT_NE(shape.device, nullptr);
    return shape;
  };

  // Session 1 gets host rows, session 2 the same rows in GPU memory.
  const std::vector<int32_t> tokens = {3, 14, 15, 92, 65, 35};
  (*engine)->Open(stream, 1, tokens, 4, Rows(layers, 0, 5, h));
  (*engine)->Open(stream, 2, tokens, 4, device_rows(Rows(layers, 0, 5, h)));
  auto host = chains.WaitCovered(1, 6, 4);
  auto device = chains.WaitCovered(2, 6, 4);
  ASSERT_TRUE(host.has_value());
  ASSERT_TRUE(device.has_value()) << chains.Get(2).error;
  EXPECT_EQ(*device, *host);

  // Both advance by two tokens with their rows (rows of one run in several payloads on the
  // device side).
  const std::vector<int32_t> append = {(*host)[0], 7};
  (*engine)->Advance(stream, 1, 6, append, 0, Rows(layers, 5, 2, h));
  (*engine)->Advance(stream, 2, 6, {}, 0, device_rows(Rows(layers, 5, 1, h)));
  (*engine)->Advance(stream, 2, 6, append, 0, device_rows(Rows(layers, 6, 1, h)));
  auto host_next = chains.WaitCovered(1, 8, 4);
  auto device_next = chains.WaitCovered(2, 8, 4);
  ASSERT_TRUE(host_next.has_value());
  ASSERT_TRUE(device_next.has_value()) << chains.Get(2).error;
  EXPECT_EQ(*device_next, *host_next);
  EXPECT_TRUE(chains.Get(1).error.ok()) << chains.Get(1).error;
  EXPECT_TRUE(chains.Get(2).error.ok()) << chains.Get(2).error;
  EXPECT_EQ((*engine)->Stats().hidden_rows, 2 * 7);

  // A session that ends (closed) with device rows still queued behind it lets them go.
  (*engine)->Open(stream, 3, tokens, 4, device_rows(Rows(layers, 0, 5, h)));
  (*engine)->Close(stream, 3);
  (*engine)->Advance(stream, 3, 6, {1}, 0, device_rows(Rows(layers, 5, 1, h)));
  EXPECT_EQ(chains.WaitError(3).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
