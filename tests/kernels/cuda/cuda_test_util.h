// Shared pieces of the kernels/cuda tests: device buffers, random bf16 data, and the element-wise
// comparison every op test uses (every element checked, first mismatches printed).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"

namespace tandem::kernels::cuda::testing {

using Bf16 = __nv_bfloat16;

// Unit roundoff of bf16 (8 significand bits).
inline constexpr float kBf16Unit = 1.0f / 256.0f;

struct CudaFree {
  void operator()(void* pointer) const { cudaFree(pointer); }
};

template <typename T>
using DeviceBuffer = std::unique_ptr<T, CudaFree>;

template <typename T>
absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host) {
  void* raw = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, std::max<size_t>(1, host.size()) * sizeof(T)));
  DeviceBuffer<T> buffer(static_cast<T*>(raw));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}

template <typename T>
absl::StatusOr<std::vector<T>> Download(const T* device, size_t count) {
  std::vector<T> host(count);
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

inline absl::StatusOr<DeviceBuffer<char>> Allocate(size_t bytes) {
  void* raw = nullptr;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, std::max<size_t>(1, bytes)));
  return DeviceBuffer<char>(static_cast<char*>(raw));
}

inline std::vector<Bf16> RandomBf16(std::mt19937& rng, size_t count, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<Bf16> values(count);
  for (Bf16& value : values) value = __float2bfloat16(dist(rng));
  return values;
}

// Output buffers start as NaN so an element the kernel never writes fails the comparison.
inline std::vector<Bf16> NanBf16(size_t count) {
  return std::vector<Bf16>(count, __float2bfloat16(std::nanf("")));
}

inline std::vector<float> ToFloat(const std::vector<Bf16>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = __bfloat162float(values[i]);
  return out;
}

inline float ToFloat(float v) { return v; }
inline float ToFloat(Bf16 v) { return __bfloat162float(v); }

// Every element i must satisfy |got[i] - want[i]| <= bound(i) (NaN fails); the first mismatches
// are listed as [i / cols, i % cols].
template <typename T>
::testing::AssertionResult AllWithin(const std::string& name, const std::vector<T>& got,
                                     const std::vector<float>& want, int cols,
                                     const std::function<float(size_t)>& bound) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << name << ": size " << got.size() << " != " << want.size();
  }
  constexpr int kShown = 10;
  size_t mismatches = 0;
  std::string shown;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = ToFloat(got[i]);
    const float error = std::fabs(g - want[i]);
    if (!(error <= bound(i))) {
      if (++mismatches <= kShown) {
        absl::StrAppend(&shown, "\n  [", i / cols, ", ", i % cols, "] got ", g, " want ", want[i],
                        " (err ", error, " bound ", bound(i), ")");
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": " << mismatches << " of " << got.size()
                                       << " elements out of bounds; first mismatches:" << shown;
}

// |got - want| <= atol + rtol * |want| for every element.
template <typename T>
::testing::AssertionResult AllClose(const std::string& name, const std::vector<T>& got,
                                    const std::vector<float>& want, int cols, float rtol,
                                    float atol) {
  return AllWithin(name, got, want, cols,
                   [&](size_t i) { return atol + rtol * std::fabs(want[i]); });
}

// Fixture base: skips without a GPU, seeds a fresh RNG per test and prints the seed on failure.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    const uint32_t seed = std::random_device{}();
    rng_.seed(seed);
    seed_trace_ = std::make_unique<::testing::ScopedTrace>(__FILE__, __LINE__,
                                                           absl::StrCat("random seed ", seed));
  }
  std::mt19937 rng_;
  std::unique_ptr<::testing::ScopedTrace> seed_trace_;
};

// Expects INVALID_ARGUMENT whose message contains `field`.
template <typename Params>
void ExpectInvalid(const Params& params, const std::string& field) {
  const absl::Status status = params.Check();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), std::string::npos) << status;
}

}  // namespace tandem::kernels::cuda::testing
