// Goodness-of-fit assertion for the decoding modes' sampling tests.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/sampling/chi_square.h"

namespace tandem::testing {

// Chi-square of `counts` (token -> draws, `n` draws in all) against `probs` (indexed by token),
// sparse categories pooled; fails when the fit is rejected at the 0.1% level or an impossible
// token was drawn.
inline ::testing::AssertionResult FitsDistribution(const std::map<int32_t, int>& counts,
                                                   const std::vector<double>& probs, int n) {
  std::vector<int64_t> observed(probs.size(), 0);
  int64_t seen = 0;
  for (const auto& [token, count] : counts) {
    if (token < 0 || token >= static_cast<int32_t>(probs.size())) {
      return ::testing::AssertionFailure() << "token " << token << " outside the distribution";
    }
    observed[token] = count;
    seen += count;
  }
  if (seen != n) return ::testing::AssertionFailure() << seen << " draws counted, expected " << n;
  const ChiSquareTest t = PooledChiSquareTest(observed, probs, 1e-3);
  if (t.fits) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "chi-square " << t.result.statistic << " over " << t.result.dof
         << " degrees of freedom, limit " << t.critical << ", impossible draws "
         << t.result.impossible;
}

}  // namespace tandem::testing
