#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::Aligned;
using internal::Overlap;

constexpr int kThreads = 256;
// 8 bf16 = 16 bytes: one vector load/store per thread when every row start is 16-byte aligned.
constexpr int kWidth = 8;

// One CTA per token; threads stride over the row's packs (kPack elements each).
template <typename Pack, int kPack>
__global__ void GatherKernel(const int32_t* ids, const __nv_bfloat16* table, __nv_bfloat16* out,
                             int vocab, int hidden, int out_stride) {
  internal::LetDependentsStart();  // the LM head may start streaming its weights
  const int t = blockIdx.x;
  // Clamped: a bad id must not read outside the table (the host is expected to reject it).
  const int id = min(max(ids[t], 0), vocab - 1);
  const auto* src = reinterpret_cast<const Pack*>(table + static_cast<size_t>(id) * hidden);
  auto* dst = reinterpret_cast<Pack*>(out + static_cast<size_t>(t) * out_stride);
  for (int i = threadIdx.x; i < hidden / kPack; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

absl::Status EmbeddingParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("EmbeddingParams.", parts...));
  };
  if (tokens < 0) return bad("tokens must be >= 0, got ", tokens);
  if (vocab <= 0) return bad("vocab must be > 0, got ", vocab);
  if (hidden <= 0) return bad("hidden must be > 0, got ", hidden);
  if (out_stride < hidden) return bad("out_stride ", out_stride, " is below hidden ", hidden);
  if (tokens == 0) return absl::OkStatus();
  if (ids == nullptr) return bad("ids is null");
  if (table == nullptr) return bad("table is null");
  if (out == nullptr) return bad("out is null");
  const size_t out_bytes =
      (static_cast<size_t>(tokens - 1) * out_stride + hidden) * sizeof(__nv_bfloat16);
  const size_t table_bytes = static_cast<size_t>(vocab) * hidden * sizeof(__nv_bfloat16);
  if (Overlap(out, out_bytes, table, table_bytes)) return bad("out overlaps table");
  return absl::OkStatus();
}

absl::Status CheckTokenIds(std::span<const int32_t> ids, int vocab) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", ids[i], " at index ", i, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

size_t WorkspaceBytes(const EmbeddingParams& /*params*/) { return 0; }

absl::Status Invoke(const EmbeddingParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.tokens == 0) return absl::OkStatus();
  const bool vectorized = params.hidden % kWidth == 0 && params.out_stride % kWidth == 0 &&
                          Aligned(params.table, 16) && Aligned(params.out, 16);
  if (vectorized) {
    const int threads = std::min(kThreads, internal::CeilDiv(params.hidden / kWidth, 32) * 32);
    GatherKernel<uint4, kWidth><<<params.tokens, threads, 0, stream>>>(
        params.ids, params.table, params.out, params.vocab, params.hidden, params.out_stride);
  } else {
    const int threads = std::min(kThreads, internal::CeilDiv(params.hidden, 32) * 32);
    GatherKernel<__nv_bfloat16, 1><<<params.tokens, threads, 0, stream>>>(
        params.ids, params.table, params.out, params.vocab, params.hidden, params.out_stride);
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
