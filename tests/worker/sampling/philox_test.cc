#include "worker/sampling/philox.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "tests/worker/sampling/chi_square.h"
#include "worker/sampling/sampling.h"

namespace tandem {
namespace {

// Known-answer vectors for philox4x32 with 10 rounds, published with the Random123 library
// (tests/kat_vectors): counter words, key words, expected output words.
struct KnownAnswer {
  PhiloxCounter counter;
  PhiloxKey key;
  PhiloxCounter expected;
};
constexpr KnownAnswer kKnownAnswers[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    // Digits of pi.
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

// The generator is constexpr, so the vectors also hold at compile time.
static_assert(Philox4x32_10(kKnownAnswers[0].counter, kKnownAnswers[0].key) ==
              kKnownAnswers[0].expected);

TEST(PhiloxTest, MatchesPublishedKnownAnswers) {
  for (const KnownAnswer& kat : kKnownAnswers) {
    EXPECT_EQ(Philox4x32_10(kat.counter, kat.key), kat.expected)
        << std::hex << "counter " << kat.counter[0] << " key " << kat.key[0];
  }
}

TEST(PhiloxTest, EveryInputWordChangesTheOutput) {
  const PhiloxCounter base = Philox4x32_10({1, 2, 3, 4}, {5, 6});
  for (int word = 0; word < 4; ++word) {
    PhiloxCounter counter = {1, 2, 3, 4};
    counter[word] ^= 1u;
    EXPECT_NE(Philox4x32_10(counter, {5, 6}), base) << "counter word " << word;
  }
  EXPECT_NE(Philox4x32_10({1, 2, 3, 4}, {4, 6}), base);
  EXPECT_NE(Philox4x32_10({1, 2, 3, 4}, {5, 7}), base);
}

TEST(UniformRandomTest, SameCoordinatesGiveSameValue) {
  for (uint64_t position = 0; position < 100; ++position) {
    EXPECT_EQ(UniformRandom(42, position, RngPurpose::kSample),
              UniformRandom(42, position, RngPurpose::kSample));
  }
}

TEST(UniformRandomTest, EachCoordinateMatters) {
  const double base = UniformRandom(7, 1000, RngPurpose::kSample, 0);
  EXPECT_NE(UniformRandom(8, 1000, RngPurpose::kSample, 0), base);
  EXPECT_NE(UniformRandom(7 | (uint64_t{1} << 40), 1000, RngPurpose::kSample, 0), base);
  EXPECT_NE(UniformRandom(7, 1001, RngPurpose::kSample, 0), base);
  EXPECT_NE(UniformRandom(7, 1000 | (uint64_t{1} << 35), RngPurpose::kSample, 0), base);
  EXPECT_NE(UniformRandom(7, 1000, RngPurpose::kAccept, 0), base);
  EXPECT_NE(UniformRandom(7, 1000, RngPurpose::kSample, 1), base);

  std::set<double> by_purpose;
  for (RngPurpose purpose : {RngPurpose::kSample, RngPurpose::kAccept, RngPurpose::kResample,
                             RngPurpose::kDraft, RngPurpose::kMask}) {
    by_purpose.insert(UniformRandom(7, 1000, purpose));
  }
  EXPECT_EQ(by_purpose.size(), 5u);
}

TEST(UniformRandomTest, ValuesAreMultiplesOf2ToTheMinus53InUnitInterval) {
  for (uint64_t position = 0; position < 10000; ++position) {
    const double u = UniformRandom(3, position, RngPurpose::kSample);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const double scaled = std::ldexp(u, 53);
    ASSERT_EQ(scaled, std::floor(scaled));
  }
}

TEST(UniformRandomTest, UniformOverBins) {
  constexpr int kBins = 64;
  constexpr int kDraws = 64000;
  std::vector<int64_t> counts(kBins, 0);
  for (uint64_t position = 0; position < kDraws; ++position) {
    ++counts[static_cast<int>(UniformRandom(2024, position, RngPurpose::kSample) * kBins)];
  }
  const std::vector<double> expected(kBins, 1.0 / kBins);
  const auto result = testing::PearsonChiSquare(counts, expected);
  EXPECT_LT(result.statistic, testing::ChiSquareCriticalValue(result.dof, 1e-6));
}

// Pairs drawn at the same position for two purposes, or for the same purpose at neighbouring
// positions or seeds, must be jointly uniform on the unit square (independent).
void ExpectJointlyUniform(double (*first)(uint64_t), double (*second)(uint64_t)) {
  constexpr int kSide = 8;
  constexpr int kDraws = 64000;
  std::vector<int64_t> counts(kSide * kSide, 0);
  for (uint64_t i = 0; i < kDraws; ++i) {
    const int x = static_cast<int>(first(i) * kSide);
    const int y = static_cast<int>(second(i) * kSide);
    ++counts[x * kSide + y];
  }
  const std::vector<double> expected(kSide * kSide, 1.0 / (kSide * kSide));
  const auto result = testing::PearsonChiSquare(counts, expected);
  EXPECT_LT(result.statistic, testing::ChiSquareCriticalValue(result.dof, 1e-6));
}

TEST(UniformRandomTest, PurposesAreIndependent) {
  ExpectJointlyUniform([](uint64_t i) { return UniformRandom(11, i, RngPurpose::kSample); },
                       [](uint64_t i) { return UniformRandom(11, i, RngPurpose::kAccept); });
  ExpectJointlyUniform([](uint64_t i) { return UniformRandom(11, i, RngPurpose::kAccept); },
                       [](uint64_t i) { return UniformRandom(11, i, RngPurpose::kResample); });
}

TEST(UniformRandomTest, NeighbouringPositionsAndSeedsAreIndependent) {
  ExpectJointlyUniform([](uint64_t i) { return UniformRandom(5, 2 * i, RngPurpose::kSample); },
                       [](uint64_t i) { return UniformRandom(5, 2 * i + 1, RngPurpose::kSample); });
  ExpectJointlyUniform([](uint64_t i) { return UniformRandom(i, 9, RngPurpose::kSample); },
                       [](uint64_t i) { return UniformRandom(i + 1, 9, RngPurpose::kSample); });
}

TEST(ChiSquareHelperTest, CriticalValuesMatchTables) {
  // Standard table entries.
  EXPECT_NEAR(testing::ChiSquareCriticalValue(1, 0.05), 3.841, 1e-3);
  EXPECT_NEAR(testing::ChiSquareCriticalValue(10, 0.01), 23.209, 1e-3);
  EXPECT_NEAR(testing::ChiSquareCriticalValue(63, 0.05), 82.529, 1e-3);
  EXPECT_NEAR(testing::ChiSquarePValue(2.0, 2), std::exp(-1.0), 1e-12);
}

}  // namespace
}  // namespace tandem
