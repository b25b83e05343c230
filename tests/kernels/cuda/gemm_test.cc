// kernels/cuda matrix product (gemv.cuh, gemm_skinny.cuh, cuBLAS) against kernels/cpu Linear on
// random bf16 operands, bf16 and fp32 outputs, strided rows, bias and accumulation. Parameter
// checks run everywhere; the comparisons skip without a CUDA device.
#include "kernels/cuda/gemm.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm_skinny.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace tandem::kernels::cuda {
namespace {

using testing::Bf16;
using testing::ExpectInvalid;

class GemmCheckTest : public ::testing::Test {
 protected:
  GemmParams Valid() {
    GemmParams p;
    p.handle = reinterpret_cast<cublasHandle_t>(&fake_handle_);
    p.x = x_.data();
    p.w = w_.data();
    p.y = y_.data();
    p.m = 2;
    p.n = 3;
    p.k = 4;
    p.ldx = 4;
    p.ldw = 4;
    p.ldy = 3;
    p.workspace = &fake_handle_;
    p.workspace_bytes = WorkspaceBytes(p);
    return p;
  }
  int fake_handle_ = 0;
  std::vector<Bf16> x_ = std::vector<Bf16>(8);
  std::vector<Bf16> w_ = std::vector<Bf16>(12);
  std::vector<Bf16> y_ = std::vector<Bf16>(6);
};

TEST_F(GemmCheckTest, AcceptsValid) {
  GemmParams p = Valid();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_GT(WorkspaceBytes(p), 0u);
  GemmParams empty;
  empty.n = 3;
  empty.k = 4;
  empty.ldx = 4;
  empty.ldw = 4;
  empty.ldy = 3;
  EXPECT_TRUE(empty.Check().ok()) << empty.Check();
}

TEST_F(GemmCheckTest, RejectsBadFields) {
  GemmParams p = Valid();
  p.handle = nullptr;
  ExpectInvalid(p, "handle");
  p = Valid();
  p.k = 0;
  ExpectInvalid(p, "k must");
  p = Valid();
  p.ldx = 3;
  ExpectInvalid(p, "ldx");
  p = Valid();
  p.ldw = 3;
  ExpectInvalid(p, "ldw");
  p = Valid();
  p.ldy = 2;
  ExpectInvalid(p, "ldy");
  p = Valid();
  p.workspace_bytes = 16;
  ExpectInvalid(p, "workspace");
  p = Valid();
  p.y = x_.data();
  ExpectInvalid(p, "y overlaps x");
  p = Valid();
  p.beta = INFINITY;
  ExpectInvalid(p, "beta");
}

TEST(CublasStatusTest, MapsCodes) {
  EXPECT_TRUE(CublasStatusToStatus(CUBLAS_STATUS_SUCCESS, "f()").ok());
  const absl::Status status = CublasStatusToStatus(CUBLAS_STATUS_ALLOC_FAILED, "cublasFoo()");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("cublasFoo()"), std::string::npos) << status;
}

class GemmCudaTest : public testing::CudaTest {
 protected:
  void SetUp() override {
    testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }

  void Run(int m, int n, int k, GemmOutput type, bool bias, bool accumulate, int pad) {
    SCOPED_TRACE(absl::StrCat("m ", m, " n ", n, " k ", k, " fp32 out ",
                              type == GemmOutput::kFloat32, " bias ", bias, " accumulate ",
                              accumulate, " pad ", pad));
    const int ldx = k + pad, ldw = k + pad, ldy = n + pad;
    const std::vector<Bf16> x = testing::RandomBf16(rng_, static_cast<size_t>(m) * ldx, 0, 1);
    const std::vector<Bf16> w = testing::RandomBf16(rng_, static_cast<size_t>(n) * ldw, 0, 0.1f);
    const std::vector<Bf16> b = testing::RandomBf16(rng_, n, 0, 1);
    const std::vector<Bf16> y0 = testing::RandomBf16(rng_, static_cast<size_t>(m) * ldy, 0, 1);
    const float alpha = 0.75f;
    // Reference in fp32 from the same bf16 values, packed (no padding).
    std::vector<float> xf(static_cast<size_t>(m) * k), wf(static_cast<size_t>(n) * k);
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < k; ++c) xf[r * k + c] = __bfloat162float(x[r * ldx + c]);
    }
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < k; ++c) wf[r * k + c] = __bfloat162float(w[r * ldw + c]);
    }
    std::vector<float> product(static_cast<size_t>(m) * n);
    cpu::Linear(xf.data(), wf.data(), nullptr, product.data(), m, n, k);
    // |x|·|w| per output bounds the accumulation error of either side.
    std::vector<float> abs_product(product.size());
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < n; ++c) {
        double s = 0;
        for (int i = 0; i < k; ++i) s += std::fabs(xf[r * k + i] * wf[c * k + i]);
        abs_product[r * n + c] = static_cast<float>(s);
      }
    }
    std::vector<float> want(static_cast<size_t>(m) * ldy);
    std::vector<float> y0f = testing::ToFloat(y0);
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < ldy; ++c) {
        const size_t i = static_cast<size_t>(r) * ldy + c;
        if (c >= n) {  // padding: untouched
          want[i] = type == GemmOutput::kBf16 ? y0f[i] : 1.0f;
          continue;
        }
        float v = alpha * product[r * n + c] + (accumulate ? y0f[i] : 0.0f);
        if (bias) {
          // The bias is added to the stored product: one more rounding for bf16 output.
          if (type == GemmOutput::kBf16) v = __bfloat162float(__float2bfloat16(v));
          v += __bfloat162float(b[c]);
        }
        want[i] = v;
      }
    }
    auto d_x = testing::Upload(x);
    auto d_w = testing::Upload(w);
    auto d_b = testing::Upload(b);
    auto d_workspace = testing::Allocate(WorkspaceBytes(GemmParams{}));
    ASSERT_TRUE(d_x.ok() && d_w.ok() && d_b.ok() && d_workspace.ok());
    GemmParams p;
    p.handle = handle_;
    p.x = d_x->get();
    p.w = d_w->get();
    p.bias = bias ? d_b->get() : nullptr;
    p.y_type = type;
    p.m = m;
    p.n = n;
    p.k = k;
    p.ldx = ldx;
    p.ldw = ldw;
    p.ldy = ldy;
    p.alpha = alpha;
    p.beta = accumulate ? 1.0f : 0.0f;
    p.workspace = d_workspace->get();
    p.workspace_bytes = WorkspaceBytes(p);
    const float fp32_rel = 1e-5f * std::sqrt(static_cast<float>(k));
    if (type == GemmOutput::kBf16) {
      std::vector<Bf16> y_init = y0;
      if (!accumulate) {
        for (int r = 0; r < m; ++r) {
          for (int c = 0; c < n; ++c) y_init[r * ldy + c] = __float2bfloat16(std::nanf(""));
        }
      }
      auto d_y = testing::Upload(y_init);
      ASSERT_TRUE(d_y.ok());
      p.y = d_y->get();
      ASSERT_TRUE(Invoke(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto got = testing::Download(d_y->get(), want.size());
      ASSERT_TRUE(got.ok());
      EXPECT_TRUE(testing::AllWithin("y", *got, want, ldy, [&](size_t i) {
        const int c = static_cast<int>(i % ldy);
        if (c >= n) return 0.0f;
        const float acc = alpha * abs_product[(i / ldy) * n + c];
        // One rounding of the result, plus (with a bias) the stored product's own rounding,
        // which may land on the other neighbour of the CPU's (one ulp, 2 units of |product|).
        return testing::kBf16Unit * (std::fabs(want[i]) + 2.0f * acc) + fp32_rel * acc + 1e-6f;
      }));
    } else {
      std::vector<float> y_init(want.size(), 1.0f);
      for (int r = 0; r < m; ++r) {
        for (int c = 0; c < n; ++c) {
          y_init[r * ldy + c] = accumulate ? y0f[r * ldy + c] : std::nanf("");
        }
      }
      auto d_y = testing::Upload(y_init);
      ASSERT_TRUE(d_y.ok());
      p.y = d_y->get();
      ASSERT_TRUE(Invoke(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto got = testing::Download(d_y->get(), want.size());
      ASSERT_TRUE(got.ok());
      EXPECT_TRUE(testing::AllWithin("y", *got, want, ldy, [&](size_t i) {
        const int c = static_cast<int>(i % ldy);
        if (c >= n) return 0.0f;
        const float acc = alpha * abs_product[(i / ldy) * n + c];
        return fp32_rel * (acc + std::fabs(want[i])) + 1e-6f;
      }));
    }
  }

  cublasHandle_t handle_ = nullptr;
};

TEST_F(GemmCudaTest, Bf16OutputMatchesCpu) {
  Run(1, 1, 1, GemmOutput::kBf16, false, false, 0);
  Run(1, 4864, 896, GemmOutput::kBf16, false, false, 0);  // decode row
  Run(37, 1152, 896, GemmOutput::kBf16, true, false, 0);  // qkv with bias
  Run(5, 33, 70, GemmOutput::kBf16, false, true, 3);      // odd sizes, strides, accumulate
}

// Up to kGemvMaxRows (2) rows with k and the strides multiples of 8 take the small-m kernel
// (gemv.cuh), 3-8 rows the skinny tensor-core kernel (gemm_skinny.cuh), more rows or unaligned
// shapes cuBLAS: row counts on both sides of each switch, bias, accumulation, strides, a weight
// row count that leaves the last CTA partial, and a k that leaves a tail after the unrolled
// rounds (1032 = 32 steps of 32 and 8).
TEST_F(GemmCudaTest, SmallRowCountsMatchCpu) {
  for (int m = 1; m <= 17; ++m) {
    Run(m, 203, 1032, GemmOutput::kBf16, m % 2 == 0, m % 3 == 0, m % 2 == 0 ? 8 : 0);
    Run(m, 67, 4096 + 8, GemmOutput::kFloat32, m % 2 == 1, m % 4 == 0, m % 3 == 0 ? 16 : 0);
  }
  Run(8, 1000, 8, GemmOutput::kBf16, true, false, 0);  // one vector per row
  Run(9, 64, 256, GemmOutput::kBf16, false, false, 0);
  Run(12, 50, 70, GemmOutput::kBf16, true, true, 2);  // k not a multiple of 8: cuBLAS
}

// The skinny kernel's CTA shapes: 1, 2 and 4 groups of 16 weight rows per CTA (by n), the last
// CTA partial, and a long k split over 8, 4 and 2 warps.
TEST_F(GemmCudaTest, SkinnyProductsMatchCpu) {
  for (int m : {3, 5, 8}) {
    Run(m, 4096 + 16, 512, GemmOutput::kBf16, m == 5, false, 0);      // 1 group
    Run(m, 8192 + 40, 256 + 8, GemmOutput::kBf16, false, m == 8, 8);  // 2 groups
    Run(m, 16384 + 24, 136, GemmOutput::kFloat32, m == 3, false, 0);  // 4 groups
    Run(m, 48, 12288, GemmOutput::kBf16, false, m == 8, 0);           // long k
  }
}

// A row's product does not depend on how many rows the skinny kernel multiplies with it: the
// first rows of an 8-row product equal, bit for bit, the products of 3 to 7 rows.
TEST_F(GemmCudaTest, SkinnyRowsAreBatchInvariant) {
  const int n = 8192 + 16, k = 2048 + 8;
  constexpr int kRows = internal::kSkinnyMaxRows;
  const std::vector<Bf16> x = testing::RandomBf16(rng_, static_cast<size_t>(kRows) * k, 0, 1);
  const std::vector<Bf16> w = testing::RandomBf16(rng_, static_cast<size_t>(n) * k, 0, 0.1f);
  auto d_x = testing::Upload(x);
  auto d_w = testing::Upload(w);
  auto d_y = testing::Allocate(static_cast<size_t>(kRows) * n * sizeof(float));
  auto d_workspace = testing::Allocate(WorkspaceBytes(GemmParams{}));
  ASSERT_TRUE(d_x.ok() && d_w.ok() && d_y.ok() && d_workspace.ok());
  auto product = [&](int m) -> std::vector<float> {
    GemmParams p;
    p.handle = handle_;
    p.x = d_x->get();
    p.w = d_w->get();
    p.y = d_y->get();
    p.y_type = GemmOutput::kFloat32;
    p.m = m;
    p.n = n;
    p.k = k;
    p.ldx = k;
    p.ldw = k;
    p.ldy = n;
    p.workspace = d_workspace->get();
    p.workspace_bytes = WorkspaceBytes(p);
    EXPECT_EQ(cudaMemset(d_y->get(), 0xff, static_cast<size_t>(kRows) * n * sizeof(float)),
              cudaSuccess);  // NaN
    EXPECT_TRUE(Invoke(p, nullptr).ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    auto got =
        testing::Download(reinterpret_cast<const float*>(d_y->get()), static_cast<size_t>(m) * n);
    EXPECT_TRUE(got.ok());
    return got.ok() ? *got : std::vector<float>();
  };
  const std::vector<float> full = product(kRows);
  ASSERT_EQ(full.size(), static_cast<size_t>(kRows) * n);
  for (int m = 3; m < kRows; ++m) {
    SCOPED_TRACE(absl::StrCat("m ", m));
    const std::vector<float> part = product(m);
    ASSERT_EQ(part.size(), static_cast<size_t>(m) * n);
    for (size_t i = 0; i < part.size(); ++i) {
      ASSERT_EQ(std::memcmp(&part[i], &full[i], sizeof(float)), 0)
          << "output " << i << ": " << part[i] << " against " << full[i];
    }
  }
}

// Short products split k over 2, 4 or 8 warps per column (gemv.cu SplitFor), slices of unequal
// length included; every output checked.
TEST_F(GemmCudaTest, SplitKProductsMatchCpu) {
  for (int m = 1; m <= 2; ++m) {
    Run(m, 1024, 4096, GemmOutput::kBf16, m == 2, false, 0);        // 4 warps per column
    Run(m, 4096, 4096 + 24, GemmOutput::kBf16, m == 1, m == 2, 8);  // 4, uneven slices
    Run(m, 96, 8192 + 8, GemmOutput::kFloat32, false, m == 1, 0);   // 8, uneven slices
    Run(m, 6144, 2048, GemmOutput::kBf16, false, false, 0);         // 2
    Run(m, 3, 12288, GemmOutput::kFloat32, true, false, 0);         // 8: a CTA per column
  }
}

TEST_F(GemmCudaTest, Fp32OutputMatchesCpu) {
  Run(3, 1000, 256, GemmOutput::kFloat32, false, false, 0);  // logits
  Run(9, 65, 129, GemmOutput::kFloat32, true, true, 8);
}

}  // namespace
}  // namespace tandem::kernels::cuda
