// kernels/cuda KV commit against worker/kv KvCache::Commit itself: the same random pools and
// keep lists committed by both, every element of every layer's K and V pools compared bit for
// bit. Parameter checks run everywhere; the comparison skips without a CUDA device.
#include "kernels/cuda/kv_commit.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/kv/kv_cache.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

TEST(KvCommitCheckTest, ValidatesFields) {
  std::vector<Bf16> k(64), v(64);
  std::vector<int32_t> tables(2), keep(2);
  std::vector<KvCommitSequence> sequences(1);
  KvCommitParams p;
  p.k_cache = k.data();
  p.v_cache = v.data();
  p.layer_stride = 32;
  p.num_layers = 2;
  p.block_size = 4;
  p.row_elements = 8;
  p.block_tables = tables.data();
  p.keep = keep.data();
  p.sequences = sequences.data();
  p.num_sequences = 1;
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  KvCommitParams q = p;
  q.layer_stride = 31;
  ExpectInvalid(q, "layer_stride");
  q = p;
  q.num_layers = 0;
  ExpectInvalid(q, "num_layers");
  q = p;
  q.block_size = 0;
  ExpectInvalid(q, "block_size");
  q = p;
  q.row_elements = 0;
  ExpectInvalid(q, "row_elements");
  q = p;
  q.keep = nullptr;
  ExpectInvalid(q, "keep");
  q = p;
  q.v_cache = k.data();
  ExpectInvalid(q, "v_cache is k_cache");
  q = p;
  q.num_sequences = -1;
  ExpectInvalid(q, "num_sequences");
  q = KvCommitParams{};
  q.num_layers = 1;
  q.block_size = 1;
  q.row_elements = 1;
  EXPECT_TRUE(q.Check().ok()) << q.Check();  // nothing to commit
}

class KvCommitCudaTest : public testing::CudaTest {};

TEST_F(KvCommitCudaTest, MatchesKvCacheCommit) {
  KvCacheOptions options;
  options.num_layers = 3;
  options.num_kv_heads = 2;
  options.head_dim = 24;
  options.block_size = 8;
  options.num_blocks = 64;
  KvCache cache(options);
  const int row = options.num_kv_heads * options.head_dim;
  const size_t pool_floats = static_cast<size_t>(options.num_blocks) * options.block_size * row;
  // Every pool element gets a random bf16 value (as float), so any misplaced row shows.
  std::normal_distribution<float> dist(0, 1);
  for (int l = 0; l < options.num_layers; ++l) {
    for (size_t i = 0; i < pool_floats; ++i) {
      cache.Keys(l)[i] = __bfloat162float(__float2bfloat16(dist(rng_)));
      cache.Values(l)[i] = __bfloat162float(__float2bfloat16(dist(rng_)));
    }
  }
  // Sequences: committed lengths, tentative counts and keep lists (prefix, scattered, none,
  // all, a move across a block edge).
  struct Case {
    int committed;
    int tentative;
    std::vector<int32_t> keep;
  };
  const std::vector<Case> cases = {
      {5, 6, {0, 1, 2}},       {13, 9, {0, 2, 5, 8}}, {0, 4, {}}, {8, 8, {0, 1, 2, 3, 4, 5, 6, 7}},
      {30, 12, {3, 4, 9, 11}}, {1, 20, {7, 19}}};
  std::vector<KvCommitSequence> sequences;
  std::vector<int32_t> tables, keep;
  for (size_t s = 0; s < cases.size(); ++s) {
    const SeqId seq = static_cast<SeqId>(s);
    ASSERT_TRUE(cache.AddSequence(seq).ok());
    if (cases[s].committed > 0) {
      ASSERT_TRUE(cache.Reserve(seq, cases[s].committed).has_value());
      std::vector<int32_t> all(cases[s].committed);
      for (int i = 0; i < cases[s].committed; ++i) all[i] = i;
      ASSERT_TRUE(cache.Commit(seq, all).ok());
    }
    ASSERT_TRUE(cache.Reserve(seq, cases[s].tentative).has_value());
  }
  for (size_t s = 0; s < cases.size(); ++s) {
    KvCommitSequence d;
    d.block_table_offset = static_cast<int32_t>(tables.size());
    d.committed = cases[s].committed;
    d.keep_offset = static_cast<int32_t>(keep.size());
    d.keep_count = static_cast<int32_t>(cases[s].keep.size());
    const auto table = cache.BlockTable(static_cast<SeqId>(s));
    tables.insert(tables.end(), table.begin(), table.end());
    keep.insert(keep.end(), cases[s].keep.begin(), cases[s].keep.end());
    sequences.push_back(d);
  }
  // Device pools (layer-major) from the pre-commit state.
  std::vector<Bf16> k_host(pool_floats * options.num_layers), v_host(k_host.size());
  for (int l = 0; l < options.num_layers; ++l) {
    for (size_t i = 0; i < pool_floats; ++i) {
      k_host[l * pool_floats + i] = __float2bfloat16(cache.Keys(l)[i]);
      v_host[l * pool_floats + i] = __float2bfloat16(cache.Values(l)[i]);
    }
  }
  for (size_t s = 0; s < cases.size(); ++s) {
    ASSERT_TRUE(cache.Commit(static_cast<SeqId>(s), cases[s].keep).ok());
  }
  if (keep.empty()) keep.push_back(0);
  auto d_k = testing::Upload(k_host);
  auto d_v = testing::Upload(v_host);
  auto d_tables = testing::Upload(tables);
  auto d_keep = testing::Upload(keep);
  auto d_sequences = testing::Upload(sequences);
  ASSERT_TRUE(d_k.ok() && d_v.ok() && d_tables.ok() && d_keep.ok() && d_sequences.ok());
  KvCommitParams p;
  p.k_cache = d_k->get();
  p.v_cache = d_v->get();
  p.layer_stride = static_cast<int64_t>(pool_floats);
  p.num_layers = options.num_layers;
  p.block_size = options.block_size;
  p.row_elements = row;
  p.block_tables = d_tables->get();
  p.keep = d_keep->get();
  p.sequences = d_sequences->get();
  p.num_sequences = static_cast<int>(sequences.size());
  ASSERT_TRUE(Invoke(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto got_k = testing::Download(p.k_cache, k_host.size());
  auto got_v = testing::Download(p.v_cache, v_host.size());
  ASSERT_TRUE(got_k.ok() && got_v.ok());
  std::vector<float> want_k(k_host.size()), want_v(v_host.size());
  for (int l = 0; l < options.num_layers; ++l) {
    std::copy(cache.Keys(l), cache.Keys(l) + pool_floats, want_k.begin() + l * pool_floats);
    std::copy(cache.Values(l), cache.Values(l) + pool_floats, want_v.begin() + l * pool_floats);
  }
  // Pure moves: bit-exact, rows outside the commits unchanged.
  EXPECT_TRUE(testing::AllClose("k", *got_k, want_k, row, 0.0f, 0.0f));
  EXPECT_TRUE(testing::AllClose("v", *got_v, want_v, row, 0.0f, 0.0f));
}

}  // namespace
}  // namespace tandem::kernels::cuda
