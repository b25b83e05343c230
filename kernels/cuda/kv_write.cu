#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kv_write.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Grid (token, K or V); threads stride over the row.
__global__ void WriteKernel(const __nv_bfloat16* k, int k_stride, const __nv_bfloat16* v,
                            int v_stride, const int64_t* slots, __nv_bfloat16* k_cache,
                            __nv_bfloat16* v_cache, int64_t pool_rows, int row_elements) {
  const int t = blockIdx.x;
  int64_t slot = slots[t];
  if (slot < 0) return;
  slot = min(slot, pool_rows - 1);
  const bool is_v = blockIdx.y == 1;
  const __nv_bfloat16* src =
      is_v ? v + static_cast<int64_t>(t) * v_stride : k + static_cast<int64_t>(t) * k_stride;
  __nv_bfloat16* dst = (is_v ? v_cache : k_cache) + slot * row_elements;
  for (int c = threadIdx.x; c < row_elements; c += blockDim.x) dst[c] = src[c];
}

}  // namespace

absl::Status KvWriteParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("KvWriteParams.", parts...));
  };
  if (tokens < 0) return bad("tokens must be >= 0, got ", tokens);
  if (row_elements <= 0) return bad("row_elements must be > 0, got ", row_elements);
  if (pool_rows <= 0) return bad("pool_rows must be > 0, got ", pool_rows);
  if (k_stride < row_elements) return bad("k_stride ", k_stride, " is below row_elements");
  if (v_stride < row_elements) return bad("v_stride ", v_stride, " is below row_elements");
  if (tokens == 0) return absl::OkStatus();
  if (k == nullptr) return bad("k is null");
  if (v == nullptr) return bad("v is null");
  if (slots == nullptr) return bad("slots is null");
  if (k_cache == nullptr) return bad("k_cache is null");
  if (v_cache == nullptr) return bad("v_cache is null");
  if (k_cache == v_cache) return bad("v_cache is k_cache");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const KvWriteParams& /*params*/) { return 0; }

absl::Status Invoke(const KvWriteParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.tokens == 0) return absl::OkStatus();
  const int threads = std::min(kThreads, internal::CeilDiv(params.row_elements, 32) * 32);
  const dim3 grid(params.tokens, 2);
  WriteKernel<<<grid, threads, 0, stream>>>(params.k, params.k_stride, params.v, params.v_stride,
                                            params.slots, params.k_cache, params.v_cache,
                                            params.pool_rows, params.row_elements);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
