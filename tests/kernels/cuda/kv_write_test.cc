// kernels/cuda KV write against the CPU engine's row copies into the paged pools (bit-exact):
// strided K/V rows scattered to their slots, negative slots skipped. Parameter checks run
// everywhere; the comparison skips without a CUDA device.
#include "kernels/cuda/kv_write.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

KvWriteParams ValidParams(std::vector<Bf16>& kv, std::vector<int64_t>& slots,
                          std::vector<Bf16>& pool) {
  KvWriteParams p;
  p.k = kv.data();
  p.k_stride = 24;
  p.v = kv.data() + 16;
  p.v_stride = 24;
  p.slots = slots.data();
  p.k_cache = pool.data();
  p.v_cache = pool.data() + 64;
  p.pool_rows = 8;
  p.tokens = 2;
  p.row_elements = 8;
  return p;
}

TEST(KvWriteCheckTest, AcceptsValidRejectsBadFields) {
  std::vector<Bf16> kv(48), pool(128);
  std::vector<int64_t> slots(2);
  KvWriteParams p = ValidParams(kv, slots, pool);
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  p.tokens = -1;
  ExpectInvalid(p, "tokens");
  p = ValidParams(kv, slots, pool);
  p.row_elements = 0;
  ExpectInvalid(p, "row_elements");
  p = ValidParams(kv, slots, pool);
  p.k_stride = 7;
  ExpectInvalid(p, "k_stride");
  p = ValidParams(kv, slots, pool);
  p.pool_rows = 0;
  ExpectInvalid(p, "pool_rows");
  p = ValidParams(kv, slots, pool);
  p.slots = nullptr;
  ExpectInvalid(p, "slots");
  p = ValidParams(kv, slots, pool);
  p.v_cache = p.k_cache;
  ExpectInvalid(p, "v_cache");
}

class KvWriteTest : public testing::CudaTest {};

TEST_F(KvWriteTest, ScattersRowsLikeTheCpuCopy) {
  constexpr int kTokens = 37, kRow = 2 * 64, kStride = 3 * kRow, kPoolRows = 96;
  const std::vector<Bf16> qkv =
      testing::RandomBf16(rng_, static_cast<size_t>(kTokens) * kStride, 0.0f, 1.0f);
  // Distinct slots in random order; every fifth token is padding (skipped).
  std::vector<int64_t> rows(kPoolRows);
  for (int i = 0; i < kPoolRows; ++i) rows[i] = i;
  std::shuffle(rows.begin(), rows.end(), rng_);
  std::vector<int64_t> slots(rows.begin(), rows.begin() + kTokens);
  for (int t = 0; t < kTokens; t += 5) slots[t] = -1;
  const std::vector<Bf16> k_pool = testing::RandomBf16(rng_, kPoolRows * kRow, 0.0f, 1.0f);
  const std::vector<Bf16> v_pool = testing::RandomBf16(rng_, kPoolRows * kRow, 0.0f, 1.0f);
  std::vector<Bf16> want_k = k_pool, want_v = v_pool;
  for (int t = 0; t < kTokens; ++t) {
    if (slots[t] < 0) continue;
    std::memcpy(&want_k[slots[t] * kRow], &qkv[static_cast<size_t>(t) * kStride + kRow],
                kRow * sizeof(Bf16));
    std::memcpy(&want_v[slots[t] * kRow], &qkv[static_cast<size_t>(t) * kStride + 2 * kRow],
                kRow * sizeof(Bf16));
  }
  auto d_qkv = testing::Upload(qkv);
  auto d_slots = testing::Upload(slots);
  auto d_k = testing::Upload(k_pool);
  auto d_v = testing::Upload(v_pool);
  ASSERT_TRUE(d_qkv.ok() && d_slots.ok() && d_k.ok() && d_v.ok());
  KvWriteParams p;
  p.k = d_qkv->get() + kRow;
  p.k_stride = kStride;
  p.v = d_qkv->get() + 2 * kRow;
  p.v_stride = kStride;
  p.slots = d_slots->get();
  p.k_cache = d_k->get();
  p.v_cache = d_v->get();
  p.pool_rows = kPoolRows;
  p.tokens = kTokens;
  p.row_elements = kRow;
  ASSERT_TRUE(Invoke(p, nullptr).ok());
  auto got_k = testing::Download(d_k->get(), want_k.size());
  auto got_v = testing::Download(d_v->get(), want_v.size());
  ASSERT_TRUE(got_k.ok() && got_v.ok());
  EXPECT_EQ(std::memcmp(got_k->data(), want_k.data(), want_k.size() * sizeof(Bf16)), 0);
  EXPECT_EQ(std::memcmp(got_v->data(), want_v.data(), want_v.size() * sizeof(Bf16)), 0);
}

}  // namespace
}  // namespace tandem::kernels::cuda
