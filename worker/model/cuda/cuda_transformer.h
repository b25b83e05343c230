// The CUDA backend of Transformer (Transformer::UseDevice({Device::kCuda})): the same forward
// as worker/model/transformer.cc, run with the kernels/cuda ops in bf16 with fp32 accumulation.
//
//   - Weights: the model's fp32 host weights rounded to bf16 and uploaded once (norm weights
//     too); q/k/v and gate/up stay fused in memory. The LoRA adapter is uploaded before the
//     first forward after Transformer::SetLoraAdapter.
//   - KV: CudaKvStorage pools (bf16, GPU) behind the host KvCache's block tables.
//   - A step: queued KV commits are flushed, the batch's tokens, positions, KV slots, attention
//     extends (visibility, block tables, explicit masks), LoRA gates and output rows are
//     uploaded, the layer loop runs on one stream with one workspace, and the fp32 logits of
//     the requested outputs (and the hidden-state taps, as fp32) come back to the host.
//     Per layer: the q/k/v projection (one product into fused rows), q/k RMSNorm (Qwen3), RoPE
//     and the new K/V rows written to the paged pools (one launch), paged attention, o
//     projection, residual add fused with RMSNorm, gate/up,
//     SwiGLU, down, residual add fused with the next RMSNorm; gated LoRA deltas after each
//     projection. The last layer's add is fused with the final norm; the output rows are
//     gathered (the embedding gather over the normed rows) and projected to fp32 logits.
//   - Sampling: when extends carry sample requests, the kernels/cuda sampler runs on the
//     device logits after the forward (after the graph replay on the graph path: the graphs
//     hold the forward only, and the per-row settings are uploaded for each launch), over the
//     output rows from the first sampled row to the last (rows in between without a request
//     get a greedy setting and their token is dropped); only the token ids come back. When a
//     request carries a draft the kernels/cuda verifier runs over that span instead (plain
//     requests are its draft-less rows) and the accepted flags come back with the tokens. The
//     vocabulary-sized workspace has a row per non-greedy request only (greedy rows take an
//     argmax in place). Logits are downloaded only for the extends with return_logits, each
//     straight into its output.
//   - Uploads: every per-step host-to-device copy is staged in page-locked memory (see
//     staging_), so the copies are truly asynchronous.
//   - CUDA graphs: a decode step (every extend one token that sees itself, one output, no LoRA
//     gate, no hidden taps, static RoPE) runs as a graph captured per (batch-size bucket,
//     attention splits), buckets kGraphBuckets extends; the batch is padded to its bucket
//     (padding rows write no KV and their logits are dropped). Inputs are uploaded into the
//     graphs' fixed buffers before each replay. Other steps, and every step with graphs off,
//     launch eagerly.
//
// Numerics: bf16 weights, activations, residual stream and KV; fp32 accumulation, softmax and
// logits. Results match the CPU forward within bf16 rounding, not bit for bit.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/verify.cuh"
#include "worker/model/backend.h"
#include "worker/model/cuda/cuda_kv_storage.h"
#include "worker/model/cuda/device_array.h"
#include "worker/model/cuda/pinned_staging.h"
#include "worker/model/device.h"

namespace tandem {

class Transformer;

class CudaTransformer final : public ModelBackend {
 public:
  static constexpr std::array<int, 7> kGraphBuckets = {1, 2, 4, 8, 16, 32, 64};

  // Uploads `model`'s weights; `model` must outlive the backend.
  static absl::StatusOr<std::unique_ptr<CudaTransformer>> Create(const Transformer* model,
                                                                 const DeviceOptions& options);
  ~CudaTransformer() override;

  absl::StatusOr<std::vector<ExtendOutput>> Forward(std::span<const Extend> batch,
                                                    KvCache& kv) override;
  KvStorageFactory StorageFactory() override;
  bool OwnsStorage(const KvCache& kv) const override;
  void LoraChanged() override { lora_dirty_ = true; }

  struct Stats {
    int64_t eager_steps = 0;
    int64_t graph_replays = 0;
    int64_t graphs_captured = 0;
  };
  const Stats& stats() const { return stats_; }
  bool graphs_enabled() const { return graphs_; }
  void set_graphs_enabled(bool enabled) { graphs_ = enabled; }

  // The bucket a decode step of `extends` extends runs in; 0 when above every bucket.
  static int GraphBucket(int extends);

  // The device embedding table and LM head, bf16 [vocab, hidden] (the head is the table when
  // tied), for models that share them (the DFlash drafter); valid while the backend lives.
  const __nv_bfloat16* device_embed() const { return embed_.get(); }
  const __nv_bfloat16* device_head() const { return head_ptr_; }

 private:
  using Bf16 = __nv_bfloat16;

  struct DeviceLayer {
    cuda_backend::DeviceArray<Bf16> input_norm, qkv, qkv_bias, q_norm, k_norm, o, o_bias, post_norm,
        gate_up, gate_up_bias, down, down_bias;
  };
  struct DeviceLora {
    int rank = 0;
    cuda_backend::DeviceArray<Bf16> a, b;
  };

  // A step's inputs on the host, in the layout the device buffers take.
  struct StepInputs {
    int tokens = 0;
    std::vector<int> extend_offsets, extend_tokens;  // per batch extend
    std::vector<int32_t> ids, positions;
    std::vector<int64_t> slots;
    std::vector<uint8_t> gate;
    bool any_gate = false;
    std::vector<kernels::cuda::AttentionExtend> extends;  // extends with tokens only
    std::vector<int32_t> tables;
    std::vector<uint64_t> masks;
    std::vector<int32_t> out_rows;
    int max_kv_len = 0;
    std::vector<std::vector<float>> inv_freq;  // dynamic RoPE: per batch extend
    std::vector<float> rope_scaling;           // dynamic RoPE: per batch extend
  };

  // Device buffers of a step.
  struct StepBuffers {
    cuda_backend::DeviceArray<int32_t> ids, positions, tables, out_rows;
    cuda_backend::DeviceArray<int64_t> slots;
    cuda_backend::DeviceArray<uint8_t> gate;
    cuda_backend::DeviceArray<kernels::cuda::AttentionExtend> extends;
    cuda_backend::DeviceArray<uint64_t> masks;
    cuda_backend::DeviceArray<float> inv_freq;
    cuda_backend::DeviceArray<Bf16> x, h, qkv, attn, proj, gate_up, act, gathered;
    cuda_backend::DeviceArray<float> logits;
    cuda_backend::DeviceArray<char> workspace;
    int token_capacity = 0;  // rows of the activation buffers
  };

  // The device sampler's and verifier's buffers, shared by the eager and graph paths (they run
  // outside the graphs).
  struct SampleBuffers {
    cuda_backend::DeviceArray<kernels::cuda::SamplingRow> rows;       // [span rows]
    cuda_backend::DeviceArray<kernels::cuda::VerifyRow> verify_rows;  // [span rows]
    cuda_backend::DeviceArray<int32_t> tokens;                        // [span rows]
    cuda_backend::DeviceArray<uint8_t> accepted;                      // [span rows]
    cuda_backend::DeviceArray<char> workspace;  // [non-greedy rows, vocab] fp32
  };

  CudaTransformer(const Transformer* model, const DeviceOptions& options);
  absl::Status Init();
  absl::Status UploadLora();

  StepInputs Plan(std::span<const Extend> batch, const KvCache& kv) const;
  bool DecodeStep(std::span<const Extend> batch) const;
  absl::Status Reserve(StepBuffers& b, const StepInputs& in, size_t workspace_bytes) const;
  absl::Status Upload(StepBuffers& b, const StepInputs& in);
  // Enqueues the upload of `count` elements of `host` into `dst` (count <= dst.size()) through
  // the step's page-locked staging; `host` may change once this returns.
  template <typename T>
  absl::Status StageUpload(cuda_backend::DeviceArray<T>& dst, const T* host, size_t count);
  // Rewinds the staging arena for a new step (see staging_).
  absl::Status BeginStaging();
  kernels::cuda::PagedAttentionParams AttentionParams(const StepBuffers& b, const StepInputs& in,
                                                      const cuda_backend::CudaKvStorage& kv,
                                                      int splits) const;
  size_t WorkspaceBytes(const StepInputs& in, int splits) const;
  // Enqueues the forward of `in` (uploaded to `b`) on the stream. `taps` (eager only): layers
  // whose residual stream is copied to (*tapped)[layer].
  absl::Status Enqueue(StepBuffers& b, const StepInputs& in, cuda_backend::CudaKvStorage& kv,
                       int splits, const std::vector<bool>* taps,
                       std::vector<std::vector<Bf16>>* tapped);
  absl::Status Gemm(const Bf16* x, int ldx, const Bf16* w, const Bf16* bias, void* y, int ldy,
                    bool fp32_out, int m, int n, int k, StepBuffers& b);
  absl::Status Lora(int layer, int target, const Bf16* x, int x_stride, int in_dim, Bf16* y,
                    int y_stride, int tokens, StepBuffers& b);

  absl::StatusOr<std::vector<ExtendOutput>> RunEager(std::span<const Extend> batch,
                                                     const StepInputs& in,
                                                     cuda_backend::CudaKvStorage& kv);
  absl::StatusOr<std::vector<ExtendOutput>> RunGraph(std::span<const Extend> batch, StepInputs in,
                                                     cuda_backend::CudaKvStorage& kv);
  void DropGraphs();
  // The contiguous span [first, last) of output rows (extends' rows in batch order) that have
  // sampling requests, every row in it with a setting (rows without a request sample greedily
  // and are dropped); `sampled` rows are not greedy and get workspace rows; `verify` when some
  // request carries a draft. first < 0: no request.
  struct SampleSpan {
    int first = -1, last = -1;
    bool verify = false;
    int sampled = 0;
    std::vector<kernels::cuda::VerifyRow> settings;
  };
  static SampleSpan PlanSampleSpan(std::span<const Extend> batch);
  // Enqueues the sampling (or, with drafts, verify) kernel over the span and the downloads of
  // its tokens (and accepted flags) into `tokens` / `accepted`, valid after the stream's sync.
  absl::Status LaunchSampling(const SampleSpan& span, const float* logits,
                              std::vector<int32_t>& tokens, std::vector<uint8_t>& accepted);
  // After a forward whose output rows' fp32 logits are `logits` ([rows, vocab] on the device,
  // extends' rows in batch order): samples (or, for requests with drafts, verifies) the rows
  // that have requests, downloads their tokens (and accepted flags) and the logits of the
  // extends with return_logits into `outputs`, and waits for the stream.
  absl::Status Collect(std::span<const Extend> batch, const float* logits,
                       std::vector<ExtendOutput>& outputs);

  const Transformer* model_;
  bool graphs_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda_backend::DeviceArray<Bf16> embed_, head_, final_norm_;
  const Bf16* head_ptr_ = nullptr;  // head_, or embed_ when tied
  std::vector<DeviceLayer> layers_;
  cuda_backend::DeviceArray<float> inv_freq_;
  float rope_scaling_ = 1.0f;
  bool dynamic_rope_ = false;
  // LoRA: [layer][LoraTarget]; rank 0 = none.
  std::vector<std::array<DeviceLora, 7>> lora_;
  float lora_scale_ = 1.0f;
  bool lora_dirty_ = true;
  bool has_lora_ = false;

  SampleBuffers sampling_;
  // Page-locked staging of every per-step host-to-device copy (inputs, block tables, masks,
  // sampling settings), so cudaMemcpyAsync really is asynchronous. One arena serves every step:
  // Collect ends each step with a stream synchronisation, after which no copy of that step is in
  // flight, so the next step may rewrite the arena. The graph path is no different: its uploads
  // are stream-ordered copies into the graphs' fixed device buffers made before the launch, and
  // the graphs themselves never read host memory. A step that fails after staging and before
  // that synchronisation leaves staging_in_flight_ set, and BeginStaging then waits for the
  // stream before reusing the arena.
  cuda_backend::PinnedStaging staging_;
  bool staging_in_flight_ = false;
  StepBuffers eager_;
  StepBuffers graph_buffers_;      // fixed while graphs exist
  int graph_table_width_ = 0;      // block table entries per extend in graph_buffers_
  uint64_t graph_storage_id_ = 0;  // CudaKvStorage::id() of the pools the graphs read
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_by_key_;  // (bucket, splits)
  Stats stats_;
};

// A member template: defined here for both of the class's source files.
template <typename T>
absl::Status CudaTransformer::StageUpload(cuda_backend::DeviceArray<T>& dst, const T* host,
                                          size_t count) {
  if (count == 0) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(const void* staged, staging_.Stage(host, count * sizeof(T)));
  staging_in_flight_ = true;
  return dst.UploadAsync(static_cast<const T*>(staged), count, stream_);
}

}  // namespace tandem
