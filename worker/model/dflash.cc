#include "worker/model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/checkpoint.h"
#include "worker/model/checkpoint/internal/json_file.h"
#ifdef TANDEM_HAVE_CUDA
#include "worker/model/cuda/cuda_dflash.h"
#endif

namespace tandem {

namespace kc = kernels::cpu;
using Json = nlohmann::json;

namespace {

absl::Status Bad(const std::string& origin, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": ", what));
}

// config.json's integer `key`, or InvalidArgument naming it.
absl::StatusOr<int> IntField(const Json& json, const std::string& key, const std::string& origin) {
  auto it = json.find(key);
  if (it == json.end()) return Bad(origin, absl::StrCat("missing \"", key, "\""));
  if (!it->is_number_integer())
    return Bad(origin, absl::StrCat("\"", key, "\" must be an integer"));
  return it->get<int>();
}

bool NamesDFlash(const Json& json) {
  auto it = json.find("architectures");
  if (it == json.end() || !it->is_array()) return false;
  for (const Json& name : *it) {
    if (name.is_string() && name.get<std::string>() == kDFlashArchitecture) return true;
  }
  return false;
}

}  // namespace

bool IsDFlashCheckpoint(const std::string& dir) {
  absl::StatusOr<Json> json =
      checkpoint_internal::ReadJsonObject((std::filesystem::path(dir) / "config.json").string());
  return json.ok() && NamesDFlash(*json);
}

absl::StatusOr<DFlashConfig> ParseDFlashConfig(const std::string& json_text,
                                               const std::string& origin) {
  DFlashConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.model, ParseModelConfig(json_text, origin));
  const Json json = Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return Bad(origin, "not a JSON object");
  if (!NamesDFlash(json)) {
    return Bad(origin, absl::StrCat("\"architectures\" does not name ", kDFlashArchitecture));
  }
  if (c.model.arch != Arch::kQwen3) return Bad(origin, "a DFlash drafter must be model_type qwen3");
  if (c.model.attention_bias) return Bad(origin, "\"attention_bias\" is not supported by DFlash");
  TANDEM_ASSIGN_OR_RETURN(c.block_size, IntField(json, "block_size", origin));
  TANDEM_ASSIGN_OR_RETURN(c.mask_token_id, IntField(json, "mask_token_id", origin));
  auto d = json.find("dflash");
  if (d == json.end() || !d->is_object()) return Bad(origin, "missing object \"dflash\"");
  auto ids = d->find("target_layer_ids");
  if (ids == d->end() || !ids->is_array() || ids->empty()) {
    return Bad(origin, "\"dflash.target_layer_ids\" must be a non-empty list of integers");
  }
  for (const Json& id : *ids) {
    if (!id.is_number_integer()) {
      return Bad(origin, "\"dflash.target_layer_ids\" must be a non-empty list of integers");
    }
    c.target_layer_ids.push_back(id.get<int32_t>());
  }
  if (auto t = d->find("target"); t != d->end() && t->is_string()) c.target = t->get<std::string>();
  if (d->contains("max_anchor")) {
    TANDEM_ASSIGN_OR_RETURN(c.max_anchor, IntField(*d, "max_anchor", origin + " dflash"));
  }
  if (c.block_size < 2)
    return Bad(origin, absl::StrCat("\"block_size\" must be >= 2, got ", c.block_size));
  if (c.mask_token_id < 0 || c.mask_token_id >= c.model.vocab_size) {
    return Bad(origin, absl::StrCat("\"mask_token_id\" ", c.mask_token_id, " is outside [0, ",
                                    c.model.vocab_size, ")"));
  }
  if (c.max_anchor < 1 || c.max_anchor >= c.block_size) {
    return Bad(origin, absl::StrCat("\"dflash.max_anchor\" must be in [1, block_size - 1 = ",
                                    c.block_size - 1, "], got ", c.max_anchor));
  }
  return c;
}

DFlashWeights RandomDFlashWeights(const DFlashConfig& config, uint64_t seed, float stddev) {
  ModelConfig layers = config.model;
  layers.tie_word_embeddings = true;  // no head; the embedding is dropped below
  ModelWeights base = RandomWeights(layers, seed, stddev);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> normal(0.0f, stddev);
  const size_t hidden = config.model.hidden_size;
  DFlashWeights w;
  w.fc.resize(hidden * hidden * config.target_layer_ids.size());
  for (float& x : w.fc) x = normal(rng);
  w.hidden_norm.resize(hidden);
  for (float& x : w.hidden_norm) x = 1.0f + normal(rng);
  w.final_norm = std::move(base.final_norm);
  w.layers = std::move(base.layers);
  return w;
}

DFlashModel::DFlashModel(DFlashConfig config, DFlashWeights weights, const Transformer* target)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      target_(target),
      rope_(ComputeRope(config_.model)) {}

DFlashModel::~DFlashModel() = default;

absl::Status DFlashModel::UseDevice(const DeviceOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
  if (options.device == Device::kCpu) {
    backend_.reset();
    device_ = Device::kCpu;
    return absl::OkStatus();
  }
#ifdef TANDEM_HAVE_CUDA
  TANDEM_ASSIGN_OR_RETURN(backend_, CudaDFlash::Create(this));
  device_ = options.device;
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("this build has no CUDA backend");
#endif
}

absl::Status DFlashModel::Bind(DFlashContext& context) const {
  const bool here = backend_ == nullptr
                        ? context.storage_ == nullptr
                        : context.storage_ != nullptr && backend_->Owns(*context.storage_);
  if (here) return absl::OkStatus();
  if (context.length_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash context: its ", context.length_, " rows are ",
                     context.storage_ == nullptr ? "on the cpu" : "on another device or model",
                     " but the model runs on ", std::string(DeviceName(device_)),
                     "; truncate the context to 0 or start a new one"));
  }
  context.keys_.clear();
  context.values_.clear();
  context.storage_.reset();
  if (backend_ != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(context.storage_, backend_->NewStorage());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DFlashModel>> DFlashModel::Load(const std::string& dir,
                                                               const Transformer* target) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  TANDEM_ASSIGN_OR_RETURN(std::string text, checkpoint_internal::ReadTextFile(path));
  TANDEM_ASSIGN_OR_RETURN(DFlashConfig config, ParseDFlashConfig(text, path));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  const ModelConfig& c = config.model;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const int64_t q_out = int64_t{c.num_heads} * d, kv_out = int64_t{c.num_kv_heads} * d;
  const int64_t k = static_cast<int64_t>(config.target_layer_ids.size());
  DFlashWeights w;
  TANDEM_ASSIGN_OR_RETURN(w.fc, ckpt->LoadF32("fc.weight", {hidden, k * hidden}));
  TANDEM_ASSIGN_OR_RETURN(w.hidden_norm, ckpt->LoadF32("hidden_norm.weight", {hidden}));
  TANDEM_ASSIGN_OR_RETURN(w.final_norm, ckpt->LoadF32("norm.weight", {hidden}));
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    LayerWeights& l = w.layers[i];
    TANDEM_ASSIGN_OR_RETURN(l.input_norm, ckpt->LoadF32(p + "input_layernorm.weight", {hidden}));
    TANDEM_ASSIGN_OR_RETURN(l.post_norm,
                            ckpt->LoadF32(p + "post_attention_layernorm.weight", {hidden}));
    const std::string a = p + "self_attn.";
    TANDEM_ASSIGN_OR_RETURN(l.qkv, ckpt->LoadF32(a + "q_proj.weight", {q_out, hidden}));
    for (const char* name : {"k_proj.weight", "v_proj.weight"}) {
      TANDEM_ASSIGN_OR_RETURN(std::vector<float> kv, ckpt->LoadF32(a + name, {kv_out, hidden}));
      l.qkv.insert(l.qkv.end(), kv.begin(), kv.end());
    }
    TANDEM_ASSIGN_OR_RETURN(l.q_norm, ckpt->LoadF32(a + "q_norm.weight", {d}));
    TANDEM_ASSIGN_OR_RETURN(l.k_norm, ckpt->LoadF32(a + "k_norm.weight", {d}));
    TANDEM_ASSIGN_OR_RETURN(l.o, ckpt->LoadF32(a + "o_proj.weight", {hidden, q_out}));
    const std::string m = p + "mlp.";
    TANDEM_ASSIGN_OR_RETURN(l.gate_up, ckpt->LoadF32(m + "gate_proj.weight", {inter, hidden}));
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> up,
                            ckpt->LoadF32(m + "up_proj.weight", {inter, hidden}));
    l.gate_up.insert(l.gate_up.end(), up.begin(), up.end());
    TANDEM_ASSIGN_OR_RETURN(l.down, ckpt->LoadF32(m + "down_proj.weight", {hidden, inter}));
  }
  return Create(std::move(config), std::move(w), target);
}

absl::StatusOr<std::unique_ptr<DFlashModel>> DFlashModel::Create(DFlashConfig config,
                                                                 DFlashWeights weights,
                                                                 const Transformer* target) {
  if (target == nullptr) return absl::InvalidArgumentError("DFlash drafter needs a target model");
  const ModelConfig& c = config.model;
  const ModelConfig& t = target->config();
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash drafter: ", parts...));
  };
  if (c.hidden_size != t.hidden_size) {
    return bad("hidden_size ", c.hidden_size, " differs from the target's ", t.hidden_size,
               " (the drafter reuses the target's embeddings and LM head)");
  }
  if (c.vocab_size != t.vocab_size) {
    return bad("vocab_size ", c.vocab_size, " differs from the target's ", t.vocab_size);
  }
  for (int32_t l : config.target_layer_ids) {
    if (l < 0 || l > t.num_layers) {
      return bad("dflash.target_layer_ids has ", l, ", outside the target's layers [0, ",
                 t.num_layers, "]");
    }
  }
  if (c.num_heads <= 0 || c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0 ||
      c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return bad("num_attention_heads ", c.num_heads, " / num_key_value_heads ", c.num_kv_heads,
               " / head_dim ", c.head_dim, " do not form a GQA layout with even head_dim");
  }
  if (config.block_size < 2 || config.max_anchor < 1 || config.max_anchor >= config.block_size) {
    return bad("block_size ", config.block_size, " and max_anchor ", config.max_anchor,
               " need 1 <= max_anchor < block_size");
  }
  if (config.mask_token_id < 0 || config.mask_token_id >= c.vocab_size) {
    return bad("mask_token_id ", config.mask_token_id, " is outside the vocabulary of ",
               c.vocab_size);
  }
  const size_t h = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const size_t qkv_rows = (static_cast<size_t>(c.num_heads) + 2 * c.num_kv_heads) * d;
  auto check = [&](const std::string& name, const std::vector<float>& v, size_t want) {
    return v.size() == want ? absl::OkStatus()
                            : bad(name, " has ", v.size(), " values, expected ", want);
  };
  TANDEM_RETURN_IF_ERROR(check("fc.weight", weights.fc, h * h * config.target_layer_ids.size()));
  TANDEM_RETURN_IF_ERROR(check("hidden_norm.weight", weights.hidden_norm, h));
  TANDEM_RETURN_IF_ERROR(check("norm.weight", weights.final_norm, h));
  if (weights.layers.size() != static_cast<size_t>(c.num_layers)) {
    return bad("has ", weights.layers.size(), " layers, num_hidden_layers is ", c.num_layers);
  }
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& l = weights.layers[i];
    const std::string p = absl::StrCat("layers.", i, ".");
    TANDEM_RETURN_IF_ERROR(check(p + "input_layernorm.weight", l.input_norm, h));
    TANDEM_RETURN_IF_ERROR(check(p + "post_attention_layernorm.weight", l.post_norm, h));
    TANDEM_RETURN_IF_ERROR(check(p + "self_attn.{q,k,v}_proj.weight", l.qkv, qkv_rows * h));
    TANDEM_RETURN_IF_ERROR(check(p + "self_attn.q_norm.weight", l.q_norm, d));
    TANDEM_RETURN_IF_ERROR(check(p + "self_attn.k_norm.weight", l.k_norm, d));
    TANDEM_RETURN_IF_ERROR(check(p + "self_attn.o_proj.weight", l.o, h * c.num_heads * d));
    TANDEM_RETURN_IF_ERROR(check(p + "mlp.{gate,up}_proj.weight", l.gate_up, 2 * inter * h));
    TANDEM_RETURN_IF_ERROR(check(p + "mlp.down_proj.weight", l.down, h * inter));
    if (!l.qkv_bias.empty() || !l.o_bias.empty() || !l.gate_up_bias.empty() ||
        !l.down_bias.empty()) {
      return bad(p, " has biases; DFlash layers have none");
    }
  }
  return std::unique_ptr<DFlashModel>(
      new DFlashModel(std::move(config), std::move(weights), target));
}

absl::Status DFlashModel::AppendContext(DFlashContext& context, std::span<const float> hidden,
                                        int n) const {
  const ModelConfig& c = config_.model;
  const int h = c.hidden_size, d = c.head_dim, hkv = c.num_kv_heads, hq = c.num_heads;
  const int k = static_cast<int>(config_.target_layer_ids.size());
  if (n < 0 || hidden.size() != static_cast<size_t>(k) * n * h) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash context: got ", hidden.size(),
                                                   " hidden values for ", n, " tokens, expected [",
                                                   k, ", ", n, ", ", h, "]"));
  }
  TANDEM_RETURN_IF_ERROR(Bind(context));
  if (n == 0) return absl::OkStatus();
  if (backend_ != nullptr) {
    TANDEM_RETURN_IF_ERROR(backend_->AppendHost(*context.storage_, context.length_, hidden, n));
    context.length_ += n;
    return absl::OkStatus();
  }
  if (context.keys_.size() != static_cast<size_t>(c.num_layers)) {
    context.keys_.resize(c.num_layers);
    context.values_.resize(c.num_layers);
  }
  // [n, k * h]: token t's taps side by side, in target_layer_ids order.
  std::vector<float> fused(static_cast<size_t>(n) * k * h);
  for (int t = 0; t < n; ++t) {
    for (int l = 0; l < k; ++l) {
      std::memcpy(&fused[(static_cast<size_t>(t) * k + l) * h],
                  &hidden[(static_cast<size_t>(l) * n + t) * h], sizeof(float) * h);
    }
  }
  std::vector<float> ctx(static_cast<size_t>(n) * h);  // c_t: [n, h]
  kc::Linear(fused.data(), weights_.fc.data(), nullptr, ctx.data(), n, h, k * h);
  kc::RmsNorm(ctx.data(), weights_.hidden_norm.data(), ctx.data(), n, h, c.rms_norm_eps);

  const int kv_width = 2 * hkv * d;
  std::vector<float> kv(static_cast<size_t>(n) * kv_width);  // [n, k heads | v heads]
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = context.length_ + t;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    // The k and v rows of the fused qkv weight.
    kc::Linear(ctx.data(), w.qkv.data() + static_cast<size_t>(hq) * d * h, nullptr, kv.data(), n,
               kv_width, h);
    for (int t = 0; t < n; ++t) {
      float* row = &kv[static_cast<size_t>(t) * kv_width];
      kc::RmsNorm(row, w.k_norm.data(), row, hkv, d, c.rms_norm_eps);
    }
    kc::RopeParams rp;
    rp.x = kv.data();
    rp.positions = positions.data();
    rp.inv_freq = rope_.inv_freq.data();
    rp.attention_scaling = rope_.attention_scaling;
    rp.tokens = n;
    rp.heads = hkv;
    rp.head_dim = d;
    rp.row_stride = kv_width;
    kc::RopeInvoke(rp);
    std::vector<float>& keys = context.keys_[layer];
    std::vector<float>& values = context.values_[layer];
    for (int t = 0; t < n; ++t) {
      const float* row = &kv[static_cast<size_t>(t) * kv_width];
      keys.insert(keys.end(), row, row + hkv * d);
      values.insert(values.end(), row + hkv * d, row + kv_width);
    }
  }
  context.length_ += n;
  return absl::OkStatus();
}

absl::Status DFlashModel::AppendContextDevice(DFlashContext& context, const void* rows, int n,
                                              CUstream_st* stream) const {
  if (backend_ == nullptr) {
    return absl::FailedPreconditionError(
        "DFlash context: device rows need the model on cuda (DFlashModel::UseDevice); it runs "
        "on the cpu");
  }
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash context: ", n, " tokens"));
  }
  if (n > 0 && rows == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("DFlash context: null device rows for ", n, " tokens"));
  }
  TANDEM_RETURN_IF_ERROR(Bind(context));
  if (n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(
      backend_->AppendDevice(*context.storage_, context.length_, rows, n, stream));
  context.length_ += n;
  return absl::OkStatus();
}

absl::Status DFlashModel::ReadContext(const DFlashContext& context,
                                      std::vector<std::vector<float>>& keys,
                                      std::vector<std::vector<float>>& values) const {
  const int layers = config_.model.num_layers;
  if (context.storage_ == nullptr || context.length_ == 0) {
    if (context.length_ > 0 && context.keys_.size() != static_cast<size_t>(layers)) {
      return absl::InvalidArgumentError("DFlash context: built for another model");
    }
    keys = context.keys_;
    values = context.values_;
    keys.resize(layers);
    values.resize(layers);
    return absl::OkStatus();
  }
  if (backend_ == nullptr || !backend_->Owns(*context.storage_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash context: its rows are on a device this model (on ",
                     std::string(DeviceName(device_)), ") does not hold"));
  }
  return backend_->Read(*context.storage_, context.length_, keys, values);
}

void DFlashModel::TruncateContext(DFlashContext& context, int length) {
  if (length >= context.length_) return;
  length = std::max(length, 0);
  // Device rows past the length are simply overwritten by later appends.
  for (size_t l = 0; l < context.keys_.size(); ++l) {
    const size_t width = context.length_ > 0 ? context.keys_[l].size() / context.length_ : 0;
    context.keys_[l].resize(width * length);
    context.values_[l].resize(width * length);
  }
  context.length_ = length;
}

absl::StatusOr<std::vector<int32_t>> DFlashModel::BlockTokens(
    const DFlashContext& context, std::span<const int32_t> clean) const {
  const ModelConfig& c = config_.model;
  const int b = config_.block_size, vocab = c.vocab_size;
  const int a = static_cast<int>(clean.size());
  if (a < 1 || a > b) {
    return absl::InvalidArgumentError(
        absl::StrCat("DFlash block: ", a, " clean tokens, expected 1 .. block_size ", b));
  }
  for (int32_t t : clean) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("DFlash block: token ", t, " outside the vocabulary of ", vocab));
    }
  }
  // An empty context runs anywhere (the backend then uses scratch rows of its own).
  const bool here =
      context.length_ == 0 ||
      (backend_ == nullptr ? context.storage_ == nullptr
                           : context.storage_ != nullptr && backend_->Owns(*context.storage_));
  if (!here) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash block: the context's ", context.length_, " rows are ",
                     context.storage_ == nullptr ? "on the cpu" : "on another device or model",
                     " but the model runs on ", std::string(DeviceName(device_))));
  }
  if (context.storage_ == nullptr && context.length_ > 0 &&
      context.keys_.size() != static_cast<size_t>(c.num_layers)) {
    return absl::InvalidArgumentError("DFlash block: context built for another model");
  }
  std::vector<int32_t> block(clean.begin(), clean.end());
  block.resize(b, config_.mask_token_id);
  return block;
}

absl::StatusOr<std::vector<float>> DFlashModel::BlockLogits(const DFlashContext& context,
                                                            std::span<const int32_t> clean) const {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> block, BlockTokens(context, clean));
  if (backend_ != nullptr) {
    return backend_->BlockLogits(context.length_ > 0 ? context.storage_.get() : nullptr,
                                 context.length_, block);
  }
  return CpuBlockLogits(context, block);
}

absl::StatusOr<std::vector<float>> DFlashModel::CpuBlockLogits(
    const DFlashContext& context, std::span<const int32_t> block) const {
  const ModelConfig& c = config_.model;
  const int h = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int b = config_.block_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const int p = context.length_;
  const std::vector<float>& embed = target_->weights().embed;
  std::vector<float> x(static_cast<size_t>(b) * h);  // residual stream [b, h]
  for (int j = 0; j < b; ++j) {
    std::memcpy(&x[static_cast<size_t>(j) * h], &embed[static_cast<size_t>(block[j]) * h],
                sizeof(float) * h);
  }
  std::vector<int32_t> positions(b);
  for (int j = 0; j < b; ++j) positions[j] = p + j;
  const int qkv_width = (hq + 2 * hkv) * d, kv_row = hkv * d;
  std::vector<float> hbuf(static_cast<size_t>(b) * h), qkv(static_cast<size_t>(b) * qkv_width);
  std::vector<float> attn(static_cast<size_t>(b) * hq * d), proj(static_cast<size_t>(b) * h);
  std::vector<float> gate_up(static_cast<size_t>(b) * 2 * inter),
      act(static_cast<size_t>(b) * inter);
  // One "page" holding the context rows then the block's: [p + b, kv_heads, head_dim].
  std::vector<float> keys(static_cast<size_t>(p + b) * kv_row),
      values(static_cast<size_t>(p + b) * kv_row);
  std::vector<uint64_t> mask;
  Visibility::Full().ToBits(b, &mask);
  const int32_t block_table = 0;
  std::vector<float> workspace;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    kc::RmsNorm(x.data(), w.input_norm.data(), hbuf.data(), b, h, c.rms_norm_eps);
    kc::Linear(hbuf.data(), w.qkv.data(), nullptr, qkv.data(), b, qkv_width, h);
    for (int j = 0; j < b; ++j) {
      float* row = &qkv[static_cast<size_t>(j) * qkv_width];
      kc::RmsNorm(row, w.q_norm.data(), row, hq, d, c.rms_norm_eps);
      kc::RmsNorm(row + hq * d, w.k_norm.data(), row + hq * d, hkv, d, c.rms_norm_eps);
    }
    for (int part = 0; part < 2; ++part) {  // q heads, then k heads
      kc::RopeParams rp;
      rp.x = qkv.data() + (part == 0 ? 0 : hq * d);
      rp.positions = positions.data();
      rp.inv_freq = rope_.inv_freq.data();
      rp.attention_scaling = rope_.attention_scaling;
      rp.tokens = b;
      rp.heads = part == 0 ? hq : hkv;
      rp.head_dim = d;
      rp.row_stride = qkv_width;
      kc::RopeInvoke(rp);
    }
    if (p > 0) {
      std::memcpy(keys.data(), context.keys_[layer].data(), sizeof(float) * p * kv_row);
      std::memcpy(values.data(), context.values_[layer].data(), sizeof(float) * p * kv_row);
    }
    for (int j = 0; j < b; ++j) {
      const float* row = &qkv[static_cast<size_t>(j) * qkv_width];
      std::memcpy(&keys[static_cast<size_t>(p + j) * kv_row], row + hq * d, sizeof(float) * kv_row);
      std::memcpy(&values[static_cast<size_t>(p + j) * kv_row], row + (hq + hkv) * d,
                  sizeof(float) * kv_row);
    }
    kc::AttentionParams ap;
    ap.q = qkv.data();
    ap.q_stride = qkv_width;
    ap.k_cache = keys.data();
    ap.v_cache = values.data();
    ap.block_table = &block_table;
    ap.block_size = p + b;
    ap.context_len = p;
    ap.new_tokens = b;
    ap.mask = mask.data();
    ap.mask_words = Visibility::Words(b);
    ap.q_heads = hq;
    ap.kv_heads = hkv;
    ap.head_dim = d;
    ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
    ap.out = attn.data();
    ap.out_stride = hq * d;
    workspace.resize(kc::AttentionWorkspaceFloats(ap));
    kc::AttentionInvoke(ap, workspace.data());
    kc::Linear(attn.data(), w.o.data(), nullptr, proj.data(), b, h, hq * d);
    kc::AddRmsNorm(x.data(), proj.data(), w.post_norm.data(), hbuf.data(), b, h, c.rms_norm_eps);
    kc::Linear(hbuf.data(), w.gate_up.data(), nullptr, gate_up.data(), b, 2 * inter, h);
    kc::SiluMulFused(gate_up.data(), act.data(), b, inter);
    kc::Linear(act.data(), w.down.data(), nullptr, proj.data(), b, h, inter);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  kc::RmsNorm(x.data(), weights_.final_norm.data(), hbuf.data(), b, h, c.rms_norm_eps);
  std::vector<float> logits(static_cast<size_t>(b) * vocab);
  kc::Linear(hbuf.data(), target_->weights().Head().data(), nullptr, logits.data(), b, vocab, h);
  return logits;
}

absl::StatusOr<std::vector<int32_t>> DFlashModel::Draft(const DFlashContext& context,
                                                        std::span<const int32_t> clean) const {
  if (backend_ != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> block, BlockTokens(context, clean));
    return backend_->Draft(context.length_ > 0 ? context.storage_.get() : nullptr, context.length_,
                           block, static_cast<int>(clean.size()));
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<float> logits, BlockLogits(context, clean));
  const int vocab = config_.model.vocab_size;
  std::vector<int32_t> drafts;
  for (int j = static_cast<int>(clean.size()); j < config_.block_size; ++j) {
    const float* row = logits.data() + static_cast<size_t>(j) * vocab;
    drafts.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  return drafts;
}

}  // namespace tandem
