#include "worker/model/cuda/cuda_dflash.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "worker/model/cuda/cuda_transformer.h"
#include "worker/model/cuda/layer_ops.h"
#include "worker/model/dflash.h"
#include "worker/model/transformer.h"

namespace tandem {

namespace kcu = kernels::cuda;
using cuda_backend::DeviceArray;
using cuda_backend::UploadBf16;

namespace {

// Rows a new context's storage starts with beyond the block's scratch.
constexpr int kInitialContextRows = 256;

uint64_t NextBackendId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

}  // namespace

CudaDFlash::CudaDFlash(const DFlashModel* model)
    : model_(model), id_(NextBackendId()), empty_(id_) {}

CudaDFlash::~CudaDFlash() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (event_ != nullptr) cudaEventDestroy(event_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CudaDFlash>> CudaDFlash::Create(const DFlashModel* model) {
  std::unique_ptr<CudaDFlash> backend(new CudaDFlash(model));
  TANDEM_RETURN_IF_ERROR(backend->Init());
  return backend;
}

absl::Status CudaDFlash::Init() {
  const DFlashConfig& config = model_->config();
  const ModelConfig& c = config.model;
  const DFlashWeights& w = model_->weights();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  TANDEM_RETURN_IF_ERROR(kcu::CublasStatusToStatus(cublasCreate(&cublas_), "cublasCreate"));

  // The target's device embeddings and head when it runs on CUDA. Transformer::backend() is a
  // non-const accessor; it is only read here.
  const auto* target =
      dynamic_cast<const CudaTransformer*>(const_cast<Transformer&>(model_->target()).backend());
  if (target != nullptr) {
    embed_ptr_ = target->device_embed();
    head_ptr_ = target->device_head();
  } else {
    // The target's host matrices are packed for the CPU: row-major again for the upload.
    const ModelWeights& t = model_->target().weights();
    // An untied model keeps its embedding rows: uploaded from there, not from a copy.
    const std::vector<float> unpacked_embed =
        t.embed.empty() ? t.EmbedRowMajor() : std::vector<float>();
    TANDEM_RETURN_IF_ERROR(UploadBf16(embed_, t.embed.empty() ? unpacked_embed : t.embed));
    embed_ptr_ = head_ptr_ = embed_.get();
    if (const std::vector<float> head = t.HeadRowMajor(); !head.empty()) {
      TANDEM_RETURN_IF_ERROR(UploadBf16(head_, head));
      head_ptr_ = head_.get();
    }
  }
  // The drafter's host matrices are packed for the CPU: row-major again for the upload.
  TANDEM_RETURN_IF_ERROR(UploadBf16(fc_, w.FcRowMajor()));
  TANDEM_RETURN_IF_ERROR(UploadBf16(hidden_norm_, w.hidden_norm));
  TANDEM_RETURN_IF_ERROR(UploadBf16(final_norm_, w.final_norm));
  layers_.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights h = w.RowMajorLayer(static_cast<int>(l));
    DeviceLayer& d = layers_[l];
    const std::pair<DeviceArray<Bf16>*, const std::vector<float>*> parts[] = {
        {&d.input_norm, &h.input_norm}, {&d.qkv, &h.qkv},  {&d.q_norm, &h.q_norm},
        {&d.k_norm, &h.k_norm},         {&d.o, &h.o},      {&d.post_norm, &h.post_norm},
        {&d.gate_up, &h.gate_up},       {&d.down, &h.down}};
    for (const auto& [device, host] : parts) TANDEM_RETURN_IF_ERROR(UploadBf16(*device, *host));
  }
  RopeTables rope = ComputeRope(c);
  TANDEM_RETURN_IF_ERROR(inv_freq_.Upload(rope.inv_freq.data(), rope.inv_freq.size()));
  rope_scaling_ = rope.attention_scaling;

  const size_t b = config.block_size, h = c.hidden_size, inter = c.intermediate_size;
  const size_t qd = static_cast<size_t>(c.num_heads) * c.head_dim;
  TANDEM_RETURN_IF_ERROR(x_.Reserve(b * h));
  TANDEM_RETURN_IF_ERROR(h_.Reserve(b * h));
  TANDEM_RETURN_IF_ERROR(q_.Reserve(b * qd));
  TANDEM_RETURN_IF_ERROR(attn_.Reserve(b * qd));
  TANDEM_RETURN_IF_ERROR(proj_.Reserve(b * h));
  TANDEM_RETURN_IF_ERROR(gate_up_.Reserve(b * 2 * inter));
  TANDEM_RETURN_IF_ERROR(act_.Reserve(b * inter));
  TANDEM_RETURN_IF_ERROR(logits_.Reserve(b * static_cast<size_t>(c.vocab_size)));
  TANDEM_RETURN_IF_ERROR(ids_.Reserve(b));
  TANDEM_RETURN_IF_ERROR(tokens_.Reserve(b));
  TANDEM_RETURN_IF_ERROR(positions_.Reserve(b));
  TANDEM_RETURN_IF_ERROR(extend_.Reserve(1));
  const int32_t table = 0;  // one block: the context's whole storage
  TANDEM_RETURN_IF_ERROR(block_table_.Upload(&table, 1));
  const std::vector<kcu::SamplingRow> greedy(b);  // temperature 0: argmax
  TANDEM_RETURN_IF_ERROR(greedy_.Upload(greedy.data(), greedy.size()));
  TANDEM_RETURN_IF_ERROR(Grow(empty_, config.block_size, 0));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status CudaDFlash::Grow(CudaDFlashContext& ctx, int rows, int keep) {
  if (rows <= ctx.capacity_) return absl::OkStatus();
  const ModelConfig& c = model_->config().model;
  const size_t layers = c.num_layers;
  const size_t kv_row = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const int capacity = std::max(rows, 2 * ctx.capacity_);
  DeviceArray<Bf16> keys, values;
  TANDEM_RETURN_IF_ERROR(keys.Reserve(layers * capacity * kv_row));
  TANDEM_RETURN_IF_ERROR(values.Reserve(layers * capacity * kv_row));
  if (keep > 0) {
    // Each layer's first `keep` rows; the layer stride changes with the capacity.
    const size_t width = keep * kv_row * sizeof(Bf16);
    const size_t from = ctx.capacity_ * kv_row * sizeof(Bf16);
    const size_t to = capacity * kv_row * sizeof(Bf16);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(keys.get(), to, ctx.keys_.get(), from, width,
                                                  layers, cudaMemcpyDeviceToDevice, stream_));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(values.get(), to, ctx.values_.get(), from, width,
                                                  layers, cudaMemcpyDeviceToDevice, stream_));
  }
  // Freeing the old arrays (cudaFree) waits for the copies.
  ctx.keys_ = std::move(keys);
  ctx.values_ = std::move(values);
  ctx.capacity_ = capacity;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DFlashContextStorage>> CudaDFlash::NewStorage() {
  std::lock_guard<std::mutex> lock(mu_);
  auto ctx = std::make_unique<CudaDFlashContext>(id_);
  TANDEM_RETURN_IF_ERROR(Grow(*ctx, kInitialContextRows + model_->config().block_size, 0));
  return ctx;
}

bool CudaDFlash::Owns(const DFlashContextStorage& storage) const {
  const auto* ctx = dynamic_cast<const CudaDFlashContext*>(&storage);
  return ctx != nullptr && ctx->owner() == id_;
}

absl::Status CudaDFlash::ReserveAppend(int n) {
  if (n <= append_capacity_) return absl::OkStatus();
  const DFlashConfig& config = model_->config();
  const size_t h = config.model.hidden_size, k = config.target_layer_ids.size();
  const size_t rows = static_cast<size_t>(n);
  TANDEM_RETURN_IF_ERROR(rows_.Reserve(k * rows * h));
  TANDEM_RETURN_IF_ERROR(fused_.Reserve(rows * k * h));
  TANDEM_RETURN_IF_ERROR(ctx_.Reserve(rows * h));
  TANDEM_RETURN_IF_ERROR(positions_.Reserve(std::max<size_t>(rows, config.block_size)));
  append_capacity_ = n;
  return absl::OkStatus();
}

absl::Status CudaDFlash::Gemm(const Bf16* x, int ldx, const Bf16* w, void* y, int ldy,
                              bool fp32_out, int m, int n, int k) {
  return cuda_backend::LinearGemm(cublas_, workspace_, stream_, x, ldx, w, nullptr, y, ldy,
                                  fp32_out, m, n, k);
}

absl::Status CudaDFlash::Norm(const Bf16* x, Bf16* residual, const Bf16* weight, Bf16* y, int rows,
                              int dim) {
  return cuda_backend::RmsNorm(stream_, model_->config().model.rms_norm_eps, x, residual, weight, y,
                               rows, dim);
}

absl::Status CudaDFlash::EnqueueAppend(CudaDFlashContext& ctx, int length, const Bf16* rows,
                                       int n) {
  const DFlashConfig& config = model_->config();
  const ModelConfig& c = config.model;
  const int h = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int k = static_cast<int>(config.target_layer_ids.size());
  const int kd = hkv * d, qd = hq * d;
  TANDEM_RETURN_IF_ERROR(workspace_.Reserve(kcu::WorkspaceBytes(kcu::GemmParams{})));
  // Room for the new rows and the block scratch after them.
  TANDEM_RETURN_IF_ERROR(Grow(ctx, length + n + config.block_size, length));
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = length + t;
  TANDEM_RETURN_IF_ERROR(positions_.UploadAsync(positions.data(), positions.size(), stream_));
  // [k, n, h] -> [n, k * h]: token t's taps side by side, in target_layer_ids order.
  for (int l = 0; l < k; ++l) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        fused_.get() + static_cast<size_t>(l) * h, static_cast<size_t>(k) * h * sizeof(Bf16),
        rows + static_cast<size_t>(l) * n * h, h * sizeof(Bf16), h * sizeof(Bf16), n,
        cudaMemcpyDeviceToDevice, stream_));
  }
  TANDEM_RETURN_IF_ERROR(Gemm(fused_.get(), k * h, fc_.get(), ctx_.get(), h, false, n, h, k * h));
  TANDEM_RETURN_IF_ERROR(Norm(ctx_.get(), nullptr, hidden_norm_.get(), ctx_.get(), n, h));
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const DeviceLayer& L = layers_[layer];
    const size_t first = (static_cast<size_t>(layer) * ctx.capacity_ + length) * kd;
    Bf16* keys = ctx.keys_.get() + first;
    Bf16* values = ctx.values_.get() + first;
    // The k and v rows of the fused qkv weight, straight into the context rows.
    const Bf16* wk = L.qkv.get() + static_cast<size_t>(qd) * h;
    const Bf16* wv = wk + static_cast<size_t>(kd) * h;
    TANDEM_RETURN_IF_ERROR(Gemm(ctx_.get(), h, wk, keys, kd, false, n, kd, h));
    TANDEM_RETURN_IF_ERROR(Gemm(ctx_.get(), h, wv, values, kd, false, n, kd, h));
    TANDEM_RETURN_IF_ERROR(Norm(keys, nullptr, L.k_norm.get(), keys, n * hkv, d));
    kcu::RopeParams p;
    p.q = keys;
    p.q_stride = kd;
    p.q_heads = hkv;
    p.positions = positions_.get();
    p.inv_freq = inv_freq_.get();
    p.attention_scaling = rope_scaling_;
    p.tokens = n;
    p.head_dim = d;
    TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaDFlash::AppendHost(DFlashContextStorage& storage, int length,
                                    std::span<const float> hidden, int n) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ctx = static_cast<CudaDFlashContext&>(storage);
  TANDEM_RETURN_IF_ERROR(ReserveAppend(n));
  std::vector<Bf16> rows(hidden.size());
  for (size_t i = 0; i < hidden.size(); ++i) rows[i] = __float2bfloat16(hidden[i]);
  // From pageable memory the copy returns once staged, so `rows` may go.
  TANDEM_RETURN_IF_ERROR(rows_.UploadAsync(rows.data(), rows.size(), stream_));
  return EnqueueAppend(ctx, length, rows_.get(), n);
}

absl::Status CudaDFlash::AppendDevice(DFlashContextStorage& storage, int length, const void* rows,
                                      int n, CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& ctx = static_cast<CudaDFlashContext&>(storage);
  TANDEM_RETURN_IF_ERROR(ReserveAppend(n));
  // Reads after the caller's queued work; the caller's later work after the reads.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, event_, 0));
  TANDEM_RETURN_IF_ERROR(EnqueueAppend(ctx, length, static_cast<const Bf16*>(rows), n));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream_));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event_, 0));
  return absl::OkStatus();
}

absl::Status CudaDFlash::EnqueueBlock(const DFlashContextStorage* storage, int length,
                                      std::span<const int32_t> block) {
  const DFlashConfig& config = model_->config();
  const ModelConfig& c = config.model;
  const int h = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int b = config.block_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const int kd = hkv * d, qd = hq * d;
  // The block writes its K/V into the rows past the context (scratch, not part of its state).
  CudaDFlashContext& ctx =
      storage == nullptr
          ? empty_
          : const_cast<CudaDFlashContext&>(static_cast<const CudaDFlashContext&>(*storage));
  if (ctx.capacity_ < length + b) {
    return absl::InternalError(absl::StrCat("DFlash context storage holds ", ctx.capacity_,
                                            " rows, the block needs ", length + b));
  }
  const size_t layer_stride = static_cast<size_t>(ctx.capacity_) * kd;

  kcu::PagedAttentionParams ap;
  ap.q = q_.get();
  ap.q_stride = qd;
  ap.block_tables = block_table_.get();
  ap.block_size = ctx.capacity_;
  ap.extends = extend_.get();
  ap.num_extends = 1;
  ap.total_tokens = b;
  ap.q_heads = hq;
  ap.kv_heads = hkv;
  ap.head_dim = d;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
  ap.max_kv_len = length + b;
  ap.out = attn_.get();
  ap.out_stride = qd;
  ap.num_splits = kcu::AttentionSplits(ap);
  const size_t sampling = static_cast<size_t>(b) * vocab * sizeof(float);
  TANDEM_RETURN_IF_ERROR(workspace_.Reserve(
      std::max({kcu::WorkspaceBytes(kcu::GemmParams{}), kcu::WorkspaceBytes(ap), sampling})));
  ap.workspace = workspace_.get();
  ap.workspace_bytes = workspace_.bytes();

  kcu::AttentionExtend extend;
  extend.new_tokens = b;
  extend.context_len = length;
  extend.visibility = kcu::AttentionVisibility::kFull;
  TANDEM_RETURN_IF_ERROR(extend_.UploadAsync(&extend, 1, stream_));
  TANDEM_RETURN_IF_ERROR(ids_.UploadAsync(block.data(), block.size(), stream_));
  std::vector<int32_t> positions(b);
  for (int j = 0; j < b; ++j) positions[j] = length + j;
  TANDEM_RETURN_IF_ERROR(positions_.UploadAsync(positions.data(), positions.size(), stream_));

  {
    kcu::EmbeddingParams p;
    p.ids = ids_.get();
    p.table = embed_ptr_;
    p.out = x_.get();
    p.tokens = b;
    p.vocab = vocab;
    p.hidden = h;
    p.out_stride = h;
    TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
  }
  TANDEM_RETURN_IF_ERROR(Norm(x_.get(), nullptr, layers_[0].input_norm.get(), h_.get(), b, h));
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const DeviceLayer& L = layers_[layer];
    Bf16* layer_keys = ctx.keys_.get() + layer * layer_stride;
    Bf16* layer_values = ctx.values_.get() + layer * layer_stride;
    Bf16* keys = layer_keys + static_cast<size_t>(length) * kd;
    Bf16* values = layer_values + static_cast<size_t>(length) * kd;
    const Bf16* wq = L.qkv.get();
    const Bf16* wk = wq + static_cast<size_t>(qd) * h;
    const Bf16* wv = wk + static_cast<size_t>(kd) * h;
    TANDEM_RETURN_IF_ERROR(Gemm(h_.get(), h, wq, q_.get(), qd, false, b, qd, h));
    TANDEM_RETURN_IF_ERROR(Gemm(h_.get(), h, wk, keys, kd, false, b, kd, h));
    TANDEM_RETURN_IF_ERROR(Gemm(h_.get(), h, wv, values, kd, false, b, kd, h));
    TANDEM_RETURN_IF_ERROR(Norm(q_.get(), nullptr, L.q_norm.get(), q_.get(), b * hq, d));
    TANDEM_RETURN_IF_ERROR(Norm(keys, nullptr, L.k_norm.get(), keys, b * hkv, d));
    {
      kcu::RopeParams p;
      p.q = q_.get();
      p.q_stride = qd;
      p.q_heads = hq;
      p.k = keys;
      p.k_stride = kd;
      p.k_heads = hkv;
      p.positions = positions_.get();
      p.inv_freq = inv_freq_.get();
      p.attention_scaling = rope_scaling_;
      p.tokens = b;
      p.head_dim = d;
      TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
    }
    ap.k_cache = layer_keys;
    ap.v_cache = layer_values;
    TANDEM_RETURN_IF_ERROR(kcu::Invoke(ap, stream_));
    TANDEM_RETURN_IF_ERROR(Gemm(attn_.get(), qd, L.o.get(), proj_.get(), h, false, b, h, qd));
    TANDEM_RETURN_IF_ERROR(Norm(proj_.get(), x_.get(), L.post_norm.get(), h_.get(), b, h));
    TANDEM_RETURN_IF_ERROR(
        Gemm(h_.get(), h, L.gate_up.get(), gate_up_.get(), 2 * inter, false, b, 2 * inter, h));
    {
      kcu::SwiGluParams p;
      p.gate_up = gate_up_.get();
      p.out = act_.get();
      p.rows = b;
      p.inter = inter;
      TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
    }
    TANDEM_RETURN_IF_ERROR(
        Gemm(act_.get(), inter, L.down.get(), proj_.get(), h, false, b, h, inter));
    // Residual add fused with the next layer's input norm, or with the final norm.
    const bool last = layer + 1 == c.num_layers;
    const Bf16* next = last ? final_norm_.get() : layers_[layer + 1].input_norm.get();
    TANDEM_RETURN_IF_ERROR(Norm(proj_.get(), x_.get(), next, h_.get(), b, h));
  }
  return Gemm(h_.get(), h, head_ptr_, logits_.get(), vocab, true, b, vocab, h);
}

absl::StatusOr<std::vector<float>> CudaDFlash::BlockLogits(const DFlashContextStorage* storage,
                                                           int length,
                                                           std::span<const int32_t> block) {
  std::lock_guard<std::mutex> lock(mu_);
  TANDEM_RETURN_IF_ERROR(EnqueueBlock(storage, length, block));
  std::vector<float> logits(block.size() * model_->config().model.vocab_size);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits.data(), logits_.get(),
                                              logits.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                              stream_));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return logits;
}

absl::StatusOr<std::vector<int32_t>> CudaDFlash::Draft(const DFlashContextStorage* storage,
                                                       int length, std::span<const int32_t> block,
                                                       int first) {
  std::lock_guard<std::mutex> lock(mu_);
  const int vocab = model_->config().model.vocab_size;
  const int rows = static_cast<int>(block.size()) - first;
  TANDEM_RETURN_IF_ERROR(EnqueueBlock(storage, length, block));
  std::vector<int32_t> drafts(rows);
  if (rows == 0) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return drafts;
  }
  kcu::SamplingParams p;
  p.logits = logits_.get() + static_cast<size_t>(first) * vocab;
  p.logits_stride = vocab;
  p.rows_params = greedy_.get();
  p.tokens = tokens_.get();
  p.rows = rows;
  p.vocab = vocab;
  p.workspace = workspace_.get();
  p.workspace_bytes = workspace_.bytes();
  TANDEM_RETURN_IF_ERROR(kcu::Invoke(p, stream_));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(drafts.data(), tokens_.get(),
                                              drafts.size() * sizeof(int32_t),
                                              cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return drafts;
}

absl::Status CudaDFlash::Read(const DFlashContextStorage& storage, int length,
                              std::vector<std::vector<float>>& keys,
                              std::vector<std::vector<float>>& values) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& ctx = static_cast<const CudaDFlashContext&>(storage);
  const ModelConfig& c = model_->config().model;
  const size_t kd = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t count = static_cast<size_t>(length) * kd;
  keys.assign(c.num_layers, {});
  values.assign(c.num_layers, {});
  std::vector<Bf16> k(count), v(count);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const size_t first = static_cast<size_t>(layer) * ctx.capacity_ * kd;
    if (count > 0) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k.data(), ctx.keys_.get() + first,
                                                  count * sizeof(Bf16), cudaMemcpyDeviceToHost,
                                                  stream_));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v.data(), ctx.values_.get() + first,
                                                  count * sizeof(Bf16), cudaMemcpyDeviceToHost,
                                                  stream_));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
    keys[layer].resize(count);
    values[layer].resize(count);
    for (size_t i = 0; i < count; ++i) {
      keys[layer][i] = __bfloat162float(k[i]);
      values[layer][i] = __bfloat162float(v[i]);
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
