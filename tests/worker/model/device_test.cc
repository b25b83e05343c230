// Device selection: flag values, availability errors, and a model that stays on the CPU when
// the CUDA backend cannot start. Runs on every host.
#include "worker/model/device.h"

#include "gtest/gtest.h"
#include "worker/model/cpu_transformer.h"
#include "worker/model/transformer.h"

namespace tandem {
namespace {

TEST(DeviceTest, ParsesCpuAndCudaOnly) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::kCpu);
  EXPECT_EQ(*ParseDevice("cuda"), Device::kCuda);
  for (const char* bad : {"gpu", "CUDA", "", "cuda:0"}) {
    const absl::StatusOr<Device> parsed = ParseDevice(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("expected 'cpu' or 'cuda'"), std::string::npos);
  }
  EXPECT_EQ(DeviceName(Device::kCuda), "cuda");
  EXPECT_EQ(DeviceName(Device::kCpu), "cpu");
}

TEST(DeviceTest, CpuIsAlwaysAvailable) {
  const absl::StatusOr<DeviceOptions> cpu = ResolveDevice("cpu", false);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->device, Device::kCpu);
  EXPECT_FALSE(cpu->cuda_graphs);
  EXPECT_EQ(ResolveDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceTest, CudaIsRefusedClearlyWhereItCannotRun) {
  const absl::Status status = CheckDeviceAvailable(Device::kCuda);
  if (!CudaBackendBuilt()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_NE(status.message().find("-DTANDEM_CUDA=ON"), std::string::npos) << status;
  } else if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_NE(status.message().find("no CUDA device"), std::string::npos) << status;
  }
  EXPECT_EQ(ResolveDevice("cuda").status(), status);
}

TEST(DeviceTest, ModelStaysOnTheCpuWhenCudaCannotStart) {
  if (CheckDeviceAvailable(Device::kCuda).ok()) GTEST_SKIP() << "a CUDA device is available";
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.qk_norm = true;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = true;
  auto model = Transformer::FromWeights(c, RandomWeights(c, 5));
  EXPECT_FALSE(model->UseDevice({.device = Device::kCuda}).ok());
  EXPECT_EQ(model->device(), Device::kCpu);
  EXPECT_NE(dynamic_cast<CpuTransformer*>(model->backend()), nullptr);
  KvCache kv(model->KvOptions(16, 4));
  ASSERT_NE(kv.host_storage(), nullptr);
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, 2).has_value());
  const std::vector<int32_t> tokens = {1, 2}, positions = {0, 1}, outputs = {1};
  Extend e{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
  auto out = model->Forward({&e, 1}, kv);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].logits.size(), 11u);
}

TEST(DeviceTest, CpuForwardRefusesAnotherDevicesKvStorage) {
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.qk_norm = true;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = true;
  auto model = Transformer::FromWeights(c, RandomWeights(c, 5));
  struct NullStorage final : KvStorage {
    void Commit(SeqId, std::span<const int32_t>, int, std::span<const int32_t>) override {}
    void CopyBlock(int32_t, int32_t) override {}
    size_t ElementBytes() const override { return 2; }
  };
  KvCacheOptions options = model->KvOptions(16, 4);
  options.make_storage = [](const KvCacheOptions&) { return std::make_unique<NullStorage>(); };
  KvCache kv(options);
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, 1).has_value());
  const std::vector<int32_t> tokens = {1}, positions = {0}, outputs = {0};
  Extend e{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
  auto out = model->Forward({&e, 1}, kv);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
