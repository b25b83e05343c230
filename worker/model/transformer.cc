#include "worker/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

#ifdef TANDEM_HAVE_CUDA
#include "worker/model/cuda/cuda_transformer.h"
#endif

namespace tandem {

namespace kc = kernels::cpu;

namespace {

// Where an extend's rows sit in the concatenated batch.
struct Slice {
  int offset = 0;   // first row in the batch
  int n = 0;        // new tokens
  int context = 0;  // committed tokens of the sequence
};

// Adds the adapter's delta for `target` to out[t, col : col + out_dim] for every row t whose gate
// is set: out += scale * (x · A^T) · B^T.
void ApplyLora(const LoraAdapter& adapter, int layer, LoraTarget target, const float* x, int in_dim,
               float* out, int out_stride, int col, std::span<const int> rows) {
  if (rows.empty() || layer >= static_cast<int>(adapter.layers.size())) return;
  auto it = adapter.layers[layer].find(target);
  if (it == adapter.layers[layer].end()) return;
  const LoraPair& pair = it->second;
  const int out_dim = static_cast<int>(pair.b.size() / pair.rank);
  std::vector<float> gathered(rows.size() * in_dim), low(rows.size() * pair.rank),
      delta(rows.size() * out_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(&gathered[r * in_dim], x + static_cast<size_t>(rows[r]) * in_dim,
                sizeof(float) * in_dim);
  }
  const int m = static_cast<int>(rows.size());
  kc::Linear(gathered.data(), pair.a.data(), nullptr, low.data(), m, pair.rank, in_dim);
  kc::Linear(low.data(), pair.b.data(), nullptr, delta.data(), m, out_dim, pair.rank);
  for (size_t r = 0; r < rows.size(); ++r) {
    float* dst = out + static_cast<size_t>(rows[r]) * out_stride + col;
    for (int j = 0; j < out_dim; ++j) dst[j] += adapter.scale * delta[r * out_dim + j];
  }
}

}  // namespace

Transformer::Transformer(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  RopeTables rope = ComputeRope(config_);
  inv_freq_ = std::move(rope.inv_freq);
  rope_scaling_ = rope.attention_scaling;
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& dir) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  TANDEM_ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(dir, config));
  return FromWeights(std::move(config), std::move(weights));
}

std::unique_ptr<Transformer> Transformer::FromWeights(ModelConfig config, ModelWeights weights) {
  return std::unique_ptr<Transformer>(new Transformer(std::move(config), std::move(weights)));
}

KvCacheOptions Transformer::KvOptions(int64_t max_tokens, int block_size) const {
  KvCacheOptions o;
  o.num_layers = config_.num_layers;
  o.num_kv_heads = config_.num_kv_heads;
  o.head_dim = config_.head_dim;
  o.block_size = block_size;
  o.num_blocks = static_cast<int32_t>((max_tokens + block_size - 1) / block_size);
  if (backend_ != nullptr) o.make_storage = backend_->StorageFactory();
  return o;
}

absl::Status Transformer::UseDevice(const DeviceOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
  if (options.device == Device::kCpu) {
    backend_.reset();
    device_ = Device::kCpu;
    return absl::OkStatus();
  }
#ifdef TANDEM_HAVE_CUDA
  TANDEM_ASSIGN_OR_RETURN(backend_, CudaTransformer::Create(this, options));
  device_ = options.device;
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

absl::Status Transformer::Validate(std::span<const Extend> batch, const KvCache& kv) const {
  for (size_t e = 0; e < batch.size(); ++e) {
    const Extend& x = batch[e];
    const int n = static_cast<int>(x.tokens.size());
    auto bad = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat("extend ", e, " (sequence ", x.seq, "): ", parts...));
    };
    if (!kv.HasSequence(x.seq)) return bad("sequence not in the KV cache");
    if (kv.TentativeLength(x.seq) != n) {
      return bad("reserved ", kv.TentativeLength(x.seq), " KV slots but has ", n, " tokens");
    }
    if (x.positions.size() != x.tokens.size()) return bad("positions and tokens differ in length");
    for (int i = 0; i < n; ++i) {
      if (x.tokens[i] < 0 || x.tokens[i] >= config_.vocab_size) {
        return bad("token ", x.tokens[i], " at ", i, " outside the vocabulary of ",
                   config_.vocab_size);
      }
      if (x.positions[i] < 0) return bad("negative position at ", i);
    }
    for (int32_t o : x.outputs) {
      if (o < 0 || o >= n) return bad("output index ", o, " outside [0, ", n, ")");
    }
    if (!x.samples.empty() && x.samples.size() != x.outputs.size()) {
      return bad(x.samples.size(), " sample requests for ", x.outputs.size(), " outputs");
    }
    for (size_t i = 0; i < x.samples.size(); ++i) {
      const SampleRequest& r = x.samples[i];
      if (std::isnan(r.params.temperature) || std::isnan(r.params.top_p) ||
          std::isnan(r.params.min_p)) {
        return bad("sample request ", i, " has a NaN temperature, top_p or min_p");
      }
      if (r.params.top_k < 0) return bad("sample request ", i, " has top_k ", r.params.top_k);
      if (static_cast<uint32_t>(r.purpose) > static_cast<uint32_t>(RngPurpose::kMask)) {
        return bad("sample request ", i, " has an unknown RNG purpose ",
                   static_cast<uint32_t>(r.purpose));
      }
      if (r.draft < -1 || r.draft >= config_.vocab_size) {
        return bad("sample request ", i, " has draft token ", r.draft,
                   " outside the vocabulary of ", config_.vocab_size, " (-1 = no draft)");
      }
    }
    if (!x.lora_gate.empty()) {
      if (static_cast<int>(x.lora_gate.size()) != n)
        return bad("lora_gate length differs from tokens");
      if (!lora_.has_value() &&
          std::any_of(x.lora_gate.begin(), x.lora_gate.end(), [](uint8_t g) { return g != 0; })) {
        return bad("LoRA gate set but the model has no adapter");
      }
    }
    for (int32_t l : x.hidden_layers) {
      if (l < 0 || l > config_.num_layers)
        return bad("hidden layer ", l, " outside [0, ", config_.num_layers, "]");
    }
    switch (x.visible.kind) {
      case Visibility::Kind::kBlock:
        if (x.visible.block_size <= 0) return bad("block visibility needs block_size > 0");
        break;
      case Visibility::Kind::kExplicit:
        if (x.visible.n != n ||
            x.visible.bits.size() != static_cast<size_t>(n) * Visibility::Words(n)) {
          return bad("explicit visibility describes ", x.visible.n, " tokens, extend has ", n);
        }
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ExtendOutput>> Transformer::Forward(std::span<const Extend> batch,
                                                               KvCache& kv) {
  TANDEM_RETURN_IF_ERROR(Validate(batch, kv));
  if (backend_ != nullptr) {
    if (!backend_->OwnsStorage(kv)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model runs on ", std::string(DeviceName(device_)),
          " but the KV cache's storage is not that device's (make it from KvOptions after "
          "UseDevice)"));
    }
    return backend_->Forward(batch, kv);
  }
  if (kv.host_storage() == nullptr) {
    return absl::InvalidArgumentError(
        "the model runs on the CPU but the KV cache's storage is another device's");
  }
  const ModelConfig& c = config_;
  const int hidden = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int qkv_width = (hq + 2 * hkv) * d;
  const int inter = c.intermediate_size;

  std::vector<Slice> slices(batch.size());
  int total = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    slices[e] = {total, static_cast<int>(batch[e].tokens.size()), kv.CommittedLength(batch[e].seq)};
    total += slices[e].n;
  }
  std::vector<ExtendOutput> outputs(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    outputs[e].hidden.resize(batch[e].hidden_layers.size() * static_cast<size_t>(slices[e].n) *
                             hidden);
  }
  if (total == 0) return outputs;

  // Rows whose LoRA gate is on, in batch row numbering.
  std::vector<int> lora_rows;
  for (size_t e = 0; e < batch.size(); ++e) {
    for (int i = 0; i < static_cast<int>(batch[e].lora_gate.size()); ++i) {
      if (batch[e].lora_gate[i]) lora_rows.push_back(slices[e].offset + i);
    }
  }

  // Per-extend RoPE tables: dynamic NTK scaling depends on the sequence length reached.
  std::vector<std::vector<float>> dyn_freq(batch.size());
  std::vector<float> dyn_scaling(batch.size(), rope_scaling_);
  if (c.rope_scaling.kind == RopeScaling::Kind::kDynamic) {
    for (size_t e = 0; e < batch.size(); ++e) {
      int max_pos = slices[e].context;
      for (int32_t p : batch[e].positions) max_pos = std::max(max_pos, p + 1);
      RopeTables t = ComputeRope(c, max_pos);
      dyn_freq[e] = std::move(t.inv_freq);
      dyn_scaling[e] = t.attention_scaling;
    }
  }

  std::vector<std::vector<uint64_t>> masks(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) batch[e].visible.ToBits(slices[e].n, &masks[e]);

  std::vector<float> x(static_cast<size_t>(total) * hidden);  // residual stream
  for (size_t e = 0; e < batch.size(); ++e) {
    for (int i = 0; i < slices[e].n; ++i) {
      std::memcpy(&x[static_cast<size_t>(slices[e].offset + i) * hidden],
                  &weights_.embed[static_cast<size_t>(batch[e].tokens[i]) * hidden],
                  sizeof(float) * hidden);
    }
  }
  auto tap = [&](int layer) {
    for (size_t e = 0; e < batch.size(); ++e) {
      const auto& layers = batch[e].hidden_layers;
      for (size_t t = 0; t < layers.size(); ++t) {
        if (layers[t] != layer) continue;
        std::memcpy(&outputs[e].hidden[t * slices[e].n * hidden],
                    &x[static_cast<size_t>(slices[e].offset) * hidden],
                    sizeof(float) * slices[e].n * hidden);
      }
    }
  };
  tap(0);

  std::vector<float> h(static_cast<size_t>(total) * hidden);
  std::vector<float> qkv(static_cast<size_t>(total) * qkv_width);
  std::vector<float> attn(static_cast<size_t>(total) * hq * d);
  std::vector<float> proj(static_cast<size_t>(total) * hidden);
  std::vector<float> gate_up(static_cast<size_t>(total) * 2 * inter);
  std::vector<float> act(static_cast<size_t>(total) * inter);
  std::vector<float> workspace;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  kc::RmsNorm(x.data(), weights_.layers[0].input_norm.data(), h.data(), total, hidden,
              c.rms_norm_eps);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    kc::Linear(h.data(), w.qkv.data(), w.qkv_bias.empty() ? nullptr : w.qkv_bias.data(), qkv.data(),
               total, qkv_width, hidden);
    if (lora_.has_value()) {
      ApplyLora(*lora_, layer, LoraTarget::kQ, h.data(), hidden, qkv.data(), qkv_width, 0,
                lora_rows);
      ApplyLora(*lora_, layer, LoraTarget::kK, h.data(), hidden, qkv.data(), qkv_width, hq * d,
                lora_rows);
      ApplyLora(*lora_, layer, LoraTarget::kV, h.data(), hidden, qkv.data(), qkv_width,
                (hq + hkv) * d, lora_rows);
    }
    if (!w.q_norm.empty()) {
      for (int t = 0; t < total; ++t) {
        float* row = &qkv[static_cast<size_t>(t) * qkv_width];
        kc::RmsNorm(row, w.q_norm.data(), row, hq, d, c.rms_norm_eps);
        kc::RmsNorm(row + hq * d, w.k_norm.data(), row + hq * d, hkv, d, c.rms_norm_eps);
      }
    }
    for (size_t e = 0; e < batch.size(); ++e) {
      const Slice& s = slices[e];
      const float* freq = dyn_freq[e].empty() ? inv_freq_.data() : dyn_freq[e].data();
      float* base = &qkv[static_cast<size_t>(s.offset) * qkv_width];
      for (int part = 0; part < 2; ++part) {  // q heads, then k heads
        kc::RopeParams rp;
        rp.x = base + (part == 0 ? 0 : hq * d);
        rp.positions = batch[e].positions.data();
        rp.inv_freq = freq;
        rp.attention_scaling = dyn_scaling[e];
        rp.tokens = s.n;
        rp.heads = part == 0 ? hq : hkv;
        rp.head_dim = d;
        rp.row_stride = qkv_width;
        kc::RopeInvoke(rp);
      }
      for (int i = 0; i < s.n; ++i) {
        const float* row = base + static_cast<size_t>(i) * qkv_width;
        std::memcpy(kv.KeyRow(batch[e].seq, layer, s.context + i), row + hq * d,
                    sizeof(float) * hkv * d);
        std::memcpy(kv.ValueRow(batch[e].seq, layer, s.context + i), row + (hq + hkv) * d,
                    sizeof(float) * hkv * d);
      }
      kc::AttentionParams ap;
      ap.q = base;
      ap.q_stride = qkv_width;
      ap.k_cache = kv.Keys(layer);
      ap.v_cache = kv.Values(layer);
      ap.block_table = kv.BlockTable(batch[e].seq).data();
      ap.block_size = kv.options().block_size;
      ap.context_len = s.context;
      ap.new_tokens = s.n;
      ap.mask = masks[e].data();
      ap.mask_words = Visibility::Words(s.n);
      ap.q_heads = hq;
      ap.kv_heads = hkv;
      ap.head_dim = d;
      ap.scale = scale;
      ap.window = c.sliding_window;
      ap.out = &attn[static_cast<size_t>(s.offset) * hq * d];
      ap.out_stride = hq * d;
      workspace.resize(std::max(workspace.size(), kc::AttentionWorkspaceFloats(ap)));
      kc::AttentionInvoke(ap, workspace.data());
    }
    kc::Linear(attn.data(), w.o.data(), w.o_bias.empty() ? nullptr : w.o_bias.data(), proj.data(),
               total, hidden, hq * d);
    if (lora_.has_value()) {
      ApplyLora(*lora_, layer, LoraTarget::kO, attn.data(), hq * d, proj.data(), hidden, 0,
                lora_rows);
    }
    kc::AddRmsNorm(x.data(), proj.data(), w.post_norm.data(), h.data(), total, hidden,
                   c.rms_norm_eps);
    kc::Linear(h.data(), w.gate_up.data(), w.gate_up_bias.empty() ? nullptr : w.gate_up_bias.data(),
               gate_up.data(), total, 2 * inter, hidden);
    if (lora_.has_value()) {
      ApplyLora(*lora_, layer, LoraTarget::kGate, h.data(), hidden, gate_up.data(), 2 * inter, 0,
                lora_rows);
      ApplyLora(*lora_, layer, LoraTarget::kUp, h.data(), hidden, gate_up.data(), 2 * inter, inter,
                lora_rows);
    }
    kc::SiluMulFused(gate_up.data(), act.data(), total, inter);
    kc::Linear(act.data(), w.down.data(), w.down_bias.empty() ? nullptr : w.down_bias.data(),
               proj.data(), total, hidden, inter);
    if (lora_.has_value()) {
      ApplyLora(*lora_, layer, LoraTarget::kDown, act.data(), inter, proj.data(), hidden, 0,
                lora_rows);
    }
    // The residual add is fused with the next layer's input norm (or the final norm below).
    const bool last = layer + 1 == c.num_layers;
    if (!last) {
      kc::AddRmsNorm(x.data(), proj.data(), weights_.layers[layer + 1].input_norm.data(), h.data(),
                     total, hidden, c.rms_norm_eps);
    } else {
      for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    }
    tap(layer + 1);
  }

  // Final norm and LM head only for the rows whose logits are wanted.
  std::vector<int> out_rows;
  for (size_t e = 0; e < batch.size(); ++e) {
    for (int32_t o : batch[e].outputs) out_rows.push_back(slices[e].offset + o);
  }
  if (out_rows.empty()) return outputs;
  const int m = static_cast<int>(out_rows.size());
  std::vector<float> normed(static_cast<size_t>(m) * hidden);
  for (int r = 0; r < m; ++r) {
    kc::RmsNorm(&x[static_cast<size_t>(out_rows[r]) * hidden], weights_.final_norm.data(),
                &normed[static_cast<size_t>(r) * hidden], 1, hidden, c.rms_norm_eps);
  }
  std::vector<float> logits(static_cast<size_t>(m) * c.vocab_size);
  kc::Linear(normed.data(), weights_.Head().data(), nullptr, logits.data(), m, c.vocab_size,
             hidden);
  // VerifyDraft's vocabulary-sized distribution, reused across the draft rows.
  std::vector<float> verify_scratch;
  size_t r = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const Extend& x = batch[e];
    const size_t k = x.outputs.size();
    const float* first = logits.data() + r * c.vocab_size;
    if (!x.samples.empty()) {
      outputs[e].tokens.resize(k);
      outputs[e].accepted.assign(k, 1);
      for (size_t i = 0; i < k; ++i) {
        const SampleRequest& s = x.samples[i];
        const std::span<const float> row(first + i * c.vocab_size,
                                         static_cast<size_t>(c.vocab_size));
        if (s.draft >= 0) {
          bool accepted = false;
          outputs[e].tokens[i] =
              VerifyDraft(row, s.draft, s.params, s.position, &accepted, &verify_scratch);
          outputs[e].accepted[i] = accepted ? 1 : 0;
        } else {
          outputs[e].tokens[i] = SampleToken(row, s.params, s.position, s.purpose);
        }
      }
    }
    if (x.return_logits) outputs[e].logits.assign(first, first + k * c.vocab_size);
    r += k;
  }
  return outputs;
}

}  // namespace tandem
