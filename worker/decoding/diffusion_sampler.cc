#include "worker/decoding/diffusion_sampler.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/model_config.h"
#include "worker/model/checkpoint/safetensors.h"

namespace tandem {

constexpr int kFixedFeatures = 10;  // every feature but the token features
constexpr int kMaxSamplerBlock = 256;
constexpr int kMaxSamplerWidth = 1024;

SlotSummary SummarizeSlot(std::span<const float> logits, int32_t mask_token) {
  SlotSummary s;
  float top = -std::numeric_limits<float>::infinity();
  for (size_t v = 0; v < logits.size(); ++v) {
    if (static_cast<int32_t>(v) != mask_token) top = std::max(top, logits[v]);
  }
  double sum = 0;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (static_cast<int32_t>(v) != mask_token)
      sum += std::exp(static_cast<double>(logits[v]) - top);
  }
  double entropy = 0;
  for (size_t v = 0; v < logits.size(); ++v) {
    const int32_t token = static_cast<int32_t>(v);
    if (token == mask_token) continue;
    const double p = std::exp(static_cast<double>(logits[v]) - top) / sum;
    if (p > 0) entropy -= p * std::log(p);
    // Insert into the top three (ties keep the lower id first, as argmax does).
    for (int k = 0; k < 3; ++k) {
      if (s.top[k] < 0 || p > s.prob[k]) {
        for (int m = 2; m > k; --m) {
          s.top[m] = s.top[m - 1];
          s.prob[m] = s.prob[m - 1];
        }
        s.top[k] = token;
        s.prob[k] = static_cast<float>(p);
        break;
      }
    }
  }
  s.entropy = static_cast<float>(entropy);
  return s;
}

struct DiffusionSampler::Weights {
  int vocab = 0;
  int32_t mask = 0;
  int dims = 0;  // token feature dims D
  int hidden = 0;
  int layers = 0;
  int heads = 0;
  int ffn = 0;
  int max_block = 0;
  float eps = 1e-5f;
  float threshold = 0.5f;
  std::vector<float> token_features, input_w, input_b, position, norm_w, norm_b, head_w, head_b;
  struct Layer {
    std::vector<float> norm1_w, norm1_b, qkv_w, qkv_b, out_w, out_b, norm2_w, norm2_b, up_w, up_b,
        down_w, down_b;
  };
  std::vector<Layer> layer;

  int features() const { return kFixedFeatures + dims; }
};

namespace {

// y[n, out] = x[n, in] W^T + b, W [out, in].
void Linear(const std::vector<float>& x, int n, int in, const std::vector<float>& w,
            const std::vector<float>& b, int out, std::vector<float>* y) {
  y->assign(static_cast<size_t>(n) * out, 0.0f);
  for (int r = 0; r < n; ++r) {
    const float* xr = x.data() + static_cast<size_t>(r) * in;
    for (int o = 0; o < out; ++o) {
      const float* wo = w.data() + static_cast<size_t>(o) * in;
      float acc = b[o];
      for (int i = 0; i < in; ++i) acc += xr[i] * wo[i];
      (*y)[static_cast<size_t>(r) * out + o] = acc;
    }
  }
}

void LayerNorm(const std::vector<float>& x, int n, int d, const std::vector<float>& w,
               const std::vector<float>& b, float eps, std::vector<float>* y) {
  y->resize(static_cast<size_t>(n) * d);
  for (int r = 0; r < n; ++r) {
    const float* xr = x.data() + static_cast<size_t>(r) * d;
    double mean = 0;
    for (int i = 0; i < d; ++i) mean += xr[i];
    mean /= d;
    double var = 0;
    for (int i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= d;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int i = 0; i < d; ++i) {
      (*y)[static_cast<size_t>(r) * d + i] = static_cast<float>((xr[i] - mean) * inv) * w[i] + b[i];
    }
  }
}

absl::StatusOr<std::vector<float>> Tensor(const SafetensorsFile& file, const std::string& name,
                                          const std::vector<int64_t>& shape) {
  const TensorView* t = file.Find(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": no tensor ", name));
  }
  if (t->shape != shape) {
    std::string want, got;
    for (int64_t s : shape) absl::StrAppend(&want, want.empty() ? "" : ",", s);
    for (int64_t s : t->shape) absl::StrAppend(&got, got.empty() ? "" : ",", s);
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor ", name, " has shape [",
                                                   got, "], expected [", want, "]"));
  }
  std::vector<float> values(static_cast<size_t>(t->NumElements()));
  TANDEM_RETURN_IF_ERROR(ConvertToF32(t->dtype, t->data.data(), values.size(), values.data()));
  return values;
}

absl::StatusOr<int> PositiveField(const nlohmann::json& j, const std::string& path,
                                  const char* name, int max) {
  if (!j.contains(name) || !j[name].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"", name, "\" must be an integer"));
  }
  const int64_t v = j[name].get<int64_t>();
  if (v < 1 || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"", name, "\" must be in [1, ", max, "], got ", v));
  }
  return static_cast<int>(v);
}

absl::StatusOr<float> FloatField(const nlohmann::json& j, const std::string& path, const char* name,
                                 float fallback) {
  if (!j.contains(name)) return fallback;
  if (!j[name].is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"", name, "\" must be a number"));
  }
  return j[name].get<float>();
}

absl::StatusOr<nlohmann::json> ReadConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  nlohmann::json j = nlohmann::json::parse(std::istreambuf_iterator<char>(in),
                                           std::istreambuf_iterator<char>(), nullptr, false);
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return j;
}

}  // namespace

DiffusionSampler::DiffusionSampler(std::unique_ptr<Weights> w) : w_(std::move(w)) {}
DiffusionSampler::~DiffusionSampler() = default;

int DiffusionSampler::max_block() const { return w_->max_block; }
int DiffusionSampler::features() const { return w_->features(); }
float DiffusionSampler::suggested_threshold() const { return w_->threshold; }

absl::StatusOr<std::unique_ptr<DiffusionSampler>> DiffusionSampler::Load(const std::string& dir,
                                                                         const ModelConfig& model) {
  const std::string config_path = dir + "/config.json";
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ReadConfig(config_path));
  if (j["format"] != "tandem-diffusion-sampler" || j["version"] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path,
        ": not a tandem-diffusion-sampler version 1 config (\"format\", \"version\")"));
  }
  auto w = std::make_unique<Weights>();
  TANDEM_ASSIGN_OR_RETURN(w->vocab, PositiveField(j, config_path, "vocab_size", 1 << 24));
  TANDEM_ASSIGN_OR_RETURN(int mask, PositiveField(j, config_path, "mask_token_id", 1 << 24));
  w->mask = mask;
  TANDEM_ASSIGN_OR_RETURN(w->dims, PositiveField(j, config_path, "token_feature_dims", 256));
  TANDEM_ASSIGN_OR_RETURN(w->hidden, PositiveField(j, config_path, "hidden", kMaxSamplerWidth));
  TANDEM_ASSIGN_OR_RETURN(w->layers, PositiveField(j, config_path, "layers", 16));
  TANDEM_ASSIGN_OR_RETURN(w->heads, PositiveField(j, config_path, "heads", 64));
  TANDEM_ASSIGN_OR_RETURN(w->ffn, PositiveField(j, config_path, "ffn", 4 * kMaxSamplerWidth));
  TANDEM_ASSIGN_OR_RETURN(w->max_block,
                          PositiveField(j, config_path, "max_block", kMaxSamplerBlock));
  TANDEM_ASSIGN_OR_RETURN(w->eps, FloatField(j, config_path, "layer_norm_eps", 1e-5f));
  TANDEM_ASSIGN_OR_RETURN(w->threshold, FloatField(j, config_path, "threshold", 0.5f));
  if (w->hidden % w->heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": hidden ", w->hidden,
                                                   " is not a multiple of heads ", w->heads));
  }
  if (!(w->threshold > 0.0f && w->threshold <= 1.0f) || !(w->eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": threshold must be in (0, 1] and layer_norm_eps positive"));
  }
  if (w->vocab != model.vocab_size || !model.diffusion.mask_token_id ||
      *model.diffusion.mask_token_id != w->mask) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": the sampler was trained for vocab_size ", w->vocab, " and <|mask|> ",
        w->mask, "; the model has ", model.vocab_size, " and ",
        model.diffusion.mask_token_id ? absl::StrCat(*model.diffusion.mask_token_id) : "none"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                          SafetensorsFile::Open(dir + "/model.safetensors"));
  const int64_t d = w->hidden;
  const int64_t ffn = w->ffn;
  TANDEM_ASSIGN_OR_RETURN(w->token_features, Tensor(*file, "token_features", {w->vocab, w->dims}));
  TANDEM_ASSIGN_OR_RETURN(w->input_w, Tensor(*file, "input.weight", {d, w->features()}));
  TANDEM_ASSIGN_OR_RETURN(w->input_b, Tensor(*file, "input.bias", {d}));
  TANDEM_ASSIGN_OR_RETURN(w->position, Tensor(*file, "position", {w->max_block, d}));
  TANDEM_ASSIGN_OR_RETURN(w->norm_w, Tensor(*file, "norm.weight", {d}));
  TANDEM_ASSIGN_OR_RETURN(w->norm_b, Tensor(*file, "norm.bias", {d}));
  TANDEM_ASSIGN_OR_RETURN(w->head_w, Tensor(*file, "head.weight", {1, d}));
  TANDEM_ASSIGN_OR_RETURN(w->head_b, Tensor(*file, "head.bias", {1}));
  w->layer.resize(w->layers);
  for (int l = 0; l < w->layers; ++l) {
    Weights::Layer& L = w->layer[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    TANDEM_ASSIGN_OR_RETURN(L.norm1_w, Tensor(*file, p + "norm1.weight", {d}));
    TANDEM_ASSIGN_OR_RETURN(L.norm1_b, Tensor(*file, p + "norm1.bias", {d}));
    TANDEM_ASSIGN_OR_RETURN(L.qkv_w, Tensor(*file, p + "attn.qkv.weight", {3 * d, d}));
    TANDEM_ASSIGN_OR_RETURN(L.qkv_b, Tensor(*file, p + "attn.qkv.bias", {3 * d}));
    TANDEM_ASSIGN_OR_RETURN(L.out_w, Tensor(*file, p + "attn.out.weight", {d, d}));
    TANDEM_ASSIGN_OR_RETURN(L.out_b, Tensor(*file, p + "attn.out.bias", {d}));
    TANDEM_ASSIGN_OR_RETURN(L.norm2_w, Tensor(*file, p + "norm2.weight", {d}));
    TANDEM_ASSIGN_OR_RETURN(L.norm2_b, Tensor(*file, p + "norm2.bias", {d}));
    TANDEM_ASSIGN_OR_RETURN(L.up_w, Tensor(*file, p + "mlp.up.weight", {ffn, d}));
    TANDEM_ASSIGN_OR_RETURN(L.up_b, Tensor(*file, p + "mlp.up.bias", {ffn}));
    TANDEM_ASSIGN_OR_RETURN(L.down_w, Tensor(*file, p + "mlp.down.weight", {d, ffn}));
    TANDEM_ASSIGN_OR_RETURN(L.down_b, Tensor(*file, p + "mlp.down.bias", {d}));
  }
  return std::unique_ptr<DiffusionSampler>(new DiffusionSampler(std::move(w)));
}

absl::StatusOr<std::vector<float>> DiffusionSampler::Features(
    std::span<const int32_t> block, std::span<const SlotSummary> masked) const {
  const int n = static_cast<int>(block.size());
  if (n < 1 || n > w_->max_block) {
    return absl::InvalidArgumentError(absl::StrCat("the diffusion sampler takes blocks of 1 to ",
                                                   w_->max_block, " slots, got ", n));
  }
  const int masked_slots = static_cast<int>(std::count(block.begin(), block.end(), w_->mask));
  if (masked_slots != static_cast<int>(masked.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the block has ", masked_slots, " masked slots but ", masked.size(), " slot summaries"));
  }
  const int f = w_->features();
  const float log_vocab = std::log(static_cast<float>(std::max(2, w_->vocab - 1)));
  std::vector<float> x(static_cast<size_t>(n) * f, 0.0f);
  size_t next = 0;
  for (int i = 0; i < n; ++i) {
    float* row = x.data() + static_cast<size_t>(i) * f;
    int32_t token = block[i];
    if (token == w_->mask) {
      const SlotSummary& s = masked[next++];
      row[0] = 1.0f;
      row[1] = s.prob[0];
      row[2] = s.prob[1];
      row[3] = s.prob[2];
      row[4] = s.prob[0] - s.prob[1];
      row[5] = s.prob[0] + s.prob[1] + s.prob[2];
      row[6] = s.entropy / log_vocab;
      token = s.top[0];
    }
    if (token < 0 || token >= w_->vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", i, " holds token ", token, " outside the sampler's vocabulary"));
    }
    std::copy_n(w_->token_features.data() + static_cast<size_t>(token) * w_->dims, w_->dims,
                row + 7);
    row[7 + w_->dims] = static_cast<float>(i) / n;
    row[8 + w_->dims] = static_cast<float>(n) / w_->max_block;
    row[9 + w_->dims] = static_cast<float>(masked_slots) / n;
  }
  return x;
}

absl::StatusOr<std::vector<float>> DiffusionSampler::Score(
    std::span<const int32_t> block, std::span<const SlotSummary> masked) const {
  TANDEM_ASSIGN_OR_RETURN(std::vector<float> features, Features(block, masked));
  const Weights& w = *w_;
  const int n = static_cast<int>(block.size());
  const int d = w.hidden;
  const int dh = d / w.heads;
  std::vector<float> x, h, qkv, attn(static_cast<size_t>(n) * d), proj, up;
  Linear(features, n, w.features(), w.input_w, w.input_b, d, &x);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < d; ++c) x[static_cast<size_t>(i) * d + c] += w.position[i * d + c];
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  std::vector<float> scores(n);
  for (const Weights::Layer& L : w.layer) {
    LayerNorm(x, n, d, L.norm1_w, L.norm1_b, w.eps, &h);
    Linear(h, n, d, L.qkv_w, L.qkv_b, 3 * d, &qkv);
    for (int head = 0; head < w.heads; ++head) {
      for (int i = 0; i < n; ++i) {
        const float* q = qkv.data() + static_cast<size_t>(i) * 3 * d + head * dh;
        float top = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < n; ++j) {
          const float* k = qkv.data() + static_cast<size_t>(j) * 3 * d + d + head * dh;
          float dot = 0;
          for (int c = 0; c < dh; ++c) dot += q[c] * k[c];
          scores[j] = dot * scale;
          top = std::max(top, scores[j]);
        }
        float sum = 0;
        for (int j = 0; j < n; ++j) {
          scores[j] = std::exp(scores[j] - top);
          sum += scores[j];
        }
        float* o = attn.data() + static_cast<size_t>(i) * d + head * dh;
        std::fill_n(o, dh, 0.0f);
        for (int j = 0; j < n; ++j) {
          const float* v = qkv.data() + static_cast<size_t>(j) * 3 * d + 2 * d + head * dh;
          const float a = scores[j] / sum;
          for (int c = 0; c < dh; ++c) o[c] += a * v[c];
        }
      }
    }
    Linear(attn, n, d, L.out_w, L.out_b, d, &proj);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    LayerNorm(x, n, d, L.norm2_w, L.norm2_b, w.eps, &h);
    Linear(h, n, d, L.up_w, L.up_b, w.ffn, &up);
    for (float& u : up) u = std::max(u, 0.0f);
    Linear(up, n, w.ffn, L.down_w, L.down_b, d, &proj);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  LayerNorm(x, n, d, w.norm_w, w.norm_b, w.eps, &h);
  std::vector<float> logit;
  Linear(h, n, d, w.head_w, w.head_b, 1, &logit);
  std::vector<float> p(n, 0.0f);
  for (int i = 0; i < n; ++i) {
    if (block[i] == w.mask) p[i] = 1.0f / (1.0f + std::exp(-logit[i]));
  }
  return p;
}

}  // namespace tandem
