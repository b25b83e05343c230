// kernels/cuda RMSNorm (plain and fused with the residual add) against the kernels/cpu reference
// on fresh random inputs. The parameter checks run everywhere; the numeric comparisons skip on
// hosts without a CUDA device.
#include "kernels/cuda/rmsnorm.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/device.h"

namespace tandem::kernels::cuda {
namespace {

using Bf16 = __nv_bfloat16;

// Unit roundoff of bf16 (8 significand bits): rounding to nearest moves a value by at most this
// fraction of itself.
constexpr float kBf16Unit = 1.0f / 256.0f;
constexpr float kEps = 1e-6f;

// ---------------------------------------------------------------------------------------------
// Parameter checks: host only, the pointers are never dereferenced.

class RmsNormCheckTest : public ::testing::Test {
 protected:
  RmsNormParams Valid() {
    RmsNormParams p;
    p.x = x_.data();
    p.weight = weight_.data();
    p.y = y_.data();
    p.rows = kRows;
    p.dim = kDim;
    return p;
  }
  static constexpr int kRows = 4;
  static constexpr int kDim = 16;
  std::vector<Bf16> x_ = std::vector<Bf16>(kRows * kDim);
  std::vector<Bf16> residual_ = std::vector<Bf16>(kRows * kDim);
  std::vector<Bf16> weight_ = std::vector<Bf16>(kDim);
  std::vector<Bf16> y_ = std::vector<Bf16>(kRows * kDim);
};

void ExpectInvalid(const RmsNormParams& params, const std::string& field) {
  const absl::Status status = params.Check();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), std::string::npos) << status;
}

TEST_F(RmsNormCheckTest, AcceptsPlainFusedAndInPlace) {
  RmsNormParams p = Valid();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  p.residual = residual_.data();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  p.y = x_.data();  // y may alias the input
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  EXPECT_EQ(WorkspaceBytes(p), 0u);
}

TEST_F(RmsNormCheckTest, ZeroRowsNeedsNoPointers) {
  RmsNormParams p;
  p.rows = 0;
  p.dim = kDim;
  EXPECT_TRUE(p.Check().ok()) << p.Check();
}

TEST_F(RmsNormCheckTest, RejectsBadShapesAndEps) {
  RmsNormParams p = Valid();
  p.dim = 0;
  ExpectInvalid(p, "dim");
  p = Valid();
  p.rows = -1;
  ExpectInvalid(p, "rows");
  p = Valid();
  p.eps = -1e-6f;
  ExpectInvalid(p, "eps");
  p.eps = std::nanf("");
  ExpectInvalid(p, "eps");
}

TEST_F(RmsNormCheckTest, RejectsNullPointers) {
  RmsNormParams p = Valid();
  p.x = nullptr;
  ExpectInvalid(p, ".x ");
  p = Valid();
  p.weight = nullptr;
  ExpectInvalid(p, ".weight");
  p = Valid();
  p.y = nullptr;
  ExpectInvalid(p, ".y ");
}

TEST_F(RmsNormCheckTest, RejectsOverlappingBuffers) {
  RmsNormParams p = Valid();
  p.y = y_.data();
  p.x = y_.data() + 1;  // shifted by one element: neither equal nor disjoint
  ExpectInvalid(p, "partially overlaps x");
  p = Valid();
  p.residual = y_.data();
  ExpectInvalid(p, "residual overlaps y");
  p = Valid();
  p.residual = x_.data();
  ExpectInvalid(p, "residual overlaps x");
}

TEST(CudaErrorToStatusTest, MapsCodesAndNamesTheCall) {
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "f()", "a.cu", 1).ok());
  const absl::Status oom =
      CudaErrorToStatus(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "kernels/cuda/x.cu", 12);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc(&p, n)"), std::string::npos) << oom;
  EXPECT_NE(oom.message().find("kernels/cuda/x.cu:12"), std::string::npos) << oom;
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos) << oom;
  EXPECT_EQ(CudaErrorToStatus(cudaErrorNoDevice, "f()", "a.cu", 1).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaErrorToStatus(cudaErrorInvalidValue, "f()", "a.cu", 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceCountTest, IsStableAndNeverNegative) {
  const int count = DeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(DeviceCount(), count);
  // With devices present the probe must not leave an error for the next check to trip over.
  if (count > 0) {
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

// ---------------------------------------------------------------------------------------------
// Numerics against kernels/cpu.

struct CudaFree {
  void operator()(void* pointer) const { cudaFree(pointer); }
};
using DeviceBuffer = std::unique_ptr<Bf16, CudaFree>;

// Copies `host` to a fresh device buffer starting `offset` elements into the allocation (offset 1
// breaks the 16-byte alignment the vectorised path needs).
absl::StatusOr<DeviceBuffer> Upload(const std::vector<Bf16>& host, size_t offset = 0) {
  void* raw = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, (host.size() + offset) * sizeof(Bf16)));
  DeviceBuffer buffer(static_cast<Bf16*>(raw));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer.get() + offset, host.data(),
                                         host.size() * sizeof(Bf16), cudaMemcpyHostToDevice));
  return buffer;
}

absl::StatusOr<std::vector<Bf16>> Download(const Bf16* device, size_t count) {
  std::vector<Bf16> host(count);
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host.data(), device, count * sizeof(Bf16), cudaMemcpyDeviceToHost));
  return host;
}

std::vector<Bf16> RandomBf16(std::mt19937& rng, size_t count, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<Bf16> values(count);
  for (Bf16& value : values) value = __float2bfloat16(dist(rng));
  return values;
}

std::vector<float> ToFloat(const std::vector<Bf16>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = __bfloat162float(values[i]);
  return out;
}

// Every element must satisfy |got - want| <= atol + rtol * |want|; the first mismatches are
// listed with their [row, col].
::testing::AssertionResult AllClose(const std::string& name, const std::vector<Bf16>& got,
                                    const std::vector<float>& want, int dim, float rtol,
                                    float atol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " != " << want.size();
  }
  constexpr int kShown = 10;
  size_t mismatches = 0;
  std::string shown;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = __bfloat162float(got[i]);
    const float error = std::fabs(g - want[i]);
    if (!(error <= atol + rtol * std::fabs(want[i]))) {  // also catches NaN
      if (++mismatches <= kShown) {
        absl::StrAppend(&shown, "\n  [", i / dim, ", ", i % dim, "] got ", g, " want ", want[i],
                        " (rel err ", error / std::fabs(want[i]), ")");
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << mismatches << " of " << got.size() << " elements beyond rtol " << rtol
         << " atol " << atol << "; first mismatches:" << shown;
}

struct Shape {
  int rows;
  int dim;
};

// dims cover the scalar path (odd), the 8-wide path, fewer packs than one warp, and rows longer
// than one CTA of 1024 threads (each thread loops).
constexpr Shape kShapes[] = {{1, 8}, {3, 7}, {5, 1001}, {37, 4096}, {2, 8200}, {4, 4099}};

class RmsNormCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    const uint32_t seed = std::random_device{}();
    rng_.seed(seed);
    seed_trace_ = std::make_unique<::testing::ScopedTrace>(__FILE__, __LINE__,
                                                           absl::StrCat("random seed ", seed));
  }

  // Plain RMSNorm of a random [rows, dim] input; `in_place` writes y over x, `offset` misaligns
  // every buffer by that many elements.
  void RunPlain(Shape shape, bool in_place, size_t offset) {
    SCOPED_TRACE(absl::StrCat("rows ", shape.rows, " dim ", shape.dim, " in_place ", in_place,
                              " offset ", offset));
    const size_t n = static_cast<size_t>(shape.rows) * shape.dim;
    const std::vector<Bf16> x = RandomBf16(rng_, n, 0.0f, 2.0f);
    const std::vector<Bf16> weight = RandomBf16(rng_, shape.dim, 1.0f, 0.25f);

    std::vector<float> want(n);
    const std::vector<float> x_float = ToFloat(x);
    const std::vector<float> weight_float = ToFloat(weight);
    cpu::RmsNorm(x_float.data(), weight_float.data(), want.data(), shape.rows, shape.dim, kEps);

    auto d_x = Upload(x, offset);
    auto d_weight = Upload(weight, offset);
    auto d_y = Upload(std::vector<Bf16>(n), offset);
    ASSERT_TRUE(d_x.ok() && d_weight.ok() && d_y.ok())
        << d_x.status() << d_weight.status() << d_y.status();
    RmsNormParams params;
    params.x = d_x->get() + offset;
    params.weight = d_weight->get() + offset;
    params.y = in_place ? d_x->get() + offset : d_y->get() + offset;
    params.rows = shape.rows;
    params.dim = shape.dim;
    params.eps = kEps;
    params.workspace_bytes = WorkspaceBytes(params);
    ASSERT_EQ(params.workspace_bytes, 0u);
    const absl::Status status = Invoke(params, /*stream=*/nullptr);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    auto got = Download(params.y, n);
    ASSERT_TRUE(got.ok()) << got.status();
    // Same bf16 inputs on both sides: only the output rounding (one unit) and fp32 summation
    // order differ. Two units leaves room for the latter without hiding a real error.
    EXPECT_TRUE(AllClose("y", *got, want, shape.dim, 2 * kBf16Unit, 1e-6f));
  }

  void RunFused(Shape shape, bool y_over_x) {
    SCOPED_TRACE(absl::StrCat("rows ", shape.rows, " dim ", shape.dim, " y_over_x ", y_over_x));
    const size_t n = static_cast<size_t>(shape.rows) * shape.dim;
    const std::vector<Bf16> residual = RandomBf16(rng_, n, 0.5f, 3.0f);
    const std::vector<Bf16> delta = RandomBf16(rng_, n, 0.0f, 1.0f);
    const std::vector<Bf16> weight = RandomBf16(rng_, shape.dim, 1.0f, 0.25f);

    std::vector<float> want_residual = ToFloat(residual);
    std::vector<float> want_y(n);
    const std::vector<float> delta_float = ToFloat(delta);
    const std::vector<float> weight_float = ToFloat(weight);
    cpu::AddRmsNorm(want_residual.data(), delta_float.data(), weight_float.data(), want_y.data(),
                    shape.rows, shape.dim, kEps);

    auto d_residual = Upload(residual);
    auto d_delta = Upload(delta);
    auto d_weight = Upload(weight);
    auto d_y = Upload(std::vector<Bf16>(n));
    ASSERT_TRUE(d_residual.ok() && d_delta.ok() && d_weight.ok() && d_y.ok())
        << d_residual.status() << d_delta.status() << d_weight.status() << d_y.status();
    RmsNormParams params;
    params.x = d_delta->get();
    params.residual = d_residual->get();
    params.weight = d_weight->get();
    params.y = y_over_x ? d_delta->get() : d_y->get();
    params.rows = shape.rows;
    params.dim = shape.dim;
    params.eps = kEps;
    const absl::Status status = Invoke(params, /*stream=*/nullptr);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    auto got_residual = Download(params.residual, n);
    auto got_y = Download(params.y, n);
    ASSERT_TRUE(got_residual.ok() && got_y.ok()) << got_residual.status() << got_y.status();
    // The sum is formed in fp32 on both sides, then rounded once to bf16.
    EXPECT_TRUE(AllClose("residual", *got_residual, want_residual, shape.dim, kBf16Unit, 1e-30f));
    // y is normalised from the rounded residual (one unit), whose rounding also moves the row's
    // RMS (at most one unit), then rounded itself (one unit): four leaves summation-order room.
    EXPECT_TRUE(AllClose("y", *got_y, want_y, shape.dim, 4 * kBf16Unit, 1e-6f));
  }

  std::mt19937 rng_;
  std::unique_ptr<::testing::ScopedTrace> seed_trace_;
};

TEST_F(RmsNormCudaTest, PlainMatchesCpu) {
  for (const Shape& shape : kShapes) RunPlain(shape, /*in_place=*/false, /*offset=*/0);
}

TEST_F(RmsNormCudaTest, PlainInPlaceMatchesCpu) {
  for (const Shape& shape : kShapes) RunPlain(shape, /*in_place=*/true, /*offset=*/0);
}

TEST_F(RmsNormCudaTest, MisalignedBuffersMatchCpu) {
  // dim % 8 == 0 but the buffers start 2 bytes off a 16-byte boundary: must take the scalar path.
  RunPlain({3, 4096}, /*in_place=*/false, /*offset=*/1);
}

TEST_F(RmsNormCudaTest, FusedResidualMatchesCpu) {
  for (const Shape& shape : kShapes) RunFused(shape, /*y_over_x=*/false);
}

TEST_F(RmsNormCudaTest, FusedResidualWithYOverDeltaMatchesCpu) {
  for (const Shape& shape : kShapes) RunFused(shape, /*y_over_x=*/true);
}

TEST_F(RmsNormCudaTest, ZeroRowsLaunchesNothing) {
  RmsNormParams params;
  params.dim = 64;
  EXPECT_TRUE(Invoke(params, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem::kernels::cuda
