// Pearson chi-square goodness of fit for sampling tests: statistic, upper-tail p-value and
// critical value, so thresholds come from the distribution instead of being guessed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace tandem::testing {

// Regularised upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a): the power series of the
// lower function below x < a + 1, the continued fraction of the upper one (Lentz) above it.
inline double UpperRegularizedGamma(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefactor = -x + a * std::log(x) - std::lgamma(a);
  constexpr double kEpsilon = 1e-15;
  constexpr int kMaxTerms = 100000;
  if (x < a + 1.0) {
    double term = 1.0 / a;
    double sum = term;
    for (int n = 1; n < kMaxTerms && std::abs(term) > std::abs(sum) * kEpsilon; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefactor);
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a;
  double c = 1.0 / kTiny;
  double d = 1.0 / b;
  double fraction = d;
  for (int i = 1; i < kMaxTerms; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double delta = d * c;
    fraction *= delta;
    if (std::abs(delta - 1.0) < kEpsilon) break;
  }
  return std::exp(log_prefactor) * fraction;
}

// P(X >= statistic) for X ~ chi-square with `dof` degrees of freedom.
inline double ChiSquarePValue(double statistic, int dof) {
  return UpperRegularizedGamma(dof / 2.0, statistic / 2.0);
}

// The x with P(X >= x) = alpha, by bisection on the monotone tail.
inline double ChiSquareCriticalValue(int dof, double alpha) {
  double lo = 0.0;
  double hi = dof + 10.0;
  while (ChiSquarePValue(hi, dof) > alpha) hi *= 2.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ChiSquarePValue(mid, dof) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

struct ChiSquareResult {
  double statistic = 0.0;
  int dof = 0;
  // Draws that landed on a category of expected probability zero: must be zero.
  int64_t impossible = 0;
};

// `expected` are probabilities (summing to 1); categories with zero probability are left out of
// the statistic and counted in `impossible` when observed.
inline ChiSquareResult PearsonChiSquare(std::span<const int64_t> observed,
                                        std::span<const double> expected) {
  ChiSquareResult result;
  int64_t draws = 0;
  for (const int64_t count : observed) draws += count;
  int categories = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] <= 0.0) {
      result.impossible += observed[i];
      continue;
    }
    const double mean = expected[i] * static_cast<double>(draws);
    const double diff = static_cast<double>(observed[i]) - mean;
    result.statistic += diff * diff / mean;
    ++categories;
  }
  result.dof = categories - 1;
  return result;
}

struct ChiSquareTest {
  ChiSquareResult result;
  double critical = 0.0;  // statistic limit at the test's alpha
  bool fits = false;      // no impossible outcome and statistic below the limit
};

// Goodness of fit of `observed` counts against probabilities `expected`: categories whose
// expected count is below `min_expected` are pooled into one (so the chi-square approximation
// holds), probabilities are renormalised over what remains, and the statistic is compared with
// the critical value at `alpha`.
inline ChiSquareTest PooledChiSquareTest(std::span<const int64_t> observed,
                                         std::span<const double> expected, double alpha,
                                         double min_expected = 5.0) {
  int64_t draws = 0;
  for (const int64_t count : observed) draws += count;
  std::vector<int64_t> counts;
  std::vector<double> probs;
  int64_t pooled_count = 0, impossible = 0;
  double pooled_prob = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] <= 0.0) {
      impossible += observed[i];
    } else if (expected[i] * static_cast<double>(draws) < min_expected) {
      pooled_count += observed[i];
      pooled_prob += expected[i];
    } else {
      counts.push_back(observed[i]);
      probs.push_back(expected[i]);
    }
  }
  if (pooled_prob > 0.0) {
    counts.push_back(pooled_count);
    probs.push_back(pooled_prob);
  }
  double total = 0.0;
  for (const double p : probs) total += p;
  for (double& p : probs) p /= total;
  ChiSquareTest test;
  test.result = PearsonChiSquare(counts, probs);
  test.result.impossible = impossible;
  test.critical = ChiSquareCriticalValue(std::max(test.result.dof, 1), alpha);
  test.fits = impossible == 0 && test.result.statistic < test.critical;
  return test;
}

}  // namespace tandem::testing
