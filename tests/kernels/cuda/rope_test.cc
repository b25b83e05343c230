// kernels/cuda RoPE against kernels/cpu RopeInvoke on random q/k rows of a fused qkv layout with
// repeated and large positions. Parameter checks run everywhere; the comparisons skip without a
// CUDA device.
#include "kernels/cuda/rope.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

class RopeCheckTest : public ::testing::Test {
 protected:
  RopeParams Valid() {
    RopeParams p;
    p.q = row_.data();
    p.q_heads = 4;
    p.q_stride = kStride;
    p.k = row_.data() + 4 * kDim;
    p.k_heads = 2;
    p.k_stride = kStride;
    p.positions = positions_.data();
    p.inv_freq = inv_freq_.data();
    p.tokens = 2;
    p.head_dim = kDim;
    return p;
  }
  static constexpr int kDim = 8;
  static constexpr int kStride = 8 * kDim;
  std::vector<Bf16> row_ = std::vector<Bf16>(2 * kStride);
  std::vector<int32_t> positions_ = std::vector<int32_t>(2);
  std::vector<float> inv_freq_ = std::vector<float>(kDim / 2);
};

TEST_F(RopeCheckTest, AcceptsFusedRowAndQOnly) {
  RopeParams p = Valid();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  p.k = nullptr;
  p.k_heads = 0;
  EXPECT_TRUE(p.Check().ok()) << p.Check();
}

TEST_F(RopeCheckTest, RejectsBadFields) {
  RopeParams p = Valid();
  p.head_dim = 7;
  ExpectInvalid(p, "head_dim");
  p = Valid();
  p.q_stride = 3 * kDim;
  ExpectInvalid(p, "q_stride");
  p = Valid();
  p.k_stride = kDim;
  ExpectInvalid(p, "k_stride");
  p = Valid();
  p.k = row_.data() + 3 * kDim;  // shares q's last head
  ExpectInvalid(p, "overlaps");
  p = Valid();
  p.positions = nullptr;
  ExpectInvalid(p, "positions");
  p = Valid();
  p.inv_freq = nullptr;
  ExpectInvalid(p, "inv_freq");
  p = Valid();
  p.k = nullptr;
  ExpectInvalid(p, "k is null");
  p = Valid();
  p.tokens = -1;
  ExpectInvalid(p, "tokens");
  p = Valid();
  p.attention_scaling = std::nanf("");
  ExpectInvalid(p, "attention_scaling");
  p = Valid();
  p.q_norm = row_.data();  // without k_norm
  ExpectInvalid(p, "set together");
  p.k_norm = row_.data();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  p.norm_eps = -1.0f;
  ExpectInvalid(p, "norm_eps");
}

TEST_F(RopeCheckTest, TheFusedKvWriteNeedsAllItsFields) {
  std::vector<Bf16> k_cache(4 * 2 * kDim), v_cache(4 * 2 * kDim);
  std::vector<int64_t> slots(2);
  auto with_cache = [&] {
    RopeParams p = Valid();
    p.v = row_.data() + 6 * kDim;
    p.v_stride = kStride;
    p.slots = slots.data();
    p.k_cache = k_cache.data();
    p.v_cache = v_cache.data();
    p.pool_rows = 4;
    return p;
  };
  RopeParams p = with_cache();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  p.v = nullptr;
  ExpectInvalid(p, "v is null");
  p = with_cache();
  p.slots = nullptr;
  ExpectInvalid(p, "slots is null");
  p = with_cache();
  p.v_cache = k_cache.data();
  ExpectInvalid(p, "v_cache is k_cache");
  p = with_cache();
  p.pool_rows = 0;
  ExpectInvalid(p, "pool_rows");
  p = with_cache();
  p.v_stride = kDim;
  ExpectInvalid(p, "v_stride");
  p = with_cache();
  p.k_cache = nullptr;  // the rest set without it
  ExpectInvalid(p, "set k_cache");
}

class RopeCudaTest : public testing::CudaTest {
 protected:
  // With `norm`, each q and k head is RMS-normalised with its own weight first (Qwen3).
  // With `cache`, the launch also stores each token's rotated k and its v in a paged pool.
  void Run(int tokens, int q_heads, int k_heads, int head_dim, int max_position, float scaling,
           bool norm = false, bool cache = false) {
    SCOPED_TRACE(absl::StrCat("tokens ", tokens, " heads ", q_heads, "/", k_heads, " head_dim ",
                              head_dim, " max_position ", max_position, norm ? " normed" : "",
                              cache ? " with the KV write" : ""));
    // A fused [tokens, q | k | v] row like the qkv projection's output; v must stay untouched.
    const int stride = (q_heads + 2 * k_heads) * head_dim;
    const size_t n = static_cast<size_t>(tokens) * stride;
    const std::vector<Bf16> x = testing::RandomBf16(rng_, n, 0.0f, 1.5f);
    std::vector<int32_t> positions(tokens);
    std::uniform_int_distribution<int32_t> pick(0, max_position);
    for (int t = 0; t < tokens; ++t) {
      // Every third token repeats its predecessor's position (tree and block drafts do).
      positions[t] = t % 3 == 2 ? positions[t - 1] : pick(rng_);
    }
    std::vector<float> inv_freq(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i) {
      inv_freq[i] = 1.0f / std::pow(1e6f, 2.0f * i / head_dim);
    }

    constexpr float kEps = 1e-6f;
    const std::vector<Bf16> q_norm = testing::RandomBf16(rng_, head_dim, 1.0f, 0.3f);
    const std::vector<Bf16> k_norm = testing::RandomBf16(rng_, head_dim, 1.0f, 0.3f);
    std::vector<float> want = testing::ToFloat(x);
    if (norm) {
      // The norm's output as stored in bf16, which the rotation then reads.
      const std::vector<float> q_weight = testing::ToFloat(q_norm);
      const std::vector<float> k_weight = testing::ToFloat(k_norm);
      for (int t = 0; t < tokens; ++t) {
        float* row = want.data() + static_cast<size_t>(t) * stride;
        cpu::RmsNorm(row, q_weight.data(), row, q_heads, head_dim, kEps);
        cpu::RmsNorm(row + q_heads * head_dim, k_weight.data(), row + q_heads * head_dim, k_heads,
                     head_dim, kEps);
        for (int i = 0; i < (q_heads + k_heads) * head_dim; ++i) {
          row[i] = __bfloat162float(__float2bfloat16(row[i]));
        }
      }
    }
    const std::vector<float> rotated_in = want;
    for (int part = 0; part < 2; ++part) {
      cpu::RopeParams rp;
      rp.x = want.data() + (part == 0 ? 0 : q_heads * head_dim);
      rp.positions = positions.data();
      rp.inv_freq = inv_freq.data();
      rp.attention_scaling = scaling;
      rp.tokens = tokens;
      rp.heads = part == 0 ? q_heads : k_heads;
      rp.head_dim = head_dim;
      rp.row_stride = stride;
      ASSERT_TRUE(cpu::RopeCheck(rp));
      cpu::RopeInvoke(rp);
    }

    auto d_x = testing::Upload(x);
    auto d_positions = testing::Upload(positions);
    auto d_inv_freq = testing::Upload(inv_freq);
    auto d_q_norm = testing::Upload(q_norm);
    auto d_k_norm = testing::Upload(k_norm);
    ASSERT_TRUE(d_x.ok() && d_positions.ok() && d_inv_freq.ok() && d_q_norm.ok() && d_k_norm.ok());
    RopeParams p;
    p.q = d_x->get();
    p.q_stride = stride;
    p.q_heads = q_heads;
    p.k = d_x->get() + q_heads * head_dim;
    p.k_stride = stride;
    p.k_heads = k_heads;
    p.positions = d_positions->get();
    p.inv_freq = d_inv_freq->get();
    p.attention_scaling = scaling;
    p.tokens = tokens;
    p.head_dim = head_dim;
    if (norm) {
      p.q_norm = d_q_norm->get();
      p.k_norm = d_k_norm->get();
      p.norm_eps = kEps;
    }
    // The pool: token 0's slot lies past it (clamped to the last row), token 1's is negative
    // (skipped), the others count down from the row before the last.
    const int row_elements = k_heads * head_dim;
    const int64_t pool_rows = tokens + 3;
    std::vector<int64_t> slots(tokens);
    for (int t = 0; t < tokens; ++t) slots[t] = t == 0 ? pool_rows + 5 : pool_rows - 1 - t;
    if (tokens > 1) slots[1] = -1;
    const std::vector<Bf16> poison(static_cast<size_t>(pool_rows) * row_elements,
                                   __float2bfloat16(std::nanf("")));
    auto d_slots = testing::Upload(slots);
    auto d_k_cache = testing::Upload(poison);
    auto d_v_cache = testing::Upload(poison);
    ASSERT_TRUE(d_slots.ok() && d_k_cache.ok() && d_v_cache.ok());
    if (cache) {
      p.v = d_x->get() + (q_heads + k_heads) * head_dim;
      p.v_stride = stride;
      p.slots = d_slots->get();
      p.k_cache = d_k_cache->get();
      p.v_cache = d_v_cache->get();
      p.pool_rows = pool_rows;
    }
    ASSERT_TRUE(Invoke(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = testing::Download(d_x->get(), n);
    ASSERT_TRUE(got.ok());
    if (cache) {
      // Bit for bit the rotated k and the untouched v of the row; skipped rows stay poisoned.
      auto k_pool = testing::Download(d_k_cache->get(), poison.size());
      auto v_pool = testing::Download(d_v_cache->get(), poison.size());
      ASSERT_TRUE(k_pool.ok() && v_pool.ok());
      std::vector<int> writer(pool_rows, -1);
      for (int t = 0; t < tokens; ++t) {
        if (slots[t] >= 0) writer[std::min<int64_t>(slots[t], pool_rows - 1)] = t;
      }
      auto bits = [](Bf16 v) { return __bfloat16_as_ushort(v); };
      for (int64_t r = 0; r < pool_rows; ++r) {
        for (int e = 0; e < row_elements; ++e) {
          const size_t at = static_cast<size_t>(r) * row_elements + e;
          const int t = writer[r];
          const Bf16 k_want =
              t < 0 ? poison[at] : (*got)[static_cast<size_t>(t) * stride + q_heads * head_dim + e];
          const Bf16 v_want =
              t < 0 ? poison[at]
                    : x[static_cast<size_t>(t) * stride + (q_heads + k_heads) * head_dim + e];
          ASSERT_EQ(bits((*k_pool)[at]), bits(k_want)) << "k pool row " << r << " value " << e;
          ASSERT_EQ(bits((*v_pool)[at]), bits(v_want)) << "v pool row " << r << " value " << e;
        }
      }
    }
    // An output is a*cos -/+ b*sin of the pair (a, b): it may cancel, so the bound scales with
    // the pair's magnitude. Both sides form the same fp32 angle (one multiply); cos/sin differ by
    // an ulp or two and the products may be fused, ~1e-7 of the magnitude; then the bf16
    // rounding of the output. Normed, the rotation's inputs may each sit one bf16 step apart
    // (the sum of squares is added in another order, so the scale differs in its last bits).
    const int half = head_dim / 2;
    const std::vector<float>& x_float = rotated_in;
    const float input_rounding = norm ? testing::kBf16Unit : 0.0f;
    EXPECT_TRUE(testing::AllWithin("x", *got, want, stride, [&](size_t i) {
      const int col = static_cast<int>(i % stride);
      if (col >= (q_heads + k_heads) * head_dim) return 0.0f;  // v: untouched, exactly
      const int d = col % head_dim;
      const size_t base = i - d;
      const float a = x_float[base + d % half];
      const float b = x_float[base + d % half + half];
      const float magnitude = (std::fabs(a) + std::fabs(b)) * std::fabs(scaling);
      return testing::kBf16Unit * std::fabs(want[i]) + (1e-6f + input_rounding) * magnitude +
             1e-30f;
    }));
  }
};

TEST_F(RopeCudaTest, MatchesCpu) {
  Run(1, 1, 1, 2, 10, 1.0f);
  Run(7, 8, 2, 64, 4096, 1.0f);
  Run(33, 16, 4, 128, 131072, 1.0f);  // long-context positions
  Run(5, 12, 12, 80, 100, 1.1f);      // MHA, non-power-of-two head_dim, scaling
}

TEST_F(RopeCudaTest, NormedHeadsMatchCpuNormThenRotation) {
  Run(1, 1, 1, 2, 10, 1.0f, true);
  Run(7, 32, 8, 128, 40960, 1.0f, true);  // Qwen3-8B's heads
  Run(3, 12, 4, 80, 100, 1.1f, true);     // head_dim not a multiple of 64
  Run(2, 4, 2, 256, 1000, 1.0f, true);    // two pairs per lane
}

TEST_F(RopeCudaTest, TheFusedKvWriteStoresTheRotatedKeysAndTheValues) {
  for (bool norm : {false, true}) {
    Run(1, 1, 1, 2, 10, 1.0f, norm, true);
    Run(7, 32, 8, 128, 40960, 1.0f, norm, true);  // Qwen3-8B's heads
    Run(3, 12, 4, 80, 100, 1.1f, norm, true);
    Run(2, 4, 2, 256, 1000, 1.0f, norm, true);
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
