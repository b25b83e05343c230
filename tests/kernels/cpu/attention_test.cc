// kernels/cpu attention against a naive double-precision reference written here, on random
// inputs: scattered block tables, every visibility pattern, GQA groups, sliding windows, and both
// the direct (few new tokens) and the GEMM (tiled) paths. Every output element is checked.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace tandem::kernels::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written into stride padding; the kernel must leave it alone.
constexpr float kSentinel = 12345.0f;
// Error bound relative to the largest |V| element the row sees: the output is a convex
// combination of those rows.
constexpr double kRelTol = 1e-5;

enum class Pattern { kCausal, kFull, kRandom, kZeroRow };

const char* Name(Pattern p) {
  switch (p) {
    case Pattern::kCausal:
      return "causal";
    case Pattern::kFull:
      return "full";
    case Pattern::kRandom:
      return "random";
    case Pattern::kZeroRow:
      return "zero_row";
  }
  return "?";
}

struct Shape {
  int block_size = 4;
  int context = 0;
  int new_tokens = 1;
  int q_heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int window = 0;
  Pattern pattern = Pattern::kCausal;
  int stride_pad = 0;  // extra floats per q/out row
  float value_range = 1.0f;
  float scale = 0.0f;        // 0: 1 / sqrt(head_dim)
  bool consecutive = false;  // the sequence's blocks in order, one after another in the pool
};

std::string Describe(const Shape& s) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "block_size=%d context=%d new_tokens=%d q_heads=%d kv_heads=%d head_dim=%d "
                "window=%d pattern=%s stride_pad=%d consecutive=%d",
                s.block_size, s.context, s.new_tokens, s.q_heads, s.kv_heads, s.head_dim, s.window,
                Name(s.pattern), s.stride_pad, s.consecutive);
  return buf;
}

// All inputs of one call, laid out the way the engine's KV cache lays them out.
struct Problem {
  Shape shape;
  std::vector<float> q, k_cache, v_cache;
  std::vector<int32_t> block_table;
  std::vector<uint64_t> mask;
  int mask_words = 0;

  bool Sees(int query, int slot) const {
    const Shape& s = shape;
    if (s.window > 0 && s.context + query - slot >= s.window) return false;
    if (slot < s.context) return true;
    const int j = slot - s.context;
    return (mask[static_cast<size_t>(query) * mask_words + j / 64] >> (j % 64)) & 1u;
  }
  size_t CacheIndex(int slot, int kv_head) const {
    const Shape& s = shape;
    const size_t row =
        static_cast<size_t>(block_table[slot / s.block_size]) * s.block_size + slot % s.block_size;
    return (row * s.kv_heads + kv_head) * s.head_dim;
  }
  int QStride() const { return shape.q_heads * shape.head_dim + shape.stride_pad; }
  float Scale() const {
    return shape.scale != 0.0f ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  }
};

Problem MakeProblem(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-s.value_range, s.value_range);
  Problem p;
  p.shape = s;
  const int total = s.context + s.new_tokens;
  const int used_blocks = (total + s.block_size - 1) / s.block_size;
  // A pool with spare blocks; the sequence gets a shuffled subset, so its blocks are neither
  // contiguous nor in order (or, when `consecutive`, a run of them from the pool's middle).
  // Every cache row outside the sequence's slots is NaN: reading one would poison the result.
  const int pool = 2 * used_blocks + 3;
  std::vector<int32_t> ids(pool);
  std::iota(ids.begin(), ids.end(), 0);
  if (s.consecutive) {
    p.block_table.assign(ids.begin() + used_blocks / 2 + 1,
                         ids.begin() + used_blocks / 2 + 1 + used_blocks);
  } else {
    std::shuffle(ids.begin(), ids.end(), rng);
    p.block_table.assign(ids.begin(), ids.begin() + used_blocks);
  }
  const size_t row_floats = static_cast<size_t>(s.kv_heads) * s.head_dim;
  p.k_cache.assign(static_cast<size_t>(pool) * s.block_size * row_floats, kNaN);
  p.v_cache.assign(p.k_cache.size(), kNaN);
  for (int slot = 0; slot < total; ++slot) {
    for (int g = 0; g < s.kv_heads; ++g) {
      const size_t at = p.CacheIndex(slot, g);
      for (int d = 0; d < s.head_dim; ++d) {
        p.k_cache[at + d] = uni(rng);
        p.v_cache[at + d] = uni(rng);
      }
    }
  }
  p.q.assign(static_cast<size_t>(s.new_tokens) * p.QStride(), kNaN);
  for (int i = 0; i < s.new_tokens; ++i) {
    for (int c = 0; c < s.q_heads * s.head_dim; ++c) {
      p.q[static_cast<size_t>(i) * p.QStride() + c] = uni(rng);
    }
  }
  p.mask_words = (s.new_tokens + 63) / 64;
  p.mask.assign(static_cast<size_t>(s.new_tokens) * p.mask_words, 0);
  std::bernoulli_distribution coin(0.5);
  const int zero_row = s.new_tokens / 2;
  for (int i = 0; i < s.new_tokens; ++i) {
    uint64_t* row = &p.mask[static_cast<size_t>(i) * p.mask_words];
    for (int j = 0; j < s.new_tokens; ++j) {
      bool bit = false;
      switch (s.pattern) {
        case Pattern::kCausal:
          bit = j <= i;
          break;
        case Pattern::kFull:
          bit = true;
          break;
        case Pattern::kRandom:
          bit = coin(rng);
          break;
        case Pattern::kZeroRow:
          bit = j <= i && i != zero_row;
          break;
      }
      if (bit) row[j / 64] |= uint64_t{1} << (j % 64);
    }
    // Bits past new_tokens carry no meaning; set them to make sure they are ignored.
    if (s.pattern == Pattern::kRandom && s.new_tokens % 64 != 0) {
      row[p.mask_words - 1] |= ~uint64_t{0} << (s.new_tokens % 64);
    }
  }
  return p;
}

// out[i, h, :] in double; `seen` gets, per (i, h), the largest |V| element over visible keys
// (0 when the query sees nothing).
std::vector<double> Reference(const Problem& p, std::vector<double>* seen) {
  const Shape& s = p.shape;
  const int total = s.context + s.new_tokens;
  const int group = s.q_heads / s.kv_heads;
  std::vector<double> out(static_cast<size_t>(s.new_tokens) * s.q_heads * s.head_dim, 0.0);
  seen->assign(static_cast<size_t>(s.new_tokens) * s.q_heads, 0.0);
  std::vector<double> scores(total);
  for (int i = 0; i < s.new_tokens; ++i) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int g = h / group;
      const float* q = &p.q[static_cast<size_t>(i) * p.QStride() + h * s.head_dim];
      double max = -std::numeric_limits<double>::infinity();
      for (int slot = 0; slot < total; ++slot) {
        if (!p.Sees(i, slot)) continue;
        const float* k = &p.k_cache[p.CacheIndex(slot, g)];
        double dot = 0.0;
        for (int d = 0; d < s.head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
        scores[slot] = dot * p.Scale();
        max = std::max(max, scores[slot]);
      }
      if (max == -std::numeric_limits<double>::infinity()) continue;
      double denom = 0.0;
      double* o = &out[(static_cast<size_t>(i) * s.q_heads + h) * s.head_dim];
      double& big = (*seen)[static_cast<size_t>(i) * s.q_heads + h];
      for (int slot = 0; slot < total; ++slot) {
        if (!p.Sees(i, slot)) continue;
        const double w = std::exp(scores[slot] - max);
        denom += w;
        const float* v = &p.v_cache[p.CacheIndex(slot, g)];
        for (int d = 0; d < s.head_dim; ++d) {
          o[d] += w * v[d];
          big = std::max(big, std::fabs(static_cast<double>(v[d])));
        }
      }
      for (int d = 0; d < s.head_dim; ++d) o[d] /= denom;
    }
  }
  return out;
}

AttentionParams Params(const Problem& p, std::vector<float>* out) {
  const Shape& s = p.shape;
  AttentionParams a;
  a.q = p.q.data();
  a.q_stride = p.QStride();
  a.k_cache = p.k_cache.data();
  a.v_cache = p.v_cache.data();
  a.block_table = p.block_table.data();
  a.block_size = s.block_size;
  a.context_len = s.context;
  a.new_tokens = s.new_tokens;
  a.mask = p.mask.data();
  a.mask_words = p.mask_words;
  a.q_heads = s.q_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.scale = p.Scale();
  a.window = s.window;
  a.out_stride = s.q_heads * s.head_dim + s.stride_pad;
  out->assign(static_cast<size_t>(s.new_tokens) * a.out_stride, kSentinel);
  a.out = out->data();
  return a;
}

// Runs the kernel on `p` and checks every output element against the reference, the stride
// padding and the workspace bound (a NaN-filled workspace with a guard tail).
void RunAndCompare(const Problem& p) {
  const Shape& s = p.shape;
  std::vector<float> out;
  const AttentionParams a = Params(p, &out);
  ASSERT_STREQ(AttentionCheck(a), "") << Describe(s);
  constexpr size_t kGuard = 64;
  const size_t ws = AttentionWorkspaceFloats(a);
  std::vector<float> workspace(ws + kGuard, kNaN);
  std::fill(workspace.begin() + ws, workspace.end(), kSentinel);
  AttentionInvoke(a, workspace.data());

  std::vector<double> seen;
  const std::vector<double> ref = Reference(p, &seen);
  int bad = 0;
  std::string first;
  for (int i = 0; i < s.new_tokens; ++i) {
    for (int h = 0; h < s.q_heads; ++h) {
      const double row_scale = seen[static_cast<size_t>(i) * s.q_heads + h];
      for (int d = 0; d < s.head_dim; ++d) {
        const float got = out[static_cast<size_t>(i) * a.out_stride + h * s.head_dim + d];
        const double want = ref[(static_cast<size_t>(i) * s.q_heads + h) * s.head_dim + d];
        // A query that sees nothing must get exact zeros.
        const double tol = kRelTol * row_scale;
        if (!(std::fabs(got - want) <= tol)) {
          if (++bad <= 8) {
            char line[160];
            std::snprintf(line, sizeof(line), "\n  out[%d, %d, %d] = %.9g, want %.9g (tol %.3g)", i,
                          h, d, got, want, tol);
            first += line;
          }
        }
      }
    }
    for (int c = s.q_heads * s.head_dim; c < a.out_stride; ++c) {
      if (out[static_cast<size_t>(i) * a.out_stride + c] != kSentinel && ++bad <= 8) {
        first += "\n  stride padding of row " + std::to_string(i) + " written";
      }
    }
  }
  for (size_t g = ws; g < workspace.size(); ++g) {
    if (workspace[g] != kSentinel) {
      ++bad;
      first += "\n  wrote past AttentionWorkspaceFloats at " + std::to_string(g);
      break;
    }
  }
  EXPECT_EQ(bad, 0) << Describe(s) << ": " << bad << " mismatches, first:" << first;
}

// (block_size, context, new_tokens, group): each instance sweeps patterns and windows.
class AttentionSweep : public ::testing::TestWithParam<std::tuple<int, int, int, int>> {};

TEST_P(AttentionSweep, MatchesReference) {
  const auto [block_size, context, new_tokens, group] = GetParam();
  uint32_t seed = 1;
  for (Pattern pattern : {Pattern::kCausal, Pattern::kFull, Pattern::kRandom, Pattern::kZeroRow}) {
    for (int window : {0, 1, 37}) {
      Shape s;
      s.block_size = block_size;
      s.context = context;
      s.new_tokens = new_tokens;
      s.kv_heads = 2;
      s.q_heads = 2 * group;
      s.head_dim = 16;
      s.window = window;
      s.pattern = pattern;
      s.stride_pad = (seed % 2) * 3;
      s.consecutive = seed % 3 == 0;
      RunAndCompare(MakeProblem(s, seed++ * 7919 + block_size * 131 + context * 17 + new_tokens));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, AttentionSweep,
                         ::testing::Combine(::testing::Values(1, 4, 16),   // block_size
                                            ::testing::Values(0, 5, 300),  // context
                                            ::testing::Values(1, 7, 200),  // new_tokens
                                            ::testing::Values(1, 2, 4)));  // group

// Head sizes that are not a multiple of the vector width, real model head sizes, and the new
// token counts on either side of the direct/GEMM switch.
TEST(AttentionTest, HeadDimsAndPathBoundary) {
  uint32_t seed = 100;
  for (int head_dim : {3, 20, 64, 128}) {
    for (int new_tokens : {1, 2, 4, 5, 8, 65, 130}) {
      Shape s;
      s.block_size = 16;
      s.context = 40;
      s.new_tokens = new_tokens;
      s.q_heads = 6;
      s.kv_heads = 2;
      s.head_dim = head_dim;
      s.pattern = new_tokens % 2 ? Pattern::kRandom : Pattern::kCausal;
      RunAndCompare(MakeProblem(s, seed++));
    }
  }
}

// The direct path computes each query as a one-token extend computes it: query i of a causal
// extend equals, bit for bit, the decode step of that token over the context and the extend's
// tokens before it (what makes a short verify step's logits the decode steps'), also when a
// sliding window starts each query's keys at another slot (mid-block).
TEST(AttentionTest, DirectPathQueriesEqualOneTokenExtends) {
  for (const auto& [head_dim, window] : {std::pair{20, 0}, {64, 0}, {128, 0}, {64, 20}}) {
    Shape s;
    s.block_size = 16;
    s.context = 37;
    s.new_tokens = kAttentionDirectMaxTokens;
    s.q_heads = 12;
    s.kv_heads = 4;
    s.head_dim = head_dim;
    const Problem p = MakeProblem(s, 500 + head_dim);
    std::vector<float> out;
    AttentionParams a = Params(p, &out);
    a.window = window;
    std::vector<float> workspace(AttentionWorkspaceFloats(a));
    AttentionInvoke(a, workspace.data());
    for (int i = 0; i < s.new_tokens; ++i) {
      AttentionParams one = a;
      one.q = a.q + static_cast<size_t>(i) * a.q_stride;
      one.context_len = s.context + i;
      one.new_tokens = 1;
      const uint64_t sees_itself = 1;
      one.mask = &sees_itself;
      one.mask_words = 1;
      std::vector<float> single(a.out_stride);
      one.out = single.data();
      std::vector<float> ws(AttentionWorkspaceFloats(one));
      AttentionInvoke(one, ws.data());
      EXPECT_EQ(std::memcmp(single.data(), out.data() + static_cast<size_t>(i) * a.out_stride,
                            sizeof(float) * s.q_heads * head_dim),
                0)
          << "query " << i << ", head_dim " << head_dim << ", window " << window;
    }
  }
}

// The softmax's instruction-set versions give the same bits on both paths, with rows of every
// length around the vector widths, masked keys and a window.
TEST(AttentionTest, EveryVersionGivesTheSameBits) {
  uint32_t seed = 700;
  for (const int context : {0, 3, 17, 45, 300}) {
    for (const int new_tokens : {1, 3, kAttentionDirectMaxTokens + 1, 19}) {
      Shape s;
      s.block_size = 16;
      s.context = context;
      s.new_tokens = new_tokens;
      s.q_heads = 6;
      s.kv_heads = 2;
      s.head_dim = 64;
      s.window = context % 2 ? 0 : 33;
      s.pattern = new_tokens % 2 ? Pattern::kRandom : Pattern::kCausal;
      const Problem p = MakeProblem(s, seed++);
      std::vector<float> want;
      const AttentionParams a = Params(p, &want);
      std::vector<float> workspace(AttentionWorkspaceFloats(a));
      AttentionInvoke(a, workspace.data());
      for (const char* version : AttentionKernelVersions()) {
        std::vector<float> got;
        const AttentionParams b = Params(p, &got);
        AttentionInvokeWith(version, b, workspace.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * want.size()), 0)
            << version << ": " << Describe(s);
      }
    }
  }
}

// Blocks one after another in the pool are read in place (strided) by the GEMM path; the result
// equals, bit for bit, that of the same rows gathered from scattered blocks.
TEST(AttentionTest, ConsecutiveBlocksGiveTheScatteredBits) {
  uint32_t seed = 900;
  for (const int context : {0, 30, 300}) {
    for (const int new_tokens : {1, kAttentionDirectMaxTokens + 1, 16, 70}) {
      Shape s;
      s.block_size = 16;
      s.context = context;
      s.new_tokens = new_tokens;
      s.q_heads = 12;
      s.kv_heads = 4;
      s.head_dim = 64;
      s.window = context == 300 ? 100 : 0;
      const Problem scattered = MakeProblem(s, seed);
      s.consecutive = true;
      Problem consecutive = MakeProblem(s, seed++);
      // The scattered problem's rows and queries, moved to the consecutive blocks.
      for (int slot = 0; slot < context + new_tokens; ++slot) {
        for (int g = 0; g < s.kv_heads; ++g) {
          for (int d = 0; d < s.head_dim; ++d) {
            consecutive.k_cache[consecutive.CacheIndex(slot, g) + d] =
                scattered.k_cache[scattered.CacheIndex(slot, g) + d];
            consecutive.v_cache[consecutive.CacheIndex(slot, g) + d] =
                scattered.v_cache[scattered.CacheIndex(slot, g) + d];
          }
        }
      }
      consecutive.q = scattered.q;
      consecutive.mask = scattered.mask;
      std::vector<float> want, got;
      const AttentionParams a = Params(scattered, &want), b = Params(consecutive, &got);
      std::vector<float> workspace(AttentionWorkspaceFloats(a));
      AttentionInvoke(a, workspace.data());
      AttentionInvoke(b, workspace.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * want.size()), 0)
          << Describe(s);
    }
  }
}

// Decode over a long paged context: many blocks, many keys per kv head.
TEST(AttentionTest, DecodeLongContext) {
  for (int window : {0, 512}) {
    Shape s;
    s.block_size = 16;
    s.context = 2000;
    s.new_tokens = 1;
    s.q_heads = 12;
    s.kv_heads = 4;
    s.head_dim = 64;
    s.window = window;
    RunAndCompare(MakeProblem(s, 7 + window));
  }
}

// Prefill-sized causal extend with a model's head layout (Qwen3-style GQA), several tiles.
TEST(AttentionTest, PrefillModelShape) {
  Shape s;
  s.block_size = 16;
  s.context = 0;
  s.new_tokens = 256;
  s.q_heads = 12;
  s.kv_heads = 4;
  s.head_dim = 64;
  RunAndCompare(MakeProblem(s, 11));
  s.context = 100;
  s.new_tokens = 150;
  s.window = 64;
  RunAndCompare(MakeProblem(s, 12));
}

// Peaked softmax: scores spread over tens of units still match closely.
TEST(AttentionTest, SharpScores) {
  for (int new_tokens : {1, 33}) {
    Shape s;
    s.block_size = 4;
    s.context = 50;
    s.new_tokens = new_tokens;
    s.q_heads = 4;
    s.kv_heads = 1;
    s.head_dim = 32;
    s.value_range = 2.0f;
    s.scale = 0.5f;
    RunAndCompare(MakeProblem(s, 21 + new_tokens));
  }
}

// Scores far beyond float's exp range (hundreds) must not overflow: the softmax subtracts the
// row maximum. Keys are multiples of one direction, so the scores are exact and the answer is
// the mean of the V rows with the largest multiple.
TEST(AttentionTest, HugeScoresStayFinite) {
  for (int new_tokens : {1, 9}) {
    Shape s;
    s.block_size = 4;
    s.context = 12;
    s.new_tokens = new_tokens;
    s.q_heads = 2;
    s.kv_heads = 1;
    s.head_dim = 8;
    s.pattern = Pattern::kFull;
    s.scale = 1.0f;
    Problem p = MakeProblem(s, 31);
    const int total = s.context + s.new_tokens;
    for (int slot = 0; slot < total; ++slot) {
      float* k = &p.k_cache[p.CacheIndex(slot, 0)];
      std::fill(k, k + s.head_dim, 0.0f);
      k[0] = static_cast<float>(slot % 3);
    }
    for (int i = 0; i < s.new_tokens; ++i) {
      for (int c = 0; c < s.q_heads * s.head_dim; ++c) {
        p.q[static_cast<size_t>(i) * p.QStride() + c] = c % s.head_dim == 0 ? 400.0f : 0.0f;
      }
    }
    RunAndCompare(p);
    std::vector<float> out;
    const AttentionParams a = Params(p, &out);
    std::vector<float> ws(AttentionWorkspaceFloats(a));
    AttentionInvoke(a, ws.data());
    for (float x : out) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(AttentionTest, CheckRejectsInconsistentParams) {
  Shape s;
  s.new_tokens = 3;
  Problem p = MakeProblem(s, 41);
  std::vector<float> out;
  AttentionParams a = Params(p, &out);
  EXPECT_STREQ(AttentionCheck(a), "");
  AttentionParams bad = a;
  bad.kv_heads = 3;
  EXPECT_STRNE(AttentionCheck(bad), "");
  bad = a;
  bad.mask_words = 0;
  EXPECT_STRNE(AttentionCheck(bad), "");
  bad = a;
  bad.out_stride = 1;
  EXPECT_STRNE(AttentionCheck(bad), "");
  bad = a;
  bad.block_size = 0;
  EXPECT_STRNE(AttentionCheck(bad), "");
  bad = a;
  bad.window = -1;
  EXPECT_STRNE(AttentionCheck(bad), "");
}

}  // namespace
}  // namespace tandem::kernels::cpu
