#include "worker/model/cuda/cuda_transformer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/lora.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "worker/model/cuda/layer_ops.h"
#include "worker/model/transformer.h"

namespace tandem {

namespace kcu = kernels::cuda;
using cuda_backend::CudaKvStorage;
using cuda_backend::DeviceArray;
using cuda_backend::UploadBf16;

namespace {

constexpr int kMaxGraphTokens = CudaTransformer::kGraphBuckets.back();
// The largest split count AttentionSplits' heuristic picks; graph buffers are sized for it.
constexpr int kMaxGraphSplits = 16;

const __nv_bfloat16* OrNull(const DeviceArray<__nv_bfloat16>& a, const std::vector<float>& host) {
  return host.empty() ? nullptr : a.get();
}

kcu::AttentionVisibility ToKernel(Visibility::Kind kind) {
  switch (kind) {
    case Visibility::Kind::kCausal:
      return kcu::AttentionVisibility::kCausal;
    case Visibility::Kind::kFull:
      return kcu::AttentionVisibility::kFull;
    case Visibility::Kind::kBlock:
      return kcu::AttentionVisibility::kBlock;
    case Visibility::Kind::kExplicit:
      return kcu::AttentionVisibility::kExplicit;
  }
  return kcu::AttentionVisibility::kCausal;
}

}  // namespace

int CudaTransformer::GraphBucket(int extends) {
  for (int bucket : kGraphBuckets) {
    if (extends <= bucket) return bucket;
  }
  return 0;
}

CudaTransformer::CudaTransformer(const Transformer* model, const DeviceOptions& options)
    : model_(model), graphs_(options.cuda_graphs) {}

CudaTransformer::~CudaTransformer() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  DropGraphs();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaTransformer::DropGraphs() {
  for (auto& [key, exec] : graphs_by_key_) cudaGraphExecDestroy(exec);
  graphs_by_key_.clear();
}

absl::StatusOr<std::unique_ptr<CudaTransformer>> CudaTransformer::Create(
    const Transformer* model, const DeviceOptions& options) {
  std::unique_ptr<CudaTransformer> backend(new CudaTransformer(model, options));
  TANDEM_RETURN_IF_ERROR(backend->Init());
  return backend;
}

absl::Status CudaTransformer::Init() {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TANDEM_RETURN_IF_ERROR(kcu::CublasStatusToStatus(cublasCreate(&cublas_), "cublasCreate"));
  // The host matrices are packed for the CPU: each comes back row-major for its upload.
  // An untied model keeps its embedding rows: uploaded from there, not from a copy.
  const std::vector<float> unpacked_embed =
      w.embed.empty() ? w.EmbedRowMajor() : std::vector<float>();
  TANDEM_RETURN_IF_ERROR(UploadBf16(embed_, w.embed.empty() ? unpacked_embed : w.embed));
  head_ptr_ = embed_.get();
  if (const std::vector<float> head = w.HeadRowMajor(); !head.empty()) {
    TANDEM_RETURN_IF_ERROR(UploadBf16(head_, head));
    head_ptr_ = head_.get();
  }
  TANDEM_RETURN_IF_ERROR(UploadBf16(final_norm_, w.final_norm));
  layers_.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights h = w.RowMajorLayer(static_cast<int>(l));
    DeviceLayer& d = layers_[l];
    const std::pair<DeviceArray<Bf16>*, const std::vector<float>*> parts[] = {
        {&d.input_norm, &h.input_norm},
        {&d.qkv, &h.qkv},
        {&d.qkv_bias, &h.qkv_bias},
        {&d.q_norm, &h.q_norm},
        {&d.k_norm, &h.k_norm},
        {&d.o, &h.o},
        {&d.o_bias, &h.o_bias},
        {&d.post_norm, &h.post_norm},
        {&d.gate_up, &h.gate_up},
        {&d.gate_up_bias, &h.gate_up_bias},
        {&d.down, &h.down},
        {&d.down_bias, &h.down_bias}};
    for (const auto& [device, host] : parts) {
      if (!host->empty()) TANDEM_RETURN_IF_ERROR(UploadBf16(*device, *host));
    }
  }
  RopeTables rope = ComputeRope(c);
  TANDEM_RETURN_IF_ERROR(inv_freq_.Upload(rope.inv_freq.data(), rope.inv_freq.size()));
  rope_scaling_ = rope.attention_scaling;
  dynamic_rope_ = c.rope_scaling.kind == RopeScaling::Kind::kDynamic;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status CudaTransformer::UploadLora() {
  lora_.clear();
  has_lora_ = false;
  const std::optional<LoraAdapter>& adapter = model_->lora();
  if (adapter.has_value()) {
    lora_scale_ = adapter->scale;
    lora_.resize(adapter->layers.size());
    for (size_t l = 0; l < adapter->layers.size(); ++l) {
      for (const auto& [target, pair] : adapter->layers[l]) {
        DeviceLora& d = lora_[l][static_cast<int>(target)];
        d.rank = pair.rank;
        TANDEM_RETURN_IF_ERROR(UploadBf16(d.a, pair.a));
        TANDEM_RETURN_IF_ERROR(UploadBf16(d.b, pair.b));
        has_lora_ = true;
      }
    }
  }
  lora_dirty_ = false;
  return absl::OkStatus();
}

KvStorageFactory CudaTransformer::StorageFactory() {
  return [this](const KvCacheOptions& options) -> std::unique_ptr<KvStorage> {
    return CudaKvStorage::Create(options, stream_, this);
  };
}

bool CudaTransformer::OwnsStorage(const KvCache& kv) const {
  const auto* storage = dynamic_cast<const CudaKvStorage*>(&kv.storage());
  return storage != nullptr && storage->owner() == this;
}

CudaTransformer::StepInputs CudaTransformer::Plan(std::span<const Extend> batch,
                                                  const KvCache& kv) const {
  const ModelConfig& c = model_->config();
  const int block_size = kv.options().block_size;
  StepInputs in;
  for (const Extend& x : batch) {
    const int n = static_cast<int>(x.tokens.size());
    const int context = kv.CommittedLength(x.seq);
    const std::span<const int32_t> table = kv.BlockTable(x.seq);
    const int offset = in.tokens;
    in.ids.insert(in.ids.end(), x.tokens.begin(), x.tokens.end());
    in.positions.insert(in.positions.end(), x.positions.begin(), x.positions.end());
    for (int i = 0; i < n; ++i) {
      const int slot = context + i;
      in.slots.push_back(static_cast<int64_t>(table[slot / block_size]) * block_size +
                         slot % block_size);
      const bool gated = !x.lora_gate.empty() && x.lora_gate[i] != 0;
      in.gate.push_back(gated ? 1 : 0);
      in.any_gate = in.any_gate || gated;
    }
    for (int32_t o : x.outputs) in.out_rows.push_back(offset + o);
    if (dynamic_rope_) {
      int max_pos = context;
      for (int32_t p : x.positions) max_pos = std::max(max_pos, p + 1);
      RopeTables t = ComputeRope(c, max_pos);
      in.inv_freq.push_back(std::move(t.inv_freq));
      in.rope_scaling.push_back(t.attention_scaling);
    }
    in.extend_offsets.push_back(offset);
    in.extend_tokens.push_back(n);
    in.tokens += n;
    if (n == 0) continue;
    kcu::AttentionExtend a;
    a.token_offset = offset;
    a.new_tokens = n;
    a.context_len = context;
    a.visibility = ToKernel(x.visible.kind);
    a.visibility_block = x.visible.block_size;
    a.block_table_offset = static_cast<int32_t>(in.tables.size());
    in.tables.insert(in.tables.end(), table.begin(), table.end());
    if (x.visible.kind == Visibility::Kind::kExplicit) {
      a.mask_offset = static_cast<int64_t>(in.masks.size());
      in.masks.insert(in.masks.end(), x.visible.bits.begin(), x.visible.bits.end());
    }
    in.extends.push_back(a);
    in.max_kv_len = std::max(in.max_kv_len, context + n);
  }
  return in;
}

bool CudaTransformer::DecodeStep(std::span<const Extend> batch) const {
  if (!graphs_ || dynamic_rope_ || batch.empty() ||
      GraphBucket(static_cast<int>(batch.size())) == 0) {
    return false;
  }
  for (const Extend& x : batch) {
    if (x.tokens.size() != 1 || x.outputs.size() != 1 || !x.hidden_layers.empty()) return false;
    if (!x.lora_gate.empty() && x.lora_gate[0] != 0) return false;
    if (!x.visible.Sees(0, 0)) return false;
  }
  return true;
}

kcu::PagedAttentionParams CudaTransformer::AttentionParams(const StepBuffers& b,
                                                           const StepInputs& in,
                                                           const CudaKvStorage& kv,
                                                           int splits) const {
  const ModelConfig& c = model_->config();
  kcu::PagedAttentionParams p;
  p.k_cache = kv.keys(0);
  p.v_cache = kv.values(0);
  p.block_tables = b.tables.get();
  p.block_size = kv.block_size();
  p.extends = b.extends.get();
  p.num_extends = static_cast<int>(in.extends.size());
  p.masks = in.masks.empty() ? nullptr : b.masks.get();
  p.total_tokens = in.tokens;
  p.q_heads = c.num_heads;
  p.kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  p.window = c.sliding_window;
  p.max_kv_len = in.max_kv_len;
  p.num_splits = splits;
  p.out = b.attn.get();
  p.out_stride = c.num_heads * c.head_dim;
  return p;
}

size_t CudaTransformer::WorkspaceBytes(const StepInputs& in, int splits) const {
  const ModelConfig& c = model_->config();
  size_t bytes = kcu::WorkspaceBytes(kcu::GemmParams{});
  kcu::PagedAttentionParams p;
  p.total_tokens = in.tokens;
  p.q_heads = c.num_heads;
  p.head_dim = c.head_dim;
  p.max_kv_len = in.max_kv_len;
  p.num_splits = splits;
  bytes = std::max(bytes, kcu::WorkspaceBytes(p));
  if (in.any_gate) {
    for (const auto& layer : lora_) {
      for (const DeviceLora& d : layer) {
        bytes = std::max(bytes, static_cast<size_t>(in.tokens) * d.rank * sizeof(float));
      }
    }
  }
  return bytes;
}

absl::Status CudaTransformer::Reserve(StepBuffers& b, const StepInputs& in,
                                      size_t workspace_bytes) const {
  const ModelConfig& c = model_->config();
  const size_t t = static_cast<size_t>(std::max(in.tokens, 1));
  const size_t hidden = c.hidden_size;
  const size_t qd = static_cast<size_t>(c.num_heads) * c.head_dim;
  const size_t kd = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  TANDEM_RETURN_IF_ERROR(b.ids.Reserve(t));
  TANDEM_RETURN_IF_ERROR(b.positions.Reserve(t));
  TANDEM_RETURN_IF_ERROR(b.slots.Reserve(t));
  TANDEM_RETURN_IF_ERROR(b.gate.Reserve(t));
  TANDEM_RETURN_IF_ERROR(b.tables.Reserve(in.tables.size()));
  TANDEM_RETURN_IF_ERROR(b.extends.Reserve(in.extends.size()));
  TANDEM_RETURN_IF_ERROR(b.masks.Reserve(in.masks.size()));
  TANDEM_RETURN_IF_ERROR(b.out_rows.Reserve(in.out_rows.size()));
  size_t freq = 0;
  for (const auto& f : in.inv_freq) freq += f.size();
  TANDEM_RETURN_IF_ERROR(b.inv_freq.Reserve(freq));
  if (static_cast<size_t>(b.token_capacity) < t) {
    // qkv holds the fused [t, q + 2 kv] projection, or [t, q] then [t, kv] twice.
    TANDEM_RETURN_IF_ERROR(b.x.Reserve(t * hidden));
    TANDEM_RETURN_IF_ERROR(b.h.Reserve(t * hidden));
    TANDEM_RETURN_IF_ERROR(b.qkv.Reserve(t * (qd + 2 * kd)));
    TANDEM_RETURN_IF_ERROR(b.attn.Reserve(t * qd));
    TANDEM_RETURN_IF_ERROR(b.proj.Reserve(t * hidden));
    TANDEM_RETURN_IF_ERROR(b.gate_up.Reserve(t * 2 * c.intermediate_size));
    TANDEM_RETURN_IF_ERROR(b.act.Reserve(t * c.intermediate_size));
    b.token_capacity = static_cast<int>(t);
  }
  const size_t m = std::max<size_t>(in.out_rows.size(), 1);
  TANDEM_RETURN_IF_ERROR(b.gathered.Reserve(m * hidden));
  TANDEM_RETURN_IF_ERROR(b.logits.Reserve(m * static_cast<size_t>(c.vocab_size)));
  TANDEM_RETURN_IF_ERROR(b.workspace.Reserve(workspace_bytes));
  return absl::OkStatus();
}

absl::Status CudaTransformer::BeginStaging() {
  // Only a step that failed before Collect's synchronisation can leave copies in flight.
  if (staging_in_flight_) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    staging_in_flight_ = false;
  }
  return staging_.Reset();
}

absl::Status CudaTransformer::Upload(StepBuffers& b, const StepInputs& in) {
  TANDEM_RETURN_IF_ERROR(StageUpload(b.ids, in.ids.data(), in.ids.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.positions, in.positions.data(), in.positions.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.slots, in.slots.data(), in.slots.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.gate, in.gate.data(), in.gate.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.tables, in.tables.data(), in.tables.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.extends, in.extends.data(), in.extends.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.masks, in.masks.data(), in.masks.size()));
  TANDEM_RETURN_IF_ERROR(StageUpload(b.out_rows, in.out_rows.data(), in.out_rows.size()));
  std::vector<float> freq;
  for (const auto& f : in.inv_freq) freq.insert(freq.end(), f.begin(), f.end());
  TANDEM_RETURN_IF_ERROR(StageUpload(b.inv_freq, freq.data(), freq.size()));
  return absl::OkStatus();
}

absl::Status CudaTransformer::Gemm(const Bf16* x, int ldx, const Bf16* w, const Bf16* bias, void* y,
                                   int ldy, bool fp32_out, int m, int n, int k, StepBuffers& b) {
  return cuda_backend::LinearGemm(cublas_, b.workspace, stream_, x, ldx, w, bias, y, ldy, fp32_out,
                                  m, n, k);
}

absl::Status CudaTransformer::Lora(int layer, int target, const Bf16* x, int x_stride, int in_dim,
                                   Bf16* y, int y_stride, int tokens, StepBuffers& b) {
  if (layer >= static_cast<int>(lora_.size())) return absl::OkStatus();
  const DeviceLora& d = lora_[layer][target];
  if (d.rank == 0) return absl::OkStatus();
  kcu::LoraParams p;
  p.x = x;
  p.x_stride = x_stride;
  p.a = d.a.get();
  p.b = d.b.get();
  p.gate = b.gate.get();
  p.scale = lora_scale_;
  p.y = y;
  p.y_stride = y_stride;
  p.tokens = tokens;
  p.in_dim = in_dim;
  p.out_dim = static_cast<int>(d.b.size() / d.rank);
  p.rank = d.rank;
  p.workspace = b.workspace.get();
  p.workspace_bytes = b.workspace.bytes();
  return kcu::Invoke(p, stream_);
}

absl::Status CudaTransformer::Enqueue(StepBuffers& b, const StepInputs& in, CudaKvStorage& kv,
                                      int splits, const std::vector<bool>* taps,
                                      std::vector<std::vector<Bf16>>* tapped) {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  const int t = in.tokens, hidden = c.hidden_size, d = c.head_dim, hq = c.num_heads,
            hkv = c.num_kv_heads, inter = c.intermediate_size;
  const int qd = hq * d, kd = hkv * d, width = qd + 2 * kd;
  const bool lora = in.any_gate && has_lora_;

  auto tap = [&](int layer) -> absl::Status {
    if (taps == nullptr || !(*taps)[layer]) return absl::OkStatus();
    std::vector<Bf16>& dst = (*tapped)[layer];
    dst.resize(static_cast<size_t>(t) * hidden);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data(), b.x.get(), dst.size() * sizeof(Bf16),
                                                cudaMemcpyDeviceToHost, stream_));
    return absl::OkStatus();
  };
  auto norm = [&](const Bf16* x, Bf16* residual, const Bf16* weight, Bf16* y, int rows, int dim) {
    return cuda_backend::RmsNorm(stream_, c.rms_norm_eps, x, residual, weight, y, rows, dim);
  };

  {
    kcu::EmbeddingParams p;
    p.ids = b.ids.get();
    p.table = embed_.get();
    p.out = b.x.get();
    p.tokens = t;
    p.vocab = c.vocab_size;
    p.hidden = hidden;
    p.out_stride = hidden;
    TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
  }
  TANDEM_RETURN_IF_ERROR(tap(0));
  TANDEM_RETURN_IF_ERROR(
      norm(b.x.get(), nullptr, layers_[0].input_norm.get(), b.h.get(), t, hidden));

  // q, k and v of a token: one fused [t, width] row from one projection.
  Bf16* q = b.qkv.get();
  Bf16* k = q + qd;
  Bf16* v = q + qd + kd;
  const int q_stride = width;
  const int kv_stride = width;

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const DeviceLayer& L = layers_[layer];
    const LayerWeights& H = w.layers[layer];
    TANDEM_RETURN_IF_ERROR(Gemm(b.h.get(), hidden, L.qkv.get(), OrNull(L.qkv_bias, H.qkv_bias), q,
                                width, false, t, width, hidden, b));
    if (lora) {
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kQ), b.h.get(), hidden,
                                  hidden, q, q_stride, t, b));
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kK), b.h.get(), hidden,
                                  hidden, k, kv_stride, t, b));
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kV), b.h.get(), hidden,
                                  hidden, v, kv_stride, t, b));
    }
    // Qwen3's per-head q/k norms run inside the rotation's launch.
    const bool qk_norm = !H.q_norm.empty();
    auto rope = [&](int first, int tokens, const float* inv_freq, float scaling) {
      kcu::RopeParams p;
      p.q = q + static_cast<size_t>(first) * q_stride;
      p.q_stride = q_stride;
      p.q_heads = hq;
      p.k = k + static_cast<size_t>(first) * kv_stride;
      p.k_stride = kv_stride;
      p.k_heads = hkv;
      p.positions = b.positions.get() + first;
      p.inv_freq = inv_freq;
      p.attention_scaling = scaling;
      p.tokens = tokens;
      p.head_dim = d;
      if (qk_norm) {
        p.q_norm = L.q_norm.get();
        p.k_norm = L.k_norm.get();
        p.norm_eps = c.rms_norm_eps;
      }
      // The new rows' K and V go to the paged cache in the same launch.
      p.v = v + static_cast<size_t>(first) * kv_stride;
      p.v_stride = kv_stride;
      p.slots = b.slots.get() + first;
      p.k_cache = kv.keys(layer);
      p.v_cache = kv.values(layer);
      p.pool_rows = kv.pool_rows();
      return kcu::Invoke(p, stream_);
    };
    if (!dynamic_rope_) {
      TANDEM_RETURN_IF_ERROR(rope(0, t, inv_freq_.get(), rope_scaling_));
    } else {
      // One launch per extend with its own table (dynamic NTK depends on the length reached).
      size_t freq_offset = 0;
      for (size_t e = 0; e < in.inv_freq.size(); ++e) {
        if (in.extend_tokens[e] > 0) {
          TANDEM_RETURN_IF_ERROR(rope(in.extend_offsets[e], in.extend_tokens[e],
                                      b.inv_freq.get() + freq_offset, in.rope_scaling[e]));
        }
        freq_offset += in.inv_freq[e].size();
      }
    }
    {
      kcu::PagedAttentionParams p = AttentionParams(b, in, kv, splits);
      p.q = q;
      p.q_stride = q_stride;
      p.k_cache = kv.keys(layer);
      p.v_cache = kv.values(layer);
      p.workspace = b.workspace.get();
      p.workspace_bytes = b.workspace.bytes();
      TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
    }
    TANDEM_RETURN_IF_ERROR(Gemm(b.attn.get(), qd, L.o.get(), OrNull(L.o_bias, H.o_bias),
                                b.proj.get(), hidden, false, t, hidden, qd, b));
    if (lora) {
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kO), b.attn.get(), qd, qd,
                                  b.proj.get(), hidden, t, b));
    }
    TANDEM_RETURN_IF_ERROR(norm(b.proj.get(), b.x.get(), L.post_norm.get(), b.h.get(), t, hidden));
    TANDEM_RETURN_IF_ERROR(Gemm(b.h.get(), hidden, L.gate_up.get(),
                                OrNull(L.gate_up_bias, H.gate_up_bias), b.gate_up.get(), 2 * inter,
                                false, t, 2 * inter, hidden, b));
    if (lora) {
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kGate), b.h.get(), hidden,
                                  hidden, b.gate_up.get(), 2 * inter, t, b));
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kUp), b.h.get(), hidden,
                                  hidden, b.gate_up.get() + inter, 2 * inter, t, b));
    }
    {
      kcu::SwiGluParams p;
      p.gate_up = b.gate_up.get();
      p.out = b.act.get();
      p.rows = t;
      p.inter = inter;
      TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
    }
    TANDEM_RETURN_IF_ERROR(Gemm(b.act.get(), inter, L.down.get(), OrNull(L.down_bias, H.down_bias),
                                b.proj.get(), hidden, false, t, hidden, inter, b));
    if (lora) {
      TANDEM_RETURN_IF_ERROR(Lora(layer, static_cast<int>(LoraTarget::kDown), b.act.get(), inter,
                                  inter, b.proj.get(), hidden, t, b));
    }
    // Residual add fused with the next layer's input norm, or with the final norm.
    const bool last = layer + 1 == c.num_layers;
    const Bf16* next = last ? final_norm_.get() : layers_[layer + 1].input_norm.get();
    TANDEM_RETURN_IF_ERROR(norm(b.proj.get(), b.x.get(), next, b.h.get(), t, hidden));
    TANDEM_RETURN_IF_ERROR(tap(layer + 1));
  }

  const int m = static_cast<int>(in.out_rows.size());
  if (m == 0) return absl::OkStatus();
  {
    // The output rows of the final-normed activations, gathered contiguous.
    kcu::EmbeddingParams p;
    p.ids = b.out_rows.get();
    p.table = b.h.get();
    p.out = b.gathered.get();
    p.tokens = m;
    p.vocab = t;
    p.hidden = hidden;
    p.out_stride = hidden;
    TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
  }
  return Gemm(b.gathered.get(), hidden, head_ptr_, nullptr, b.logits.get(), c.vocab_size, true, m,
              c.vocab_size, hidden, b);
}

absl::StatusOr<std::vector<ExtendOutput>> CudaTransformer::RunEager(std::span<const Extend> batch,
                                                                    const StepInputs& in,
                                                                    CudaKvStorage& kv) {
  const ModelConfig& c = model_->config();
  const int hidden = c.hidden_size;
  const int splits = kcu::AttentionSplits(AttentionParams(eager_, in, kv, 0));
  TANDEM_RETURN_IF_ERROR(Reserve(eager_, in, WorkspaceBytes(in, splits)));
  TANDEM_RETURN_IF_ERROR(Upload(eager_, in));
  std::vector<bool> taps(c.num_layers + 1, false);
  for (const Extend& x : batch) {
    for (int32_t l : x.hidden_layers) taps[l] = true;
  }
  std::vector<std::vector<Bf16>> tapped(c.num_layers + 1);
  TANDEM_RETURN_IF_ERROR(Enqueue(eager_, in, kv, splits, &taps, &tapped));
  std::vector<ExtendOutput> outputs(batch.size());
  // Waits for the stream, so the taps' copies have landed too.
  TANDEM_RETURN_IF_ERROR(Collect(batch, eager_.logits.get(), outputs));
  ++stats_.eager_steps;

  for (size_t e = 0; e < batch.size(); ++e) {
    const Extend& x = batch[e];
    const size_t n = x.tokens.size();
    outputs[e].hidden.resize(x.hidden_layers.size() * n * hidden);
    const size_t first = static_cast<size_t>(in.extend_offsets[e]) * hidden;
    for (size_t j = 0; j < x.hidden_layers.size(); ++j) {
      const std::vector<Bf16>& src = tapped[x.hidden_layers[j]];
      float* dst = outputs[e].hidden.data() + j * n * hidden;
      for (size_t i = 0; i < n * hidden; ++i) dst[i] = __bfloat162float(src[first + i]);
    }
  }
  return outputs;
}

absl::StatusOr<std::vector<ExtendOutput>> CudaTransformer::RunGraph(std::span<const Extend> batch,
                                                                    StepInputs in,
                                                                    CudaKvStorage& kv) {
  const int real = static_cast<int>(batch.size());
  const int bucket = GraphBucket(real);
  // The split count the eager path picks for these sequences: a graph per (bucket, splits)
  // keeps a replay's attention identical to an eager launch of the same shape.
  const int splits = kcu::AttentionSplits(AttentionParams(eager_, in, kv, 0));
  if (splits > kMaxGraphSplits) return RunEager(batch, in, kv);
  int needed_width = 1;
  for (int e = 0; e < real; ++e) {
    const int32_t end = e + 1 < real ? in.extends[e + 1].block_table_offset
                                     : static_cast<int32_t>(in.tables.size());
    needed_width = std::max(needed_width, end - in.extends[e].block_table_offset);
  }
  if (needed_width > graph_table_width_ || kv.id() != graph_storage_id_) {
    // New fixed buffers (or other pools): the graphs captured so far point at the old ones.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    DropGraphs();
    int width = std::max(64, graph_table_width_);
    while (width < needed_width) width *= 2;
    graph_buffers_ = StepBuffers();
    StepInputs capacity;
    capacity.tokens = kMaxGraphTokens;
    capacity.tables.resize(static_cast<size_t>(kMaxGraphTokens) * width);
    capacity.extends.resize(kMaxGraphTokens);
    capacity.out_rows.resize(kMaxGraphTokens);
    capacity.max_kv_len = 0;
    TANDEM_RETURN_IF_ERROR(
        Reserve(graph_buffers_, capacity, WorkspaceBytes(capacity, kMaxGraphSplits)));
    graph_table_width_ = width;
    graph_storage_id_ = kv.id();
  }

  // Pad to the bucket: padding rows write no KV (slot -1), see block 0 only, and are dropped.
  const int width = graph_table_width_;
  std::vector<int32_t> tables(static_cast<size_t>(bucket) * width, 0);
  std::vector<kcu::AttentionExtend> extends(bucket);
  for (int e = 0; e < bucket; ++e) {
    kcu::AttentionExtend& a = extends[e];
    a.token_offset = e;
    a.new_tokens = 1;
    a.block_table_offset = e * width;
    if (e < real) {
      const kcu::AttentionExtend& src = in.extends[e];
      a.context_len = src.context_len;
      const int32_t end = e + 1 < real ? in.extends[e + 1].block_table_offset
                                       : static_cast<int32_t>(in.tables.size());
      std::copy(in.tables.begin() + src.block_table_offset, in.tables.begin() + end,
                tables.begin() + static_cast<size_t>(e) * width);
    }
  }
  in.tables = std::move(tables);
  in.extends = std::move(extends);
  in.masks.clear();
  in.ids.resize(bucket, 0);
  in.positions.resize(bucket, 0);
  in.slots.resize(bucket, -1);
  in.gate.assign(bucket, 0);
  in.any_gate = false;
  in.out_rows.resize(bucket);
  for (int e = 0; e < bucket; ++e) in.out_rows[e] = e;
  in.tokens = bucket;
  TANDEM_RETURN_IF_ERROR(Upload(graph_buffers_, in));

  const std::pair<int, int> key(bucket, splits);
  auto it = graphs_by_key_.find(key);
  if (it == graphs_by_key_.end()) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const absl::Status enqueued = Enqueue(graph_buffers_, in, kv, splits, nullptr, nullptr);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!enqueued.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return enqueued;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(ended);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TANDEM_CUDA_RETURN_IF_ERROR(instantiated);
    it = graphs_by_key_.emplace(key, exec).first;
    ++stats_.graphs_captured;
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_));
  // Row e of the graph's logits is extend e's one output; the padding rows after `real` are
  // never sampled or downloaded.
  std::vector<ExtendOutput> outputs(batch.size());
  TANDEM_RETURN_IF_ERROR(Collect(batch, graph_buffers_.logits.get(), outputs));
  ++stats_.graph_replays;
  return outputs;
}

absl::StatusOr<std::vector<ExtendOutput>> CudaTransformer::Forward(std::span<const Extend> batch,
                                                                   KvCache& kv) {
  auto* storage = dynamic_cast<CudaKvStorage*>(&kv.storage());
  if (storage == nullptr || storage->owner() != this) {
    return absl::InvalidArgumentError("the KV cache's storage was not made by this CUDA model");
  }
  TANDEM_RETURN_IF_ERROR(storage->status());
  if (lora_dirty_) TANDEM_RETURN_IF_ERROR(UploadLora());
  TANDEM_RETURN_IF_ERROR(storage->Flush());
  TANDEM_RETURN_IF_ERROR(BeginStaging());
  StepInputs in = Plan(batch, kv);
  if (in.tokens == 0) return std::vector<ExtendOutput>(batch.size());
  if (DecodeStep(batch)) return RunGraph(batch, std::move(in), *storage);
  return RunEager(batch, in, *storage);
}

}  // namespace tandem
