#include "worker/model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/checkpoint.h"
#include "worker/model/checkpoint/internal/json_file.h"
#include "worker/model/cpu_dflash.h"
#ifdef TANDEM_HAVE_CUDA
#include "worker/model/cuda/cuda_dflash.h"
#endif

namespace tandem {

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

void DFlashWeights::PackForCpu(kernels::cpu::WeightType type) {
  if (packed()) return;
  const int hidden = static_cast<int>(final_norm.size());
  packed_fc = PackRows(fc, hidden > 0 ? static_cast<int>(fc.size() / hidden) : 0, type);
  packed_layers.clear();
  for (LayerWeights& l : layers) packed_layers.push_back(PackLayer(l, hidden, type));
}

std::vector<float> DFlashWeights::FcRowMajor() const { return RowMajorOf(fc, packed_fc); }

LayerWeights DFlashWeights::RowMajorLayer(int i) const {
  return RowMajorLayerOf(
      layers[i], static_cast<size_t>(i) < packed_layers.size() ? &packed_layers[i] : nullptr);
}

DFlashWeights DFlashWeights::Unpacked() const {
  DFlashWeights w;
  w.fc = FcRowMajor();
  w.hidden_norm = hidden_norm;
  w.final_norm = final_norm;
  for (size_t i = 0; i < layers.size(); ++i) w.layers.push_back(RowMajorLayer(static_cast<int>(i)));
  return w;
}

DFlashModel::DFlashModel(DFlashConfig config, DFlashWeights weights, const Transformer* target)
    : config_(std::move(config)),
      weights_(std::move(weights)),
      target_(target),
      backend_(std::make_unique<CpuDFlash>(this)) {}

DFlashModel::~DFlashModel() = default;

absl::Status DFlashModel::UseDevice(const DeviceOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
  if (options.device == Device::kCpu) {
    backend_ = std::make_unique<CpuDFlash>(this);
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

bool DFlashModel::Holds(const DFlashContext& context) const {
  return context.storage_ != nullptr && backend_->Owns(*context.storage_);
}

absl::Status DFlashModel::Bind(DFlashContext& context) const {
  if (Holds(context)) return absl::OkStatus();
  if (context.length_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash context: its ", context.length_, " rows are ", Where(context),
                     " but the model runs on ", std::string(DeviceName(device_)),
                     "; truncate the context to 0 or start a new one"));
  }
  context.storage_.reset();
  TANDEM_ASSIGN_OR_RETURN(context.storage_, backend_->NewStorage());
  context.on_device_ = device_ != Device::kCpu;
  return absl::OkStatus();
}

std::string DFlashModel::Where(const DFlashContext& context) {
  return context.on_device_ ? "on another device or model" : "on the cpu or another model";
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
  // Packed weights (another model's) are checked and packed again from their row-major values.
  if (weights.packed()) weights = weights.Unpacked();
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
  // The drafter's products run on the CPU kernels in the target's weight type.
  weights.PackForCpu(target->weights().packed_head.type());
  return std::unique_ptr<DFlashModel>(
      new DFlashModel(std::move(config), std::move(weights), target));
}

absl::Status DFlashModel::AppendContext(DFlashContext& context, std::span<const float> hidden,
                                        int n) const {
  const ModelConfig& c = config_.model;
  const int h = c.hidden_size;
  const int k = static_cast<int>(config_.target_layer_ids.size());
  if (n < 0 || hidden.size() != static_cast<size_t>(k) * n * h) {
    return absl::InvalidArgumentError(absl::StrCat("DFlash context: got ", hidden.size(),
                                                   " hidden values for ", n, " tokens, expected [",
                                                   k, ", ", n, ", ", h, "]"));
  }
  TANDEM_RETURN_IF_ERROR(Bind(context));
  if (n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(backend_->AppendHost(*context.storage_, context.length_, hidden, n));
  context.length_ += n;
  return absl::OkStatus();
}

absl::Status DFlashModel::AppendContextDevice(DFlashContext& context, const void* rows, int n,
                                              CUstream_st* stream) const {
  if (device_ == Device::kCpu) {
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
  if (context.length_ == 0) {
    const int layers = config_.model.num_layers;
    keys.assign(layers, {});
    values.assign(layers, {});
    return absl::OkStatus();
  }
  if (!Holds(context)) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash context: its rows are ", Where(context), ", which this model (on ",
                     std::string(DeviceName(device_)), ") does not hold"));
  }
  return backend_->Read(*context.storage_, context.length_, keys, values);
}

void DFlashModel::TruncateContext(DFlashContext& context, int length) {
  if (length >= context.length_) return;
  // Rows past the length are overwritten by later appends, on every backend.
  context.length_ = std::max(length, 0);
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
  if (context.length_ > 0 && !Holds(context)) {
    return absl::FailedPreconditionError(
        absl::StrCat("DFlash block: the context's ", context.length_, " rows are ", Where(context),
                     " but the model runs on ", std::string(DeviceName(device_))));
  }
  std::vector<int32_t> block(clean.begin(), clean.end());
  block.resize(b, config_.mask_token_id);
  return block;
}

absl::StatusOr<std::vector<float>> DFlashModel::BlockLogits(const DFlashContext& context,
                                                            std::span<const int32_t> clean) const {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> block, BlockTokens(context, clean));
  return backend_->BlockLogits(context.length_ > 0 ? context.storage_.get() : nullptr,
                               context.length_, block);
}

absl::StatusOr<std::vector<int32_t>> DFlashModel::Draft(const DFlashContext& context,
                                                        std::span<const int32_t> clean) const {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> block, BlockTokens(context, clean));
  return backend_->Draft(context.length_ > 0 ? context.storage_.get() : nullptr, context.length_,
                         block, static_cast<int>(clean.size()));
}

}  // namespace tandem
