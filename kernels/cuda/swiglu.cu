#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/swiglu.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Grid (rows, column blocks): consecutive threads take consecutive columns of one row, so the
// gate and up reads and the out write are each coalesced.
__global__ void SwiGluKernel(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int inter) {
  internal::LetDependentsStart();  // the down projection may start streaming its weights
  const int r = blockIdx.x;
  const int i = blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= inter) return;
  const __nv_bfloat16* row = gate_up + static_cast<size_t>(r) * 2 * inter;
  const float g = __bfloat162float(row[i]);
  const float u = __bfloat162float(row[inter + i]);
  // expf, not __expf: for very negative g, exp(-g) overflows to inf and silu is -0, as on CPU.
  out[static_cast<size_t>(r) * inter + i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
}

}  // namespace

absl::Status SwiGluParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("SwiGluParams.", parts...));
  };
  if (rows < 0) return bad("rows must be >= 0, got ", rows);
  if (inter <= 0) return bad("inter must be > 0, got ", inter);
  if (inter > 65535 * 256) return bad("inter must be <= ", 65535 * 256, ", got ", inter);
  if (rows == 0) return absl::OkStatus();
  if (gate_up == nullptr) return bad("gate_up is null");
  if (out == nullptr) return bad("out is null");
  const size_t in_bytes = static_cast<size_t>(rows) * 2 * inter * sizeof(__nv_bfloat16);
  const size_t out_bytes = static_cast<size_t>(rows) * inter * sizeof(__nv_bfloat16);
  if (internal::Overlap(gate_up, in_bytes, out, out_bytes)) return bad("out overlaps gate_up");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const SwiGluParams& /*params*/) { return 0; }

absl::Status Invoke(const SwiGluParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.rows == 0) return absl::OkStatus();
  const int threads = std::min(kThreads, internal::CeilDiv(params.inter, 32) * 32);
  const dim3 grid(params.rows, internal::CeilDiv(params.inter, threads));
  SwiGluKernel<<<grid, threads, 0, stream>>>(params.gate_up, params.out, params.inter);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
