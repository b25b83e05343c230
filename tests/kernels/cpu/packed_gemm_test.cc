// Products over packed weights (packed_gemm.h) against a double-precision reference, in one slab
// and several, with every tile shape of the version this process runs (1 to 13 rows), k past a
// chunk, weight rows that do not fill the last panel, sub-ranges of rows and outputs that start
// as NaN (a product that reads them is caught); their batch invariance; every version this CPU
// runs (the portable one always); and the packing itself.
#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/gemm.h"

namespace tandem::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// y[r, c] = x[r, :] · w[c, :] (+ bias[c]) in double, for weight rows [begin, end).
std::vector<double> Reference(const std::vector<float>& x, const std::vector<float>& w,
                              const float* bias, int m, int k, int begin, int end) {
  const int n = end - begin;
  std::vector<double> y(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double acc = bias != nullptr ? bias[begin + c] : 0.0;
      for (int i = 0; i < k; ++i) {
        acc += static_cast<double>(x[static_cast<size_t>(r) * k + i]) *
               w[static_cast<size_t>(begin + c) * k + i];
      }
      y[static_cast<size_t>(r) * n + c] = acc;
    }
  }
  return y;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, int k) {
  const double tol = 1e-5 * std::sqrt(static_cast<double>(k)) * 4.0;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i]))) && reported++ < 5) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
}

// PackedLinear through one version of the kernel.
void LinearWith(const char* version, const float* x, const PackedMatrix& w, const float* bias,
                float* y, int m) {
  const int n = w.rows();
  if (bias != nullptr) {
    for (int r = 0; r < m; ++r) std::copy_n(bias, n, y + static_cast<size_t>(r) * n);
  }
  InvokePackedWith(version,
                   {.x = x, .m = m, .w = &w, .y = y, .beta = bias != nullptr ? 1.0f : 0.0f});
}

TEST(PackedMatrixTest, PacksAndUnpacksEveryRow) {
  std::mt19937 rng(7);
  for (const auto& [rows, cols] : {std::pair{1, 1}, {16, 5}, {17, 3}, {40, 33}}) {
    const std::vector<float> w = Random(static_cast<size_t>(rows) * cols, rng);
    const PackedMatrix packed = PackedMatrix::Pack(w.data(), rows, cols);
    EXPECT_EQ(packed.rows(), rows);
    EXPECT_EQ(packed.cols(), cols);
    EXPECT_EQ(packed.RowMajor(), w) << rows << "x" << cols;
    // Whole panels: the last one padded.
    EXPECT_EQ(packed.bytes(),
              sizeof(float) * cols * kPanelRows * ((rows + kPanelRows - 1) / kPanelRows));
    std::vector<float> row(cols);
    packed.CopyRow(rows - 1, row.data());
    EXPECT_EQ(row, std::vector<float>(w.end() - cols, w.end()));
  }
  EXPECT_TRUE(PackedMatrix::Pack(nullptr, 0, 4).empty());
}

// (m, n, k, flag): the flag adds a bias.
class PackedLinearTest : public ::testing::TestWithParam<std::tuple<int, int, int, bool>> {};

TEST_P(PackedLinearTest, MatchesDoublePrecisionReference) {
  const auto [m, n, k, with_bias] = GetParam();
  std::mt19937 rng(m * 1000 + n + k);
  const std::vector<float> x = Random(static_cast<size_t>(m) * k, rng);
  const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
  const std::vector<float> bias = Random(n, rng);
  const PackedMatrix packed = PackedMatrix::Pack(w.data(), n, k);
  const std::vector<double> want = Reference(x, w, with_bias ? bias.data() : nullptr, m, k, 0, n);
  std::vector<float> y(static_cast<size_t>(m) * n, std::numeric_limits<float>::quiet_NaN());
  PackedLinear(x.data(), packed, with_bias ? bias.data() : nullptr, y.data(), m);
  ExpectClose(y, want, k);
  for (const char* version : PackedKernelVersions()) {
    SCOPED_TRACE(version);
    std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
    LinearWith(version, x.data(), packed, with_bias ? bias.data() : nullptr, y.data(), m);
    ExpectClose(y, want, k);
  }
  // bf16 weights: the products of the rounded values, in fp32.
  const PackedMatrix half = PackedMatrix::Pack(w.data(), n, k, WeightType::kBf16);
  const std::vector<float> rounded = half.RowMajor();
  const std::vector<double> want_half =
      Reference(x, rounded, with_bias ? bias.data() : nullptr, m, k, 0, n);
  for (const char* version : PackedKernelVersions()) {
    SCOPED_TRACE(std::string("bf16 ") + version);
    std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
    LinearWith(version, x.data(), half, with_bias ? bias.data() : nullptr, y.data(), m);
    ExpectClose(y, want_half, k);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PackedLinearTest,
    ::testing::Values(std::tuple{1, 1, 1, false}, std::tuple{1, 64, 32, true},
                      std::tuple{1, 100, 300, false}, std::tuple{2, 48, 17, true},
                      std::tuple{3, 80, 64, false}, std::tuple{4, 33, 260, true},
                      std::tuple{5, 16, 9, false}, std::tuple{6, 70, 128, false},
                      std::tuple{7, 130, 513, true}, std::tuple{12, 64, 40, false},
                      std::tuple{13, 96, 300, true}, std::tuple{16, 200, 77, false},
                      std::tuple{64, 50, 70, true}, std::tuple{65, 40, 33, false},
                      std::tuple{150, 24, 20, true}));

// A sub-range of weight rows (not panel aligned), into a wider output, scaled and accumulated,
// from input rows further apart than their length; with few input rows, and with more than one
// packed group of them (the last one short).
TEST(PackedProductTest, RowRangeScalesAndAccumulates) {
  const int n = 70, k = 45, ldx = 52, begin = 5, end = 53, ldy = 60;
  for (const int m : {3, 9, 20}) {
    for (const char* version : PackedKernelVersions()) {
      SCOPED_TRACE(std::string(version) + ", m " + std::to_string(m));
      std::mt19937 rng(3 + m);
      const std::vector<float> x = Random(static_cast<size_t>(m) * ldx, rng);
      const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
      const PackedMatrix packed = PackedMatrix::Pack(w.data(), n, k);
      std::vector<float> y = Random(static_cast<size_t>(m) * ldy, rng);
      const std::vector<float> before = y;
      InvokePackedWith(version, {.x = x.data(),
                                 .ldx = ldx,
                                 .m = m,
                                 .w = &packed,
                                 .row_begin = begin,
                                 .row_end = end,
                                 .y = y.data(),
                                 .ldy = ldy,
                                 .alpha = -0.5f,
                                 .beta = 2.0f});
      std::vector<float> dense(static_cast<size_t>(m) * k);
      for (int r = 0; r < m; ++r) {
        std::copy_n(x.begin() + static_cast<size_t>(r) * ldx, k,
                    dense.begin() + static_cast<size_t>(r) * k);
      }
      const std::vector<double> product = Reference(dense, w, nullptr, m, k, begin, end);
      const int width = end - begin;
      for (int r = 0; r < m; ++r) {
        for (int c = 0; c < ldy; ++c) {
          const size_t i = static_cast<size_t>(r) * ldy + c;
          if (c >= width) {
            EXPECT_EQ(y[i], before[i]) << "a column past the range was written";
            continue;
          }
          const double want = 2.0 * before[i] - 0.5 * product[static_cast<size_t>(r) * width + c];
          EXPECT_NEAR(y[i], want, 1e-4 * std::max(1.0, std::abs(want))) << r << "," << c;
        }
      }
    }
  }
}

// Row j of a many-row product is the one-row product of input row j, bit for bit, whatever tile
// or slab the row falls in, and whatever the thread count.
TEST(PackedProductTest, RowsEqualTheirOneRowProducts) {
  const int n = 150, k = 300, m = 80;
  std::mt19937 rng(11);
  const std::vector<float> x = Random(static_cast<size_t>(m) * k, rng);
  const std::vector<float> w = Random(static_cast<size_t>(n) * k, rng);
  const int threads = CpuThreads();
  for (const WeightType type : {WeightType::kF32, WeightType::kBf16}) {
    const PackedMatrix packed = PackedMatrix::Pack(w.data(), n, k, type);
    for (const char* version : PackedKernelVersions()) {
      for (int rows : {2, 3, 4, 6, 7, 12, 13, 16, 64, 80}) {
        SetBlasThreads(rows % 2 == 0 ? 1 : 2);
        std::vector<float> many(static_cast<size_t>(rows) * n);
        LinearWith(version, x.data(), packed, nullptr, many.data(), rows);
        for (int j = 0; j < rows; ++j) {
          std::vector<float> one(n);
          LinearWith(version, x.data() + static_cast<size_t>(j) * k, packed, nullptr, one.data(),
                     1);
          for (int c = 0; c < n; ++c) {
            ASSERT_EQ(many[static_cast<size_t>(j) * n + c], one[c])
                << WeightTypeName(type) << " " << version << ": rows " << rows << ", row " << j
                << ", output " << c;
          }
        }
      }
    }
  }
  SetBlasThreads(threads);
}

// bf16 packing rounds to nearest even, keeps the sign, infinities and NaN, and halves the bytes.
TEST(PackedMatrixTest, Bf16RoundsToNearestEven) {
  const float inf = std::numeric_limits<float>::infinity();
  // 1 + 2^-8 is halfway between two bf16 values (1 and 1 + 2^-7): to even, 1. 1 + 3 * 2^-8 is
  // halfway between 1 + 2^-7 and 1 + 2^-6: to even, 1 + 2^-6. 1 + 2^-8 + 2^-20 rounds up.
  const std::vector<float> values = {
      1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, inf, -inf, 0.0f,
      3.0e38f};
  // 3e38 = 1.7632 x 2^127: the nearest bf16 is 1.765625 x 2^127.
  const std::vector<float> want = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.5f,
                                   inf,  -inf,           0.0f,           0x1.c4p+127f};
  const int n = static_cast<int>(values.size());
  const PackedMatrix half = PackedMatrix::Pack(values.data(), n, 1, WeightType::kBf16);
  EXPECT_EQ(half.type(), WeightType::kBf16);
  const std::vector<float> got = half.RowMajor();
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i], want[i]) << i;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(PackedMatrix::Pack(&nan, 1, 1, WeightType::kBf16).RowMajor()[0]));
  const PackedMatrix full = PackedMatrix::Pack(values.data(), n, 1);
  EXPECT_EQ(2 * half.bytes(), full.bytes());
  EXPECT_EQ(WeightTypeName(*ParseWeightType("bf16")), "bf16");
  EXPECT_EQ(WeightTypeName(*ParseWeightType("f32")), "f32");
  EXPECT_FALSE(ParseWeightType("fp8").ok());
}

TEST(PackedProductTest, NamesItsVersion) {
  const std::string name = PackedKernelName();
  EXPECT_TRUE(name == "avx512" || name == "avx2" || name == "portable") << name;
  const std::vector<const char*> versions = PackedKernelVersions();
  EXPECT_EQ(name, versions.front()) << "the process runs the widest version the CPU has";
  EXPECT_EQ(std::string(versions.back()), "portable");
}

}  // namespace
}  // namespace tandem::kernels::cpu
