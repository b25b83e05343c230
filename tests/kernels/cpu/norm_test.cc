// RMSNorm against a double-precision reference, in place and not, the fused residual add, and
// every instruction set's version against the process's own.
#include "kernels/cpu/norm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(RmsNormTest, MatchesTheReferenceInPlaceOrNot) {
  std::mt19937 rng(3);
  constexpr float kEps = 1e-6f;
  for (const int dim : {1, 3, 8, 13, 64, 768, 4097}) {
    const int rows = 5;
    const std::vector<float> x = Random(static_cast<size_t>(rows) * dim, rng);
    const std::vector<float> weight = Random(dim, rng);
    std::vector<float> y(x.size(), NAN);
    RmsNorm(x.data(), weight.data(), y.data(), rows, dim, kEps);
    std::vector<float> in_place = x;
    RmsNorm(in_place.data(), weight.data(), in_place.data(), rows, dim, kEps);
    EXPECT_EQ(std::memcmp(in_place.data(), y.data(), y.size() * sizeof(float)), 0) << dim;
    for (int r = 0; r < rows; ++r) {
      const float* row = x.data() + static_cast<size_t>(r) * dim;
      double sum_sq = 0.0;
      for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(row[i]) * row[i];
      const double inv = 1.0 / std::sqrt(sum_sq / dim + kEps);
      for (int i = 0; i < dim; ++i) {
        const double want = weight[i] * (row[i] * inv);
        EXPECT_NEAR(y[static_cast<size_t>(r) * dim + i], want, 1e-6 * (1.0 + std::abs(want)))
            << "dim " << dim << " row " << r << " value " << i;
      }
    }
  }
}

TEST(RmsNormTest, AddRmsNormAddsTheResidualThenNormalises) {
  std::mt19937 rng(4);
  for (const int dim : {5, 64, 770}) {
    const int rows = 3;
    const std::vector<float> residual = Random(static_cast<size_t>(rows) * dim, rng);
    const std::vector<float> delta = Random(residual.size(), rng);
    const std::vector<float> weight = Random(dim, rng);
    std::vector<float> fused_residual = residual, fused(residual.size(), NAN);
    AddRmsNorm(fused_residual.data(), delta.data(), weight.data(), fused.data(), rows, dim, 1e-5f);
    std::vector<float> sum(residual.size()), normed(residual.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = residual[i] + delta[i];
    RmsNorm(sum.data(), weight.data(), normed.data(), rows, dim, 1e-5f);
    EXPECT_EQ(std::memcmp(fused_residual.data(), sum.data(), sum.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(fused.data(), normed.data(), normed.size() * sizeof(float)), 0);
  }
}

// Every instruction set's version gives the process's own bits, with row lengths around the
// vector widths and the eight running sums.
TEST(RmsNormTest, EveryVersionGivesTheSameBits) {
  std::mt19937 rng(6);
  for (const int dim : {1, 7, 8, 9, 15, 16, 17, 64, 100, 768}) {
    const int rows = 3;
    const std::vector<float> x = Random(static_cast<size_t>(rows) * dim, rng);
    const std::vector<float> delta = Random(x.size(), rng);
    const std::vector<float> weight = Random(dim, rng);
    std::vector<float> want(x.size(), NAN), want_res = x;
    RmsNorm(x.data(), weight.data(), want.data(), rows, dim, 1e-6f);
    std::vector<float> want_fused(x.size(), NAN);
    AddRmsNorm(want_res.data(), delta.data(), weight.data(), want_fused.data(), rows, dim, 1e-6f);
    for (const char* version : NormKernelVersions()) {
      std::vector<float> got(x.size(), NAN), got_res = x, got_fused(x.size(), NAN);
      RmsNormWith(version, x.data(), weight.data(), got.data(), rows, dim, 1e-6f);
      AddRmsNormWith(version, got_res.data(), delta.data(), weight.data(), got_fused.data(), rows,
                     dim, 1e-6f);
      const size_t bytes = x.size() * sizeof(float);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << version << " dim " << dim;
      EXPECT_EQ(std::memcmp(got_res.data(), want_res.data(), bytes), 0)
          << version << " dim " << dim;
      EXPECT_EQ(std::memcmp(got_fused.data(), want_fused.data(), bytes), 0)
          << version << " dim " << dim;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
