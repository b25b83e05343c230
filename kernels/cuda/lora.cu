#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/lora.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::kWarpSize;

constexpr int kThreads = 256;
constexpr int kMaxRank = 256;

// low[t, r] = A[r, :] · x[t, :] for gated tokens; one CTA per token, a warp per rank row.
__global__ void DownKernel(const __nv_bfloat16* x, int x_stride, const __nv_bfloat16* a,
                           const uint8_t* gate, int in_dim, int rank, float* low) {
  const int t = blockIdx.x;
  if (!gate[t]) return;
  const __nv_bfloat16* row = x + static_cast<size_t>(t) * x_stride;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int r = warp; r < rank; r += blockDim.x / kWarpSize) {
    const __nv_bfloat16* a_row = a + static_cast<size_t>(r) * in_dim;
    float dot = 0.0f;
    for (int i = lane; i < in_dim; i += kWarpSize) {
      dot += __bfloat162float(a_row[i]) * __bfloat162float(row[i]);
    }
    dot = internal::WarpSum(dot);
    if (lane == 0) low[static_cast<size_t>(t) * rank + r] = dot;
  }
}

// y[t, o] += scale * B[o, :] · low[t, :] for gated tokens; grid (tokens, column blocks).
__global__ void UpKernel(const float* low, const __nv_bfloat16* b, const uint8_t* gate, float scale,
                         int out_dim, int rank, __nv_bfloat16* y, int y_stride) {
  __shared__ float low_shared[kMaxRank];
  const int t = blockIdx.x;
  if (!gate[t]) return;
  for (int r = threadIdx.x; r < rank; r += blockDim.x) {
    low_shared[r] = low[static_cast<size_t>(t) * rank + r];
  }
  __syncthreads();
  const int o = blockIdx.y * blockDim.x + threadIdx.x;
  if (o >= out_dim) return;
  const __nv_bfloat16* b_row = b + static_cast<size_t>(o) * rank;
  float delta = 0.0f;
  for (int r = 0; r < rank; ++r) delta += __bfloat162float(b_row[r]) * low_shared[r];
  __nv_bfloat16* at = y + static_cast<size_t>(t) * y_stride + o;
  *at = __float2bfloat16(__bfloat162float(*at) + scale * delta);
}

}  // namespace

absl::Status LoraParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("LoraParams.", parts...));
  };
  if (tokens < 0) return bad("tokens must be >= 0, got ", tokens);
  if (in_dim <= 0) return bad("in_dim must be > 0, got ", in_dim);
  if (out_dim <= 0 || out_dim > 65535 * kThreads) {
    return bad("out_dim must be in [1, ", 65535 * kThreads, "], got ", out_dim);
  }
  if (rank <= 0 || rank > kMaxRank) return bad("rank must be in [1, ", kMaxRank, "], got ", rank);
  if (x_stride < in_dim) return bad("x_stride ", x_stride, " is below in_dim ", in_dim);
  if (y_stride < out_dim) return bad("y_stride ", y_stride, " is below out_dim ", out_dim);
  if (!std::isfinite(scale)) return bad("scale must be finite");
  const size_t needed = WorkspaceBytes(*this);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return bad("workspace: ", needed, " bytes required, got ", workspace_bytes,
               workspace == nullptr ? " at null" : "");
  }
  if (tokens == 0) return absl::OkStatus();
  if (x == nullptr) return bad("x is null");
  if (a == nullptr) return bad("a is null");
  if (b == nullptr) return bad("b is null");
  if (gate == nullptr) return bad("gate is null");
  if (y == nullptr) return bad("y is null");
  const size_t y_bytes =
      (static_cast<size_t>(tokens - 1) * y_stride + out_dim) * sizeof(__nv_bfloat16);
  const size_t x_bytes =
      (static_cast<size_t>(tokens - 1) * x_stride + in_dim) * sizeof(__nv_bfloat16);
  if (internal::Overlap(y, y_bytes, x, x_bytes)) return bad("y overlaps x");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const LoraParams& params) {
  if (params.tokens <= 0 || params.rank <= 0) return 0;
  return static_cast<size_t>(params.tokens) * params.rank * sizeof(float);
}

absl::Status Invoke(const LoraParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.tokens == 0) return absl::OkStatus();
  float* low = static_cast<float*>(params.workspace);
  DownKernel<<<params.tokens, kThreads, 0, stream>>>(params.x, params.x_stride, params.a,
                                                     params.gate, params.in_dim, params.rank, low);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const int threads = std::min(kThreads, internal::CeilDiv(params.out_dim, 32) * 32);
  const dim3 grid(params.tokens, internal::CeilDiv(params.out_dim, threads));
  UpKernel<<<grid, threads, 0, stream>>>(low, params.b, params.gate, params.scale, params.out_dim,
                                         params.rank, params.y, params.y_stride);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
