// Linear / LinearAccumulate against a double-precision reference, in one slab of the few-rows
// kernel (rows_gemm.h, up to kRowsMaxM rows) and in several, with outputs that start as NaN so a
// product that reads them is caught; and the products' batch invariance.
#include "kernels/cpu/gemm.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/rows_gemm.h"

namespace tandem::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// y[r, c] = x[r, :] · w[c, :] (+ bias[c]) in double.
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              const float* bias, int m, int n, int k) {
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double acc = bias != nullptr ? bias[c] : 0.0;
      for (int i = 0; i < k; ++i) acc += static_cast<double>(x[r * k + i]) * w[c * k + i];
      y[r * n + c] = acc;
    }
  }
  return y;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, int k) {
  // fp32 dot products of k unit normals: error grows like sqrt(k) * eps * |terms|.
  const double tol = 1e-5 * std::sqrt(static_cast<double>(k)) * 4.0;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i]))) && reported++ < 5) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
}

// (m, n, k, flag): the flag adds a bias to Linear and makes LinearAccumulate's alpha negative.
class LinearTest : public ::testing::TestWithParam<std::tuple<int, int, int, bool>> {};

TEST_P(LinearTest, MatchesDoublePrecisionReference) {
  const auto [m, n, k, with_bias] = GetParam();
  std::mt19937 rng(m * 1000 + n + k);
  const std::vector<float> x = Random(static_cast<size_t>(m) * k, rng);
  const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
  const std::vector<float> bias = Random(n, rng);
  std::vector<float> y(static_cast<size_t>(m) * n, std::numeric_limits<float>::quiet_NaN());
  Linear(x.data(), w.data(), with_bias ? bias.data() : nullptr, y.data(), m, n, k);
  ExpectClose(y, Reference(x, w, with_bias ? bias.data() : nullptr, m, n, k), k);
}

TEST_P(LinearTest, AccumulateAddsScaledProduct) {
  const auto [m, n, k, negative_alpha] = GetParam();
  const float alpha = negative_alpha ? -1.25f : 0.5f;
  std::mt19937 rng(m + n * 7 + k * 13);
  const std::vector<float> x = Random(static_cast<size_t>(m) * k, rng);
  const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
  std::vector<float> y = Random(static_cast<size_t>(m) * n, rng);
  std::vector<double> want = Reference(x, w, nullptr, m, n, k);
  for (size_t i = 0; i < want.size(); ++i) want[i] = y[i] + alpha * want[i];
  LinearAccumulate(x.data(), w.data(), y.data(), m, n, k, alpha);
  ExpectClose(y, want, k);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Combine(::testing::Values(1, 3, 4, 5, 17, 64, 130),
                                            ::testing::Values(1, 7, 300),
                                            ::testing::Values(1, 5, 768, 4100), ::testing::Bool()));

// Row j of an m-row product is the one-row product of x's row j bit for bit, for every m the
// few-rows kernel takes and sizes that leave partial tiles and vector tails, and a k long enough
// to pass in several chunks: a verify step's products equal the decode steps' (rows_gemm.h).
TEST(RowsGemmTest, EveryRowEqualsItsOneRowProductExactly) {
  std::mt19937 rng(7);
  for (const int k : {5, 16, 67, 768, 4100}) {
    for (const int n : {1, 6, 33, 301}) {
      constexpr int kRows = 2 * kRowsMaxM + 2;  // three slabs
      const std::vector<float> x = Random(static_cast<size_t>(kRows) * k, rng);
      const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
      std::vector<float> single(static_cast<size_t>(kRows) * n);
      for (int j = 0; j < kRows; ++j) {
        Linear(x.data() + static_cast<size_t>(j) * k, w.data(), nullptr,
               single.data() + static_cast<size_t>(j) * n, 1, n, k);
      }
      for (const int m : {2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, kRowsMaxM, kRowsMaxM + 1, kRows}) {
        std::vector<float> many(static_cast<size_t>(m) * n);
        Linear(x.data(), w.data(), nullptr, many.data(), m, n, k);
        EXPECT_EQ(std::memcmp(many.data(), single.data(), many.size() * sizeof(float)), 0)
            << "m " << m << " n " << n << " k " << k << " (" << RowsKernelName() << ")";
      }
    }
  }
}

// The serial products (attention's scores over a block of keys) take other tiles than the
// parallel ones where they can (AVX-512: 16 weight rows at once); the sums must stay the same.
TEST(RowsGemmTest, SerialProductsEqualTheParallelOnesExactly) {
  std::mt19937 rng(13);
  for (const int k : {16, 64, 80, 128, 67}) {
    for (const int n : {1, 15, 16, 17, 32, 45}) {
      for (const int m : {1, 2, 3, 4, 8}) {
        const int ldw = k + 3, ldy = n + 2;  // strided, like keys in a KV cache block
        const std::vector<float> x = Random(static_cast<size_t>(m) * k, rng);
        const std::vector<float> w = Random(static_cast<size_t>(n) * ldw, rng);
        std::vector<float> serial(static_cast<size_t>(m) * ldy, 7.0f), parallel = serial;
        const RowsProduct product = {.x = x.data(),
                                     .w = w.data(),
                                     .m = m,
                                     .n = n,
                                     .k = k,
                                     .ldy = ldy,
                                     .alpha = 0.125f,
                                     .ldw = ldw};
        RowsProduct s = product, q = product;
        s.y = serial.data();
        q.y = parallel.data();
        InvokeRowsSerial(s);
        InvokeRows(q);
        EXPECT_EQ(std::memcmp(serial.data(), parallel.data(), serial.size() * sizeof(float)), 0)
            << "m " << m << " n " << n << " k " << k << " (" << RowsKernelName() << ")";
      }
    }
  }
}

// A head's weighted rows do not depend on the other heads of the call (AVX-512 holds every head
// of 64 or 128 in registers at once), rows with every weight 0 included.
TEST(RowsGemmTest, WeightedRowsOfEachHeadEqualItsOwnCallExactly) {
  std::mt19937 rng(17);
  for (const int d : {16, 64, 80, 128}) {
    for (const int heads : {1, 2, 3, 4, 5}) {
      const int rows = 37, ldwt = rows + 1;
      const size_t ldv = static_cast<size_t>(d) + 16;
      std::vector<float> weights = Random(static_cast<size_t>(heads) * ldwt, rng);
      for (int h = 0; h < heads; ++h) {
        for (int r = 0; r < rows; r += 3 + h) weights[h * ldwt + r] = 0.0f;  // some rows of each
        for (int r = 5; r < rows; r += 7) weights[h * ldwt + r] = 0.0f;      // and rows of all
      }
      const std::vector<float> v = Random(rows * ldv, rng);
      const std::vector<float> start = Random(static_cast<size_t>(heads) * d, rng);
      std::vector<float> together = start, alone = start;
      InvokeWeightedRowsSerial({.weights = weights.data(),
                                .ldwt = ldwt,
                                .v = v.data(),
                                .ldv = ldv,
                                .rows = rows,
                                .heads = heads,
                                .d = d,
                                .out = together.data()});
      for (int h = 0; h < heads; ++h) {
        InvokeWeightedRowsSerial({.weights = weights.data() + h * ldwt,
                                  .ldwt = ldwt,
                                  .v = v.data(),
                                  .ldv = ldv,
                                  .rows = rows,
                                  .heads = 1,
                                  .d = d,
                                  .out = alone.data() + h * d});
      }
      EXPECT_EQ(std::memcmp(together.data(), alone.data(), alone.size() * sizeof(float)), 0)
          << "heads " << heads << " d " << d << " (" << RowsKernelName() << ")";
      std::vector<double> want(start.begin(), start.end());
      for (int h = 0; h < heads; ++h) {
        for (int c = 0; c < d; ++c) {
          for (int r = 0; r < rows; ++r) {
            want[h * d + c] += static_cast<double>(weights[h * ldwt + r]) * v[r * ldv + c];
          }
        }
      }
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(together[i], want[i], 1e-4) << i;
    }
  }
}

TEST(RowsGemmTest, StridedOutputsLeaveTheRestAlone) {
  std::mt19937 rng(11);
  const int m = 3, n = 5, k = 40, ldy = 9;
  const std::vector<float> x = Random(static_cast<size_t>(m) * k, rng);
  const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
  std::vector<float> y(static_cast<size_t>(m) * ldy, 42.0f);
  InvokeRows({.x = x.data(), .w = w.data(), .y = y.data(), .m = m, .n = n, .k = k, .ldy = ldy});
  const std::vector<double> want = Reference(x, w, nullptr, m, n, k);
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < ldy; ++c) {
      const float got = y[static_cast<size_t>(r) * ldy + c];
      if (c < n) {
        EXPECT_NEAR(got, want[static_cast<size_t>(r) * n + c], 1e-4) << r << ", " << c;
      } else {
        EXPECT_EQ(got, 42.0f) << "column " << c << " past n was written";
      }
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
