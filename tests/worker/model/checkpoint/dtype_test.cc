#include "worker/model/checkpoint/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32,
                      DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << DTypeName(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
}

TEST(DTypeTest, UnknownNameIsInvalidArgument) {
  absl::StatusOr<DType> parsed = ParseDType("F8_E4M3");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), ::testing::HasSubstr("F8_E4M3"));
  EXPECT_FALSE(ParseDType("f32").ok());  // names are case-sensitive in safetensors
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F16BitsToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16BitsToF32(0xc000), -2.0f);
  EXPECT_EQ(F16BitsToF32(0x3555), 0.333251953125f);
  EXPECT_EQ(F16BitsToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16BitsToF32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(F16BitsToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16BitsToF32(0x03ff), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(F16BitsToF32(0x7c00), kInf);
  EXPECT_EQ(F16BitsToF32(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(F16BitsToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16BitsToF32(0x7c01)));  // signalling NaN must not become infinity
  const float negative_zero = F16BitsToF32(0x8000);
  EXPECT_EQ(negative_zero, 0.0f);
  EXPECT_TRUE(std::signbit(negative_zero));
}

TEST(DTypeTest, BF16KnownValues) {
  EXPECT_EQ(BF16BitsToF32(0x3f80), 1.0f);
  EXPECT_EQ(BF16BitsToF32(0x4049), 3.140625f);
  EXPECT_EQ(BF16BitsToF32(0xc2f7), -123.5f);
  EXPECT_EQ(BF16BitsToF32(0x0001), std::ldexp(1.0f, -133));  // fp32 subnormal
  EXPECT_EQ(BF16BitsToF32(0x7f80), kInf);
  EXPECT_EQ(BF16BitsToF32(0xff80), -kInf);
  EXPECT_TRUE(std::isnan(BF16BitsToF32(0x7fc0)));
}

TEST(DTypeTest, F16EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = F16BitsToF32(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(F16BitsToF32(F32ToF16Bits(value)))) << bits;
    } else {
      ASSERT_EQ(F32ToF16Bits(value), bits) << "pattern " << bits;
    }
  }
}

TEST(DTypeTest, BF16EveryPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = BF16BitsToF32(static_cast<uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(BF16BitsToF32(F32ToBF16Bits(value)))) << bits;
    } else {
      ASSERT_EQ(F32ToBF16Bits(value), bits) << "pattern " << bits;
    }
  }
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  const float ulp_at_one = std::ldexp(1.0f, -10);
  EXPECT_EQ(F32ToF16Bits(1.0f + ulp_at_one / 2), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(F32ToF16Bits(1.0f + 3 * ulp_at_one / 2), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(F32ToF16Bits(std::nextafter(1.0f + ulp_at_one / 2, 2.0f)), 0x3c01);
  EXPECT_EQ(F32ToF16Bits(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16Bits(65520.0f), 0x7c00);  // halfway to 2^16 rounds to infinity
  EXPECT_EQ(F32ToF16Bits(-1e10f), 0xfc00);
  const float min_subnormal = std::ldexp(1.0f, -24);
  EXPECT_EQ(F32ToF16Bits(min_subnormal / 2), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(F32ToF16Bits(std::nextafter(min_subnormal / 2, 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16Bits(1.5f * min_subnormal), 0x0002);
  EXPECT_EQ(F32ToF16Bits(2.5f * min_subnormal), 0x0002);
  EXPECT_EQ(F32ToF16Bits(-1e-30f), 0x8000);
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(F32ToF16Bits(std::ldexp(1.0f, -14) - min_subnormal / 4), 0x0400);
  EXPECT_EQ(F32ToF16Bits(std::numeric_limits<float>::quiet_NaN()) & 0x7c00, 0x7c00);
  EXPECT_NE(F32ToF16Bits(std::numeric_limits<float>::quiet_NaN()) & 0x03ff, 0);
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  const float ulp_at_one = std::ldexp(1.0f, -7);
  EXPECT_EQ(F32ToBF16Bits(1.0f + ulp_at_one / 2), 0x3f80);
  EXPECT_EQ(F32ToBF16Bits(1.0f + 3 * ulp_at_one / 2), 0x3f82);
  EXPECT_EQ(F32ToBF16Bits(std::nextafter(1.0f + ulp_at_one / 2, 2.0f)), 0x3f81);
  EXPECT_EQ(F32ToBF16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(F32ToBF16Bits(-kInf), 0xff80);
  const uint16_t nan = F32ToBF16Bits(std::bit_cast<float>(0x7f800001u));  // payload in low bits
  EXPECT_TRUE(std::isnan(BF16BitsToF32(nan)));
}

// Independent check of F32ToF16Bits: the result must be a nearest half, and even on ties.
TEST(DTypeTest, F16MatchesNearestRepresentableOnRandomInputs) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits_dist(0, 0xffffffffu);
  for (int trial = 0; trial < 200000; ++trial) {
    const float x = std::bit_cast<float>(bits_dist(rng));
    if (!std::isfinite(x) || std::fabs(x) >= 65504.0f) continue;
    const uint16_t h = F32ToF16Bits(x);
    const double got = F16BitsToF32(h);
    const double err = std::fabs(got - x);
    // Neighbours of h in magnitude (same sign).
    for (int delta : {-1, 1}) {
      const int neighbour = (h & 0x7fff) + delta;
      if (neighbour < 0 || neighbour > 0x7bff) continue;
      const double other =
          F16BitsToF32(static_cast<uint16_t>((h & 0x8000) | static_cast<uint16_t>(neighbour)));
      const double other_err = std::fabs(other - x);
      ASSERT_LE(err, other_err) << "x=" << x;
      if (err == other_err) {
        ASSERT_EQ(h & 1, 0) << "tie not to even, x=" << x;
      }
    }
  }
}

TEST(DTypeTest, ConvertToF32HandlesUnalignedSources) {
  const std::vector<float> values = {1.0f, -0.5f, 3.25f, 1e-3f, -65504.0f};
  // Offset 1 makes every element misaligned.
  std::vector<std::byte> buffer(1 + values.size() * 8);

  auto check = [&](DType dtype, auto encode, const std::vector<float>& expected) {
    const size_t size = DTypeSize(dtype);
    for (size_t i = 0; i < values.size(); ++i) {
      const auto encoded = encode(values[i]);
      static_assert(std::is_trivially_copyable_v<decltype(encoded)>);
      std::memcpy(buffer.data() + 1 + i * size, &encoded, size);
    }
    std::vector<float> out(values.size());
    ASSERT_TRUE(ConvertToF32(dtype, buffer.data() + 1, values.size(), out.data()).ok());
    EXPECT_EQ(out, expected) << DTypeName(dtype);
  };
  check(
      DType::kF32, [](float v) { return v; }, values);
  check(
      DType::kF64, [](float v) { return static_cast<double>(v); }, values);
  std::vector<float> f16_expected;
  std::vector<float> bf16_expected;
  for (float v : values) {
    f16_expected.push_back(F16BitsToF32(F32ToF16Bits(v)));
    bf16_expected.push_back(BF16BitsToF32(F32ToBF16Bits(v)));
  }
  check(
      DType::kF16, [](float v) { return F32ToF16Bits(v); }, f16_expected);
  check(
      DType::kBF16, [](float v) { return F32ToBF16Bits(v); }, bf16_expected);
  EXPECT_EQ(f16_expected[2], 3.25f);
  EXPECT_EQ(bf16_expected[1], -0.5f);
}

TEST(DTypeTest, F64OutOfRangeBecomesInfinityAndTinyBecomesSubnormal) {
  const double values[] = {1e300, -1e300, 1e-40, 1e-60, std::numeric_limits<double>::quiet_NaN()};
  float out[5];
  ASSERT_TRUE(ConvertToF32(DType::kF64, reinterpret_cast<const std::byte*>(values), 5, out).ok());
  EXPECT_EQ(out[0], kInf);
  EXPECT_EQ(out[1], -kInf);
  EXPECT_EQ(out[2], 1e-40f);
  EXPECT_GT(out[2], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_TRUE(std::isnan(out[4]));
}

TEST(DTypeTest, ConvertingIntegersIsInvalidArgument) {
  const int32_t ints[2] = {1, 2};
  float out[2];
  absl::Status status = ConvertToF32(DType::kI32, reinterpret_cast<const std::byte*>(ints), 2, out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("I32"));
}

}  // namespace
}  // namespace tandem
