#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fill.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

// A grid-stride loop: each thread writes elements i, i + stride, ... (coalesced per warp).
__global__ void FillUniformKernel(__nv_bfloat16* data, size_t count, uint64_t seed,
                                  float half_width) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    data[i] = __float2bfloat16(half_width * (2.0f * FillUniformUnit(seed, i) - 1.0f));
  }
}

}  // namespace

absl::Status FillUniformParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("FillUniformParams.", parts...));
  };
  if (!std::isfinite(half_width) || half_width < 0.0f) {
    return bad("half_width must be finite and >= 0, got ", half_width);
  }
  if (count > 0 && data == nullptr) return bad("data is null");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const FillUniformParams& /*params*/) { return 0; }

absl::Status Invoke(const FillUniformParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.count == 0) return absl::OkStatus();
  const size_t wanted = (params.count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(std::min<size_t>(wanted, kMaxBlocks));
  FillUniformKernel<<<blocks, kThreads, 0, stream>>>(params.data, params.count, params.seed,
                                                     params.half_width);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
