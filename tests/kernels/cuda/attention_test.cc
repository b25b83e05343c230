// kernels/cuda paged attention against kernels/cpu AttentionInvoke, extend by extend, on random
// batches: paged caches with shuffled blocks, every visibility kind, GQA, sliding windows,
// queries that see nothing, and both the one-pass and the split-KV paths on the same inputs.
// Parameter checks run everywhere; the comparisons skip without a CUDA device.
#include "kernels/cuda/attention.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/attention.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

class AttentionCheckTest : public ::testing::Test {
 protected:
  PagedAttentionParams Valid() {
    PagedAttentionParams p;
    p.q = q_.data();
    p.q_stride = 4 * 8;
    p.k_cache = cache_.data();
    p.v_cache = cache_.data();
    p.block_tables = tables_.data();
    p.block_size = 16;
    p.extends = extends_.data();
    p.num_extends = 1;
    p.total_tokens = 2;
    p.q_heads = 4;
    p.kv_heads = 2;
    p.head_dim = 8;
    p.scale = 0.35f;
    p.max_kv_len = 10;
    p.out = out_.data();
    p.out_stride = 4 * 8;
    return p;
  }
  std::vector<Bf16> q_ = std::vector<Bf16>(64), out_ = std::vector<Bf16>(64),
                    cache_ = std::vector<Bf16>(16);
  std::vector<int32_t> tables_ = std::vector<int32_t>(4);
  std::vector<AttentionExtend> extends_ = std::vector<AttentionExtend>(1);
};

TEST_F(AttentionCheckTest, AcceptsValid) {
  PagedAttentionParams p = Valid();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(AttentionSplits(p), 1);
  EXPECT_EQ(WorkspaceBytes(p), 0u);
}

TEST_F(AttentionCheckTest, RejectsBadFields) {
  PagedAttentionParams p = Valid();
  p.kv_heads = 3;
  ExpectInvalid(p, "kv_heads");
  p = Valid();
  p.head_dim = 257;
  ExpectInvalid(p, "head_dim");
  p = Valid();
  p.block_size = 0;
  ExpectInvalid(p, "block_size");
  p = Valid();
  p.q_stride = 31;
  ExpectInvalid(p, "q_stride");
  p = Valid();
  p.out_stride = 16;
  ExpectInvalid(p, "out_stride");
  p = Valid();
  p.window = -1;
  ExpectInvalid(p, "window");
  p = Valid();
  p.num_splits = 65;
  ExpectInvalid(p, "num_splits");
  p = Valid();
  p.num_extends = 0;
  ExpectInvalid(p, "num_extends");
  p = Valid();
  p.extends = nullptr;
  ExpectInvalid(p, "extends");
  p = Valid();
  p.out = q_.data() + 8;
  ExpectInvalid(p, "out overlaps q");
  p = Valid();
  p.scale = NAN;
  ExpectInvalid(p, "scale");
}

TEST_F(AttentionCheckTest, SplitHeuristicAndWorkspace) {
  PagedAttentionParams p = Valid();
  // Decode of one sequence with a long context: few CTAs, long KV -> split.
  p.total_tokens = 1;
  p.max_kv_len = 32768;
  const int splits = AttentionSplits(p);
  EXPECT_GT(splits, 1);
  EXPECT_LE(splits, 16);
  EXPECT_EQ(WorkspaceBytes(p), static_cast<size_t>(splits) * 1 * 4 * (8 + 2) * sizeof(float));
  ExpectInvalid(p, "workspace");  // no workspace given
  // Many CTAs already: no split. Short contexts: no split.
  p.total_tokens = 512;
  EXPECT_EQ(AttentionSplits(p), 1);
  p.total_tokens = 1;
  p.max_kv_len = 100;
  EXPECT_EQ(AttentionSplits(p), 1);
  // A batch-1 decode step at context 512 (4 heads): chunks of 64 slots.
  p.max_kv_len = 512;
  EXPECT_EQ(AttentionSplits(p), 8);
  // Forced.
  p.num_splits = 5;
  EXPECT_EQ(AttentionSplits(p), 5);
}

// Mirrors worker/model/extend.h Visibility::Sees.
bool Sees(const AttentionExtend& e, const std::vector<uint64_t>& masks, int i, int j) {
  switch (e.visibility) {
    case AttentionVisibility::kCausal:
      return j <= i;
    case AttentionVisibility::kFull:
      return true;
    case AttentionVisibility::kBlock:
      return j / e.visibility_block <= i / e.visibility_block;
    case AttentionVisibility::kExplicit: {
      const int words = (e.new_tokens + 63) / 64;
      return (masks[e.mask_offset + static_cast<size_t>(i) * words + j / 64] >> (j % 64)) & 1u;
    }
  }
  return false;
}

struct ExtendSpec {
  int context;
  int new_tokens;
  AttentionVisibility kind;
  int visibility_block = 0;
};

struct Problem {
  int q_heads, kv_heads, head_dim, block_size, window;
  std::vector<ExtendSpec> extends;
};

class AttentionCudaTest : public testing::CudaTest {
 protected:
  // Builds the batch, runs the CPU reference per extend and the CUDA op once per entry of
  // `split_counts` (0 = heuristic) on the same device inputs; every output element is checked.
  void Run(const Problem& problem, const std::vector<int>& split_counts) {
    const int hq = problem.q_heads, hkv = problem.kv_heads, d = problem.head_dim;
    const int bs = problem.block_size;
    const int row = hkv * d;
    // Extends, block tables (shuffled blocks of one pool, plus unused blocks whose garbage must
    // never leak into a result), masks.
    std::vector<AttentionExtend> extends;
    std::vector<int32_t> tables;
    std::vector<uint64_t> masks;
    int total = 0, max_kv = 0, blocks_needed = 0;
    for (const ExtendSpec& s : problem.extends) {
      blocks_needed += (s.context + s.new_tokens + bs - 1) / bs;
    }
    const int num_blocks = blocks_needed + 3;
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng_);
    int next_block = 0;
    std::bernoulli_distribution coin(0.5);
    for (const ExtendSpec& s : problem.extends) {
      AttentionExtend e;
      e.token_offset = total;
      e.new_tokens = s.new_tokens;
      e.context_len = s.context;
      e.visibility = s.kind;
      e.visibility_block = s.visibility_block;
      e.block_table_offset = static_cast<int32_t>(tables.size());
      e.mask_offset = static_cast<int64_t>(masks.size());
      const int slots = s.context + s.new_tokens;
      for (int b = 0; b < (slots + bs - 1) / bs; ++b) tables.push_back(pool[next_block++]);
      const int words = (s.new_tokens + 63) / 64;
      if (s.kind == AttentionVisibility::kExplicit) {
        for (int i = 0; i < s.new_tokens; ++i) {
          for (int w = 0; w < words; ++w) {
            uint64_t bits = 0;
            // Row 1 sees no new token at all; others random (diagonal not implied).
            for (int b = 0; b < 64; ++b) {
              if (i != 1 && coin(rng_)) bits |= uint64_t{1} << b;
            }
            masks.push_back(bits);
          }
        }
      }
      extends.push_back(e);
      total += s.new_tokens;
      max_kv = std::max(max_kv, slots);
    }
    if (tables.empty()) tables.push_back(0);
    if (masks.empty()) masks.push_back(0);

    const int q_stride = hq * d + 16;  // like a fused qkv row: q then other columns
    const std::vector<Bf16> q =
        testing::RandomBf16(rng_, static_cast<size_t>(total) * q_stride, 0, 1);
    const std::vector<Bf16> k =
        testing::RandomBf16(rng_, static_cast<size_t>(num_blocks) * bs * row, 0, 1);
    const std::vector<Bf16> v =
        testing::RandomBf16(rng_, static_cast<size_t>(num_blocks) * bs * row, 0, 1);
    const std::vector<float> qf = testing::ToFloat(q), kf = testing::ToFloat(k),
                             vf = testing::ToFloat(v);

    // CPU reference, one extend at a time, with its bit rows from the same Sees rule.
    const int out_stride = hq * d;
    std::vector<float> want(static_cast<size_t>(total) * out_stride);
    for (const AttentionExtend& e : extends) {
      const int n = e.new_tokens;
      const int words = (n + 63) / 64;
      std::vector<uint64_t> bits(std::max(1, n * words), 0);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          if (Sees(e, masks, i, j))
            bits[static_cast<size_t>(i) * words + j / 64] |= uint64_t{1} << (j % 64);
        }
      }
      cpu::AttentionParams ap;
      ap.q = qf.data() + static_cast<size_t>(e.token_offset) * q_stride;
      ap.q_stride = q_stride;
      ap.k_cache = kf.data();
      ap.v_cache = vf.data();
      ap.block_table = tables.data() + e.block_table_offset;
      ap.block_size = bs;
      ap.context_len = e.context_len;
      ap.new_tokens = n;
      ap.mask = bits.data();
      ap.mask_words = words;
      ap.q_heads = hq;
      ap.kv_heads = hkv;
      ap.head_dim = d;
      ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
      ap.window = problem.window;
      ap.out = want.data() + static_cast<size_t>(e.token_offset) * out_stride;
      ap.out_stride = out_stride;
      ASSERT_STREQ(cpu::AttentionCheck(ap), "");
      std::vector<float> workspace(cpu::AttentionWorkspaceFloats(ap) + 1);
      cpu::AttentionInvoke(ap, workspace.data());
    }

    auto d_q = testing::Upload(q);
    auto d_k = testing::Upload(k);
    auto d_v = testing::Upload(v);
    auto d_tables = testing::Upload(tables);
    auto d_extends = testing::Upload(extends);
    auto d_masks = testing::Upload(masks);
    ASSERT_TRUE(d_q.ok() && d_k.ok() && d_v.ok() && d_tables.ok() && d_extends.ok() &&
                d_masks.ok());
    for (const int splits : split_counts) {
      PagedAttentionParams p;
      p.q = d_q->get();
      p.q_stride = q_stride;
      p.k_cache = d_k->get();
      p.v_cache = d_v->get();
      p.block_tables = d_tables->get();
      p.block_size = bs;
      p.extends = d_extends->get();
      p.num_extends = static_cast<int>(extends.size());
      p.masks = d_masks->get();
      p.total_tokens = total;
      p.q_heads = hq;
      p.kv_heads = hkv;
      p.head_dim = d;
      p.scale = 1.0f / std::sqrt(static_cast<float>(d));
      p.window = problem.window;
      p.max_kv_len = max_kv;
      p.num_splits = splits;
      p.out_stride = out_stride;
      SCOPED_TRACE(absl::StrCat("requested splits ", splits, " used ", AttentionSplits(p)));
      auto d_out = testing::Upload(testing::NanBf16(want.size()));
      auto d_workspace = testing::Allocate(WorkspaceBytes(p));
      ASSERT_TRUE(d_out.ok() && d_workspace.ok());
      p.out = d_out->get();
      p.workspace = d_workspace->get();
      p.workspace_bytes = WorkspaceBytes(p);
      const absl::Status status = Invoke(p, nullptr);
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto got = testing::Download(p.out, want.size());
      ASSERT_TRUE(got.ok());
      // The output is a convex combination of V rows (|V| <~ 5): fp32 softmax differences are
      // ~1e-6 of that; bf16 output rounding moves it by at most one unit roundoff.
      EXPECT_TRUE(testing::AllWithin("out", *got, want, out_stride, [&](size_t i) {
        return testing::kBf16Unit * std::fabs(want[i]) + 1e-4f;
      }));
    }
  }
};

using V = AttentionVisibility;

TEST_F(AttentionCudaTest, EveryVisibilityKindMatchesCpu) {
  Problem problem{.q_heads = 8, .kv_heads = 2, .head_dim = 64, .block_size = 16, .window = 0};
  problem.extends = {{37, 1, V::kCausal},   {0, 9, V::kCausal},   {20, 7, V::kFull},
                     {5, 13, V::kBlock, 4}, {0, 5, V::kExplicit}, {40, 70, V::kExplicit},
                     {130, 3, V::kBlock, 2}};
  Run(problem, {0, 1, 3});
}

TEST_F(AttentionCudaTest, HeadShapesMatchCpu) {
  Problem mha{.q_heads = 4, .kv_heads = 4, .head_dim = 128, .block_size = 32, .window = 0};
  mha.extends = {{100, 4, V::kCausal}, {0, 1, V::kCausal}};
  Run(mha, {0, 2});
  Problem wide{.q_heads = 2, .kv_heads = 1, .head_dim = 256, .block_size = 8, .window = 0};
  wide.extends = {{65, 6, V::kFull}};
  Run(wide, {0, 4});
  Problem odd{.q_heads = 6, .kv_heads = 3, .head_dim = 80, .block_size = 5, .window = 0};
  odd.extends = {{11, 3, V::kExplicit}, {7, 2, V::kCausal}};
  Run(odd, {0, 2});
}

TEST_F(AttentionCudaTest, SlidingWindowMatchesCpu) {
  Problem problem{.q_heads = 4, .kv_heads = 2, .head_dim = 64, .block_size = 16, .window = 24};
  problem.extends = {
      {100, 1, V::kCausal}, {50, 30, V::kCausal}, {10, 8, V::kFull}, {0, 6, V::kExplicit}};
  Run(problem, {0, 1, 4});
}

TEST_F(AttentionCudaTest, LongContextSplitKvMatchesCpu) {
  // Small batch, long contexts: the heuristic must pick split-KV here.
  Problem problem{.q_heads = 16, .kv_heads = 4, .head_dim = 128, .block_size = 16, .window = 0};
  problem.extends = {{6000, 1, V::kCausal}, {3000, 4, V::kExplicit}};
  PagedAttentionParams probe;
  probe.total_tokens = 5;
  probe.q_heads = 16;
  probe.max_kv_len = 6001;
  ASSERT_GT(AttentionSplits(probe), 1);
  Run(problem, {0, 1, 7, 64});
}

}  // namespace
}  // namespace tandem::kernels::cuda
