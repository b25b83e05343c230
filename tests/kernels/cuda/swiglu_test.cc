// kernels/cuda SwiGLU against kernels/cpu SiluMulFused on random inputs. Parameter checks run
// everywhere; the comparisons skip without a CUDA device.
#include "kernels/cuda/swiglu.cuh"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cpu/activation.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

TEST(SwiGluCheckTest, ValidatesFields) {
  std::vector<Bf16> in(2 * 2 * 8), out(2 * 8);
  SwiGluParams p;
  p.gate_up = in.data();
  p.out = out.data();
  p.rows = 2;
  p.inter = 8;
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  SwiGluParams q = p;
  q.rows = -1;
  ExpectInvalid(q, "rows");
  q = p;
  q.inter = 0;
  ExpectInvalid(q, "inter");
  q = p;
  q.out = in.data() + 3;
  ExpectInvalid(q, "overlaps");
  q = p;
  q.gate_up = nullptr;
  ExpectInvalid(q, "gate_up");
  q = SwiGluParams{};
  q.inter = 4;
  EXPECT_TRUE(q.Check().ok());  // zero rows, no pointers
}

class SwiGluCudaTest : public testing::CudaTest {};

TEST_F(SwiGluCudaTest, MatchesCpu) {
  const int shapes[][2] = {{1, 1}, {3, 7}, {17, 1000}, {64, 4864}};
  for (const auto& shape : shapes) {
    const int rows = shape[0], inter = shape[1];
    SCOPED_TRACE(absl::StrCat("rows ", rows, " inter ", inter));
    const size_t n = static_cast<size_t>(rows) * inter;
    // Wide inputs: |g| up to ~30 exercises both saturated ends of silu.
    const std::vector<Bf16> gate_up = testing::RandomBf16(rng_, 2 * n, 0.0f, 6.0f);
    const std::vector<float> gate_up_float = testing::ToFloat(gate_up);
    std::vector<float> want(n);
    cpu::SiluMulFused(gate_up_float.data(), want.data(), rows, inter);
    auto d_in = testing::Upload(gate_up);
    auto d_out = testing::Upload(testing::NanBf16(n));
    ASSERT_TRUE(d_in.ok() && d_out.ok());
    SwiGluParams p;
    p.gate_up = d_in->get();
    p.out = d_out->get();
    p.rows = rows;
    p.inter = inter;
    ASSERT_TRUE(Invoke(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got = testing::Download(p.out, n);
    ASSERT_TRUE(got.ok());
    // Same bf16 inputs; the fp32 results differ by a few ulp of expf, then round once to bf16.
    EXPECT_TRUE(testing::AllClose("out", *got, want, inter, 1.5f * testing::kBf16Unit, 1e-30f));
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
