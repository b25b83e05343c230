#include "worker/sampling/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "tests/worker/sampling/chi_square.h"

namespace tandem {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A straightforward statement of the warper semantics (transformers' generation order:
// temperature, top-k, top-p, min-p), in double with full sorts, for finite logits.
std::vector<double> ReferenceDistribution(const std::vector<float>& logits,
                                          const SamplingParams& params) {
  const size_t n = logits.size();
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) z[i] = logits[i] / static_cast<double>(params.temperature);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return z[a] > z[b]; });
  std::vector<bool> keep(n, true);
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    const double kth = z[order[params.top_k - 1]];
    for (size_t i = 0; i < n; ++i) keep[i] = z[i] >= kth;
  }
  const auto normalised = [&] {
    std::vector<double> p(n, 0.0);
    double total = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (keep[i]) total += p[i] = std::exp(z[i] - z[order[0]]);
    }
    for (double& v : p) v /= total;
    return p;
  };
  if (params.top_p < 1.0f) {
    const std::vector<double> p = normalised();
    double before = 0.0;
    for (size_t rank = 0; rank < n; ++rank) {
      const size_t i = order[rank];
      if (!keep[i]) continue;
      if (rank > 0 && before >= params.top_p) keep[i] = false;
      before += p[i];
    }
  }
  if (params.min_p > 0.0f) {
    const std::vector<double> p = normalised();
    const double top = p[order[0]];
    for (size_t i = 0; i < n; ++i) keep[i] = keep[i] && p[i] >= params.min_p * top;
  }
  return normalised();
}

void ExpectDistributionNear(const std::vector<float>& actual, const std::vector<double>& expected,
                            double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tolerance) << "token " << i;
    EXPECT_EQ(actual[i] == 0.0f, expected[i] == 0.0) << "token " << i;
  }
}

std::vector<float> Distribution(const std::vector<float>& logits, const SamplingParams& params) {
  std::vector<float> probs;
  SamplingDistribution(logits, params, &probs);
  return probs;
}

SamplingParams Params(float temperature, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f,
                      uint64_t seed = 0) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  params.min_p = min_p;
  params.seed = seed;
  return params;
}

// ---- Argmax ----------------------------------------------------------------------------------

TEST(ArgmaxTest, LowestIndexAmongTies) {
  EXPECT_EQ(Argmax(std::vector<float>{1, 3, 2, 3}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{5, 5, 5}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{-2, -1, kInf, kInf}), 2);
}

TEST(ArgmaxTest, NaNCountsAsNegativeInfinity) {
  EXPECT_EQ(Argmax(std::vector<float>{kNaN, 1, kNaN, 2}), 3);
  EXPECT_EQ(Argmax(std::vector<float>{kNaN, -kInf, -5}), 2);
  EXPECT_EQ(Argmax(std::vector<float>{kNaN, kNaN}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{-kInf, kNaN}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{}), -1);
}

TEST(ArgmaxTest, EqualsTheFirstStrictlyGreaterScan) {
  // Lengths around the vector passes' steps, few distinct values (ties), NaN and infinities.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> pick(0, 9);
  const float values[] = {kNaN, -kInf, kInf, -0.0f, 0.0f, 1.0f, -3.0f, 2.0f, 2.0f, 7.5f};
  for (const int n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> logits(n);
      for (float& x : logits) x = values[pick(rng)];
      int32_t want = 0;
      float best = -kInf;
      for (int i = 0; i < n; ++i) {
        if (logits[i] > best) {
          best = logits[i];
          want = i;
        }
      }
      ASSERT_EQ(Argmax(logits), want) << "n " << n << ", trial " << trial;
    }
  }
}

// ---- SamplingDistribution ---------------------------------------------------------------------

const std::vector<float> kSmallLogits = {1.0f, 2.5f, -0.5f, 2.0f, 0.3f, 1.7f, -3.0f, 0.9f};

TEST(SamplingDistributionTest, MatchesReferenceForParameterGrid) {
  for (float temperature : {0.3f, 1.0f, 2.5f}) {
    for (int top_k : {0, 1, 3, 8, 20}) {
      for (float top_p : {1.0f, 0.9f, 0.5f, 0.05f}) {
        for (float min_p : {0.0f, 0.1f, 0.6f}) {
          const SamplingParams params = Params(temperature, top_k, top_p, min_p);
          SCOPED_TRACE(::testing::Message() << "T=" << temperature << " k=" << top_k
                                            << " p=" << top_p << " min_p=" << min_p);
          ExpectDistributionNear(Distribution(kSmallLogits, params),
                                 ReferenceDistribution(kSmallLogits, params), 1e-6);
        }
      }
    }
  }
}

TEST(SamplingDistributionTest, GreedyIsPointMassAtArgmax) {
  const std::vector<float> probs = Distribution({1, 4, 4, 2}, Params(0.0f, 2, 0.5f));
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0}));
}

TEST(SamplingDistributionTest, TopKKeepsEveryTieOfTheKthValue) {
  // transformers keeps every token whose score equals the k-th largest.
  const std::vector<float> probs = Distribution({1, 3, 3, 2}, Params(1.0f, 1));
  EXPECT_EQ(probs, (std::vector<float>{0, 0.5f, 0.5f, 0}));
  const std::vector<float> three = Distribution({0, 1, 1, 1, -1}, Params(1.0f, 2));
  EXPECT_FLOAT_EQ(three[1], 1.0f / 3);
  EXPECT_FLOAT_EQ(three[3], 1.0f / 3);
  EXPECT_EQ(three[0], 0.0f);
  EXPECT_EQ(three[4], 0.0f);
}

TEST(SamplingDistributionTest, TinyTopPKeepsOnlyTheTopToken) {
  for (float top_p : {0.0f, 1e-9f, 0.01f}) {
    EXPECT_EQ(Distribution(kSmallLogits, Params(1.0f, 0, top_p)),
              (std::vector<float>{0, 1, 0, 0, 0, 0, 0, 0}));
    // With tied maxima the lowest index is kept.
    EXPECT_EQ(Distribution({0, 2, 2, 1}, Params(1.0f, 0, top_p)), (std::vector<float>{0, 1, 0, 0}));
  }
}

TEST(SamplingDistributionTest, TopPKeepsSmallestPrefixReachingTheMass) {
  // Probabilities 0.5, 0.25, 0.125, 0.125.
  const std::vector<float> logits = {std::log(0.125f), std::log(0.5f), std::log(0.25f),
                                     std::log(0.125f)};
  // The top token alone has 0.5 < 0.6, so the second joins; 0.75 >= 0.6 stops there.
  std::vector<float> probs = Distribution(logits, Params(1.0f, 0, 0.6f));
  EXPECT_NEAR(probs[1], 2.0 / 3, 1e-6);
  EXPECT_NEAR(probs[2], 1.0 / 3, 1e-6);
  EXPECT_EQ(probs[0], 0.0f);
  EXPECT_EQ(probs[3], 0.0f);
  // 0.8 needs a third token: of the two 0.125 ties the lower index comes first.
  probs = Distribution(logits, Params(1.0f, 0, 0.8f));
  EXPECT_NEAR(probs[0], 0.125 / 0.875, 1e-6);
  EXPECT_EQ(probs[3], 0.0f);
}

TEST(SamplingDistributionTest, TopPIsRelativeToTheTopKDistribution) {
  // Probabilities 0.4, 0.3, 0.15, 0.15: top_p 0.55 needs two tokens of the full distribution,
  // but after top-2 the top token has 4/7 >= 0.55 on its own.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.15f)};
  std::vector<float> probs = Distribution(logits, Params(1.0f, 0, 0.55f));
  EXPECT_NEAR(probs[0], 4.0 / 7, 1e-6);
  EXPECT_NEAR(probs[1], 3.0 / 7, 1e-6);
  probs = Distribution(logits, Params(1.0f, 2, 0.55f));
  EXPECT_EQ(probs, (std::vector<float>{1, 0, 0, 0}));
}

TEST(SamplingDistributionTest, MinPIsRelativeToTheMaxAfterTemperature) {
  // At T = 1, p = (0.5, 0.25, 0.125, 0.125); min_p 0.3 keeps p >= 0.15.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.125f),
                                     std::log(0.125f)};
  std::vector<float> probs = Distribution(logits, Params(1.0f, 0, 1.0f, 0.3f));
  EXPECT_NEAR(probs[0], 2.0 / 3, 1e-6);
  EXPECT_NEAR(probs[1], 1.0 / 3, 1e-6);
  EXPECT_EQ(probs[2], 0.0f);
  // At T = 2 the ratios to the max are 1, 1/sqrt(2), 1/sqrt(8): 0.3 now keeps all four.
  probs = Distribution(logits, Params(2.0f, 0, 1.0f, 0.3f));
  EXPECT_GT(probs[3], 0.0f);
  // min_p 1 keeps only the maximum.
  probs = Distribution(logits, Params(1.0f, 0, 1.0f, 1.0f));
  EXPECT_EQ(probs, (std::vector<float>{1, 0, 0, 0}));
}

TEST(SamplingDistributionTest, AllNegativeInfinityButOne) {
  const std::vector<float> logits = {-kInf, -kInf, 3.0f, -kInf, kNaN};
  for (const SamplingParams& params :
       {Params(1.0f), Params(0.01f, 3), Params(5.0f, 0, 0.5f), Params(1.0f, 0, 1.0f, 0.5f)}) {
    EXPECT_EQ(Distribution(logits, params), (std::vector<float>{0, 0, 1, 0, 0}));
    for (uint64_t position = 0; position < 50; ++position) {
      EXPECT_EQ(SampleToken(logits, params, position), 2);
    }
  }
}

TEST(SamplingDistributionTest, NoFiniteLogitFallsBackToArgmax) {
  EXPECT_EQ(Distribution({-kInf, kNaN, -kInf}, Params(1.0f)), (std::vector<float>{1, 0, 0}));
  EXPECT_EQ(Distribution({}, Params(1.0f)), std::vector<float>{});
}

TEST(SamplingDistributionTest, NaNLogitsGetNoMass) {
  const std::vector<float> probs = Distribution({0.0f, kNaN, 0.0f}, Params(1.0f));
  EXPECT_EQ(probs, (std::vector<float>{0.5f, 0, 0.5f}));
}

TEST(SamplingDistributionTest, InfiniteLogitsShareTheMass) {
  const std::vector<float> probs = Distribution({kInf, 100.0f, kInf, kNaN}, Params(1.0f));
  EXPECT_EQ(probs, (std::vector<float>{0.5f, 0, 0.5f, 0}));
}

TEST(SamplingDistributionTest, TinyTemperatureApproachesArgmaxWithoutOverflow) {
  for (float temperature : {1e-9f, 1e-30f, std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(Distribution({1.0f, 1.00001f, -1e30f, 0.5f}, Params(temperature)),
              (std::vector<float>{0, 1, 0, 0}));
    // Tied maxima split the mass.
    EXPECT_EQ(Distribution({3.0f, -2.0f, 3.0f}, Params(temperature)),
              (std::vector<float>{0.5f, 0, 0.5f}));
  }
}

TEST(SamplingDistributionTest, HugeTemperatureIsNearlyUniform) {
  const std::vector<float> probs = Distribution(kSmallLogits, Params(1e7f));
  for (float p : probs) EXPECT_NEAR(p, 1.0 / kSmallLogits.size(), 1e-6);
}

TEST(SamplingDistributionTest, LargeVocabularyMatchesReference) {
  // A vocabulary of the size of current tokenizers; a flat-ish distribution makes the nucleus
  // tens of thousands of tokens, so the incremental top-p sort runs through several chunks.
  constexpr size_t kVocab = 151936;
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(kVocab);
  for (float& l : logits) l = normal(rng);
  for (const SamplingParams& params :
       {Params(1.0f, 0, 0.9f), Params(0.7f, 0, 0.3f), Params(0.8f, 40, 0.95f, 0.05f),
        Params(1.0f, 0, 1.0f, 0.2f), Params(1.3f, 5000)}) {
    SCOPED_TRACE(::testing::Message() << "T=" << params.temperature << " k=" << params.top_k
                                      << " p=" << params.top_p << " min_p=" << params.min_p);
    const std::vector<float> probs = Distribution(logits, params);
    const std::vector<double> expected = ReferenceDistribution(logits, params);
    double total = 0.0;
    size_t support = 0;
    size_t expected_support = 0;
    double max_error = 0.0;
    for (size_t i = 0; i < kVocab; ++i) {
      total += probs[i];
      support += probs[i] > 0.0f;
      expected_support += expected[i] > 0.0;
      max_error = std::max(max_error, std::abs(probs[i] - expected[i]));
    }
    EXPECT_NEAR(total, 1.0, 1e-4);
    // The nucleus boundary may move by a token where float and double sums straddle top_p.
    EXPECT_NEAR(static_cast<double>(support), static_cast<double>(expected_support), 1.0);
    EXPECT_LT(max_error, 1e-6);
  }
}

TEST(SamplingDistributionTest, NucleusReachingIntoTheFlatTail) {
  // One dominant token over a flat tail of tiny weights: the nucleus needs most of the tail,
  // whose weights lie below the first (and, in the second case, every nonzero) candidate floor.
  constexpr size_t kVocab = 150000;
  for (const auto& [top_logit, top_p] : {std::pair{12.0f, 0.9f}, std::pair{25.0f, 0.9999999f}}) {
    SCOPED_TRACE(::testing::Message() << "top logit " << top_logit << " top_p " << top_p);
    std::vector<float> logits(kVocab, 0.0f);
    logits[kVocab / 2] = top_logit;
    const SamplingParams params = Params(1.0f, 0, top_p);
    const std::vector<float> probs = Distribution(logits, params);
    const std::vector<double> expected = ReferenceDistribution(logits, params);
    size_t support = 0;
    size_t expected_support = 0;
    for (size_t i = 0; i < kVocab; ++i) {
      support += probs[i] > 0.0f;
      expected_support += expected[i] > 0.0;
      ASSERT_NEAR(probs[i], expected[i], 1e-6) << "token " << i;
    }
    EXPECT_GT(expected_support, kVocab / 2);
    EXPECT_NEAR(static_cast<double>(support), static_cast<double>(expected_support), 1.0);
    // Equal tail weights are taken in index order.
    EXPECT_GT(probs[0], 0.0f);
    EXPECT_EQ(probs[kVocab - 1], 0.0f);
  }
}

// ---- SampleFromDistribution -------------------------------------------------------------------

TEST(SampleFromDistributionTest, InverseCdfOnUnnormalisedWeights) {
  const std::vector<float> weights = {0, 2, 0, 6, 0};
  EXPECT_EQ(SampleFromDistribution(weights, 0.0), 1);
  EXPECT_EQ(SampleFromDistribution(weights, std::nextafter(0.25, 0.0)), 1);
  EXPECT_EQ(SampleFromDistribution(weights, 0.25), 3);
  EXPECT_EQ(SampleFromDistribution(weights, std::nextafter(1.0, 0.0)), 3);
  // Out-of-range u is clamped rather than trusted.
  EXPECT_EQ(SampleFromDistribution(weights, 1.0), 3);
  EXPECT_EQ(SampleFromDistribution(weights, -0.5), 1);
  EXPECT_EQ(SampleFromDistribution(weights, kNaN), 1);
}

TEST(SampleFromDistributionTest, NeverReturnsAZeroProbabilityToken) {
  // Many small weights make the running sum round; u just below 1 must still land on the last
  // positive entry, never on the zero-weight tail.
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> weight(0.0f, 1e-3f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> probs(1000 + trial * 37);
    for (float& p : probs) p = weight(rng);
    const size_t last = probs.size() - 1 - static_cast<size_t>(trial);
    for (size_t i = last + 1; i < probs.size(); ++i) probs[i] = 0.0f;
    for (size_t i = 0; i < probs.size(); i += 3) probs[i] = 0.0f;
    if (probs[last] == 0.0f) probs[last] = 1e-4f;
    const int32_t token = SampleFromDistribution(probs, std::nextafter(1.0, 0.0));
    EXPECT_EQ(static_cast<size_t>(token), last);
    for (double u : {0.0, 0.1, 0.5, 0.999999}) {
      EXPECT_GT(probs[SampleFromDistribution(probs, u)], 0.0f);
    }
  }
}

TEST(SampleFromDistributionTest, SkipsInvalidEntriesAndReportsNone) {
  EXPECT_EQ(SampleFromDistribution(std::vector<float>{kNaN, -1.0f, 0.5f, kInf}, 0.99), 2);
  EXPECT_EQ(SampleFromDistribution(std::vector<float>{0, 0, 0}, 0.5), -1);
  EXPECT_EQ(SampleFromDistribution(std::vector<float>{}, 0.5), -1);
}

// ---- SampleToken: distribution of draws -------------------------------------------------------

// Draws kDraws tokens at consecutive positions and checks the counts against the exact
// distribution with a chi-square test at a fixed significance level. Seeds are fixed, so the
// outcome is deterministic; alpha = 1e-6 only guards against an unlucky choice of seed.
void ExpectDrawsFollow(const std::vector<float>& logits, const SamplingParams& params,
                       RngPurpose purpose = RngPurpose::kSample) {
  constexpr int kDraws = 40000;
  const std::vector<double> expected = ReferenceDistribution(logits, params);
  std::vector<int64_t> counts(logits.size(), 0);
  for (uint64_t position = 0; position < kDraws; ++position) {
    const int32_t token = SampleToken(logits, params, position, purpose);
    ASSERT_GE(token, 0);
    ASSERT_LT(static_cast<size_t>(token), logits.size());
    ++counts[static_cast<size_t>(token)];
  }
  const auto result = testing::PearsonChiSquare(counts, expected);
  EXPECT_EQ(result.impossible, 0);
  if (result.dof > 0) {
    EXPECT_LT(result.statistic, testing::ChiSquareCriticalValue(result.dof, 1e-6))
        << "p-value " << testing::ChiSquarePValue(result.statistic, result.dof);
  }
}

TEST(SampleTokenTest, DrawsFollowTheExactDistribution) {
  ExpectDrawsFollow(kSmallLogits, Params(1.0f, 0, 1.0f, 0.0f, 17));
  ExpectDrawsFollow(kSmallLogits, Params(0.6f, 0, 1.0f, 0.0f, 18));
  ExpectDrawsFollow(kSmallLogits, Params(1.5f, 4, 1.0f, 0.0f, 19));
  ExpectDrawsFollow(kSmallLogits, Params(1.0f, 0, 0.8f, 0.0f, 20));
  ExpectDrawsFollow(kSmallLogits, Params(1.0f, 0, 1.0f, 0.15f, 21));
  ExpectDrawsFollow(kSmallLogits, Params(0.9f, 6, 0.9f, 0.05f, 22));
}

TEST(SampleTokenTest, EveryPurposeDrawsFromTheSameDistribution) {
  ExpectDrawsFollow(kSmallLogits, Params(1.0f, 0, 1.0f, 0.0f, 5), RngPurpose::kAccept);
  ExpectDrawsFollow(kSmallLogits, Params(1.0f, 0, 1.0f, 0.0f, 5), RngPurpose::kResample);
}

TEST(SampleTokenTest, EqualsInverseCdfOfTheDistribution) {
  // SampleToken is exactly SampleFromDistribution(SamplingDistribution(...), u) with the draw
  // for its coordinates, so a mode that builds the distribution itself picks the same token.
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(4096);
  for (float& l : logits) l = normal(rng);
  for (const SamplingParams& params :
       {Params(1.0f, 0, 1.0f, 0.0f, 1), Params(0.8f, 30, 1.0f, 0.0f, 2),
        Params(1.0f, 0, 0.7f, 0.0f, 3), Params(1.2f, 0, 1.0f, 0.1f, 4),
        Params(0.9f, 100, 0.95f, 0.02f, 5)}) {
    const std::vector<float> probs = Distribution(logits, params);
    for (uint64_t position = 0; position < 300; ++position) {
      for (RngPurpose purpose : {RngPurpose::kSample, RngPurpose::kResample}) {
        ASSERT_EQ(SampleToken(logits, params, position, purpose),
                  SampleFromDistribution(probs, UniformRandom(params.seed, position, purpose)));
      }
    }
  }
}

TEST(SampleTokenTest, GreedyIsArgmax) {
  EXPECT_EQ(SampleToken(kSmallLogits, Params(0.0f, 0, 1.0f, 0.0f, 3), 0), 1);
  EXPECT_EQ(SampleToken(std::vector<float>{2, 7, 7}, Params(-1.0f), 9), 1);
}

TEST(SampleTokenTest, DependsOnlyOnSeedPositionAndPurpose) {
  const SamplingParams params = Params(1.0f, 0, 1.0f, 0.0f, 77);
  std::vector<int32_t> forward;
  for (uint64_t position = 0; position < 200; ++position) {
    forward.push_back(SampleToken(kSmallLogits, params, position));
  }
  // Recomputed in reverse order, interleaved with unrelated draws: same tokens.
  for (uint64_t position = 200; position-- > 0;) {
    SampleToken(kSmallLogits, Params(1.0f, 0, 1.0f, 0.0f, 78), position);
    EXPECT_EQ(SampleToken(kSmallLogits, params, position), forward[position]);
  }
  // A different seed gives a different sequence.
  int differences = 0;
  for (uint64_t position = 0; position < 200; ++position) {
    differences +=
        SampleToken(kSmallLogits, Params(1.0f, 0, 1.0f, 0.0f, 78), position) != forward[position];
  }
  EXPECT_GT(differences, 50);
}

}  // namespace
}  // namespace tandem
