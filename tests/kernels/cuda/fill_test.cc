// kernels/cuda FillUniform against its host formula (FillUniformUnit), bit for bit, every element
// written. Parameter checks and the formula's statistics run everywhere; the device comparison
// skips without a CUDA device.
#include "kernels/cuda/fill.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

TEST(FillUniformCheckTest, ValidatesFields) {
  std::vector<Bf16> data(8);
  FillUniformParams p;
  p.data = data.data();
  p.count = data.size();
  p.half_width = 0.5f;
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  FillUniformParams q = p;
  q.data = nullptr;
  ExpectInvalid(q, "data");
  q = p;
  q.half_width = -1.0f;
  ExpectInvalid(q, "half_width");
  q = p;
  q.half_width = std::numeric_limits<float>::infinity();
  ExpectInvalid(q, "half_width");
  q = FillUniformParams{};
  EXPECT_TRUE(q.Check().ok());  // nothing to fill, no pointer
}

TEST(FillUniformUnitTest, IsUniformOnTheUnitIntervalAndDependsOnTheSeed) {
  constexpr int kCount = 1 << 16;
  double sum = 0.0, sum_squares = 0.0;
  int differs = 0;
  for (int i = 0; i < kCount; ++i) {
    const float u = FillUniformUnit(7, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum_squares += static_cast<double>(u) * u;
    differs += u != FillUniformUnit(8, i);
  }
  const double mean = sum / kCount, variance = sum_squares / kCount - mean * mean;
  // Uniform: mean 1/2, variance 1/12; the standard error of the mean is ~0.0011 here.
  EXPECT_NEAR(mean, 0.5, 0.01);
  EXPECT_NEAR(variance, 1.0 / 12.0, 0.005);
  EXPECT_GT(differs, kCount * 99 / 100);
}

class FillUniformCudaTest : public testing::CudaTest {};

TEST_F(FillUniformCudaTest, WritesTheHostFormulaIntoEveryElement) {
  // Odd sizes, and one past a single grid's reach so the grid-stride loop wraps.
  const size_t counts[] = {1, 5, 4099, size_t{65535} * 256 + 77};
  for (const size_t count : counts) {
    SCOPED_TRACE(absl::StrCat("count ", count));
    auto d_data = testing::Upload(testing::NanBf16(count));
    ASSERT_TRUE(d_data.ok());
    FillUniformParams p;
    p.data = d_data->get();
    p.count = count;
    p.seed = 0x1234'5678'9ABCull;
    p.half_width = 0.75f;
    ASSERT_TRUE(Invoke(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = testing::Download(p.data, count);
    ASSERT_TRUE(got.ok());
    std::vector<float> want(count);
    for (size_t i = 0; i < count; ++i) {
      want[i] = __bfloat162float(
          __float2bfloat16(p.half_width * (2.0f * FillUniformUnit(p.seed, i) - 1.0f)));
    }
    EXPECT_TRUE(testing::AllWithin("data", *got, want, 1, [](size_t) { return 0.0f; }));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
