// Linear / LinearAccumulate against a double-precision reference, for the GEMV (one row) and
// GEMM paths, with outputs that start as NaN so a product that reads them is caught.
#include "kernels/cpu/gemm.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

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
                         ::testing::Combine(::testing::Values(1, 3, 17),
                                            ::testing::Values(1, 7, 300),
                                            ::testing::Values(1, 5, 768), ::testing::Bool()));

}  // namespace
}  // namespace tandem::kernels::cpu
