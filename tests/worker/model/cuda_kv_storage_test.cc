// Prefix caching on the CUDA backend's KV storage: a sequence that takes another's cached blocks
// and rolls back into a shared one gets its own device copy of that block (CudaKvStorage::
// CopyBlock) holding the same rows, and what it writes next never reaches the shared block.
// Checked on the device pools themselves. Skips without a GPU.
#include "worker/model/cuda/cuda_kv_storage.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/transformer.h"

namespace tandem {
namespace {

using cuda_backend::CudaKvStorage;
using testing::TinyArch;
using testing::TinyModel;

constexpr int kBlock = 4;

std::vector<int32_t> Iota(int from, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

// Extends `seq` by `tokens` at the next positions and commits them.
void Extend1(Transformer& model, KvCache& kv, SeqId seq, const std::vector<int32_t>& tokens) {
  const int at = kv.CommittedLength(seq);
  ASSERT_TRUE(kv.Reserve(seq, static_cast<int>(tokens.size())).has_value());
  const std::vector<int32_t> positions = Iota(at, static_cast<int>(tokens.size()));
  const std::vector<int32_t> outputs = {static_cast<int32_t>(tokens.size()) - 1};
  Extend e{.seq = seq, .tokens = tokens, .positions = positions, .outputs = outputs};
  absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&e, 1}, kv);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(kv.Commit(seq, Iota(0, static_cast<int>(tokens.size()))).ok());
}

// The bytes of `rows` rows of `block`, from `first_row` on, in every layer's K and V pool.
std::vector<char> Rows(CudaKvStorage& storage, const KvCacheOptions& o, int32_t block,
                       int first_row, int rows) {
  EXPECT_TRUE(storage.Flush().ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const size_t row_bytes = static_cast<size_t>(o.num_kv_heads) * o.head_dim * 2;
  std::vector<char> bytes;
  for (int layer = 0; layer < o.num_layers; ++layer) {
    for (const void* pool : {static_cast<const void*>(storage.keys(layer)),
                             static_cast<const void*>(storage.values(layer))}) {
      std::vector<char> part(row_bytes * rows);
      const char* from = static_cast<const char*>(pool) +
                         (static_cast<size_t>(block) * o.block_size + first_row) * row_bytes;
      EXPECT_EQ(cudaMemcpy(part.data(), from, part.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      bytes.insert(bytes.end(), part.begin(), part.end());
    }
  }
  return bytes;
}

TEST(CudaKvStorageTest, ASharedBlockRolledBackIntoIsCopiedOnTheDevice) {
  if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  std::unique_ptr<Transformer> model = TinyModel(TinyArch::kQwen3, 5, 64);
  ASSERT_TRUE(model->UseDevice({.device = Device::kCuda, .cuda_graphs = false}).ok());
  KvCacheOptions options = model->KvOptions(256, kBlock);
  options.prefix_cache = true;
  KvCache kv(options);
  auto* storage = dynamic_cast<CudaKvStorage*>(&kv.storage());
  ASSERT_NE(storage, nullptr);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  ASSERT_TRUE(kv.AddSequence(1).ok());
  Extend1(*model, kv, 1, prompt);
  kv.PublishPrefix(1, prompt, 0);
  const int32_t shared = kv.BlockTable(1)[1];
  const std::vector<char> shared_rows = Rows(*storage, options, shared, 0, kBlock);

  ASSERT_TRUE(kv.AddSequence(2).ok());
  ASSERT_EQ(kv.AttachPrefix(2, prompt, 0), 8);
  ASSERT_TRUE(kv.Truncate(2, 6).ok());
  const int32_t copy = kv.BlockTable(2)[1];
  ASSERT_NE(copy, shared);
  // The copy holds the kept rows (slots 4 and 5) as the shared block does.
  EXPECT_EQ(Rows(*storage, options, copy, 0, 2), Rows(*storage, options, shared, 0, 2));
  // Writing slots 6 and 7 of the second sequence leaves the shared block as it was.
  Extend1(*model, kv, 2, {8, 8});
  EXPECT_EQ(Rows(*storage, options, shared, 0, kBlock), shared_rows);
  EXPECT_NE(Rows(*storage, options, copy, 2, 2), Rows(*storage, options, shared, 2, 2));
}

}  // namespace
}  // namespace tandem
