// The DFlash drafter against a dense double-precision reference written from the method's
// definition (context features, context/block K/V, bidirectional block attention, the target's
// embeddings and head), incremental context, checkpoint/config errors, and the trained drafter
// against PyTorch's fixtures.
#include "worker/model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/model/checkpoint/temp_dir.h"
#include "tests/worker/model/dflash_checkpoint.h"

namespace tandem {
namespace {

using testing::DFlashSpec;
using ::testing::HasSubstr;
using testing::RawTensors;

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;  // [rows][cols]

ModelConfig TargetConfig() {
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.qk_norm = true;
  c.tie_word_embeddings = false;  // the head differs from the embeddings
  return c;
}

// x [n][in] · W^T, W the raw [out, in] tensor.
Mat Mul(const Mat& x, const testing::RawTensor& w) {
  const size_t out = w.shape[0], in = w.shape[1];
  Mat y(x.size(), Vec(out, 0.0));
  for (size_t r = 0; r < x.size(); ++r) {
    for (size_t o = 0; o < out; ++o) {
      double s = 0;
      for (size_t i = 0; i < in; ++i) s += x[r][i] * w.values[o * in + i];
      y[r][o] = s;
    }
  }
  return y;
}

// RMSNorm over each `dim`-wide group of a row.
Mat Norm(Mat x, const std::vector<float>& w, int dim, double eps) {
  for (Vec& row : x) {
    for (size_t g = 0; g < row.size(); g += dim) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += row[g + i] * row[g + i];
      const double inv = 1.0 / std::sqrt(ss / dim + eps);
      for (int i = 0; i < dim; ++i) row[g + i] *= inv * w[i];
    }
  }
  return x;
}

// Rotate-half RoPE on every head of a row at `pos`.
void Rope(Vec& row, int head_dim, int pos, double theta) {
  const int half = head_dim / 2;
  for (size_t g = 0; g < row.size(); g += head_dim) {
    for (int i = 0; i < half; ++i) {
      const double f = std::pow(theta, -2.0 * i / head_dim) * pos;
      const double x1 = row[g + i], x2 = row[g + i + half];
      row[g + i] = x1 * std::cos(f) - x2 * std::sin(f);
      row[g + i + half] = x2 * std::cos(f) + x1 * std::sin(f);
    }
  }
}

// Block logits [B][vocab] straight from the definition. hidden: [k][p][H].
Mat Reference(const DFlashSpec& s, const RawTensors& t, const ModelWeights& target,
              const std::vector<std::vector<std::vector<float>>>& hidden,
              const std::vector<int32_t>& clean) {
  const int h = s.hidden_size, d = s.head_dim, hq = s.num_heads, hkv = s.num_kv_heads;
  const int b = s.block_size, k = static_cast<int>(s.target_layer_ids.size());
  const int p = hidden.empty() ? 0 : static_cast<int>(hidden[0].size());
  Mat fused(p, Vec(k * h));
  for (int i = 0; i < p; ++i) {
    for (int l = 0; l < k; ++l) {
      for (int j = 0; j < h; ++j) fused[i][l * h + j] = hidden[l][i][j];
    }
  }
  const Mat c =
      Norm(Mul(fused, t.at("fc.weight")), t.at("hidden_norm.weight").values, h, s.rms_norm_eps);
  Mat x(b, Vec(h));
  for (int j = 0; j < b; ++j) {
    const int token = j < static_cast<int>(clean.size()) ? clean[j] : s.mask_token_id;
    std::vector<float> row(h);
    target.EmbedRow(token, row.data());
    x[j].assign(row.begin(), row.end());
  }
  for (int layer = 0; layer < s.num_layers; ++layer) {
    const std::string pre = "layers." + std::to_string(layer) + ".";
    auto w = [&](const std::string& name) -> const testing::RawTensor& { return t.at(pre + name); };
    const Mat hn = Norm(x, w("input_layernorm.weight").values, h, s.rms_norm_eps);
    Mat q = Norm(Mul(hn, w("self_attn.q_proj.weight")), w("self_attn.q_norm.weight").values, d,
                 s.rms_norm_eps);
    Mat keys = Norm(Mul(c, w("self_attn.k_proj.weight")), w("self_attn.k_norm.weight").values, d,
                    s.rms_norm_eps);
    Mat values = Mul(c, w("self_attn.v_proj.weight"));
    const Mat kb = Norm(Mul(hn, w("self_attn.k_proj.weight")), w("self_attn.k_norm.weight").values,
                        d, s.rms_norm_eps);
    const Mat vb = Mul(hn, w("self_attn.v_proj.weight"));
    keys.insert(keys.end(), kb.begin(), kb.end());
    values.insert(values.end(), vb.begin(), vb.end());
    for (int i = 0; i < p + b; ++i) Rope(keys[i], d, i, s.rope_theta);
    for (int j = 0; j < b; ++j) Rope(q[j], d, p + j, s.rope_theta);
    Mat attn(b, Vec(hq * d, 0.0));
    for (int j = 0; j < b; ++j) {
      for (int head = 0; head < hq; ++head) {
        const int kvh = head / (hq / hkv);
        Vec score(p + b);
        double mx = -1e300;
        for (int i = 0; i < p + b; ++i) {
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += q[j][head * d + e] * keys[i][kvh * d + e];
          score[i] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, score[i]);
        }
        double z = 0;
        for (double& sc : score) z += (sc = std::exp(sc - mx));
        for (int i = 0; i < p + b; ++i) {
          for (int e = 0; e < d; ++e)
            attn[j][head * d + e] += score[i] / z * values[i][kvh * d + e];
        }
      }
    }
    const Mat o = Mul(attn, w("self_attn.o_proj.weight"));
    for (int j = 0; j < b; ++j) {
      for (int i = 0; i < h; ++i) x[j][i] += o[j][i];
    }
    const Mat hn2 = Norm(x, w("post_attention_layernorm.weight").values, h, s.rms_norm_eps);
    const Mat gate = Mul(hn2, w("mlp.gate_proj.weight")), up = Mul(hn2, w("mlp.up_proj.weight"));
    Mat act(b, Vec(s.intermediate_size));
    for (int j = 0; j < b; ++j) {
      for (int i = 0; i < s.intermediate_size; ++i) {
        act[j][i] = gate[j][i] / (1.0 + std::exp(-gate[j][i])) * up[j][i];
      }
    }
    const Mat down = Mul(act, w("mlp.down_proj.weight"));
    for (int j = 0; j < b; ++j) {
      for (int i = 0; i < h; ++i) x[j][i] += down[j][i];
    }
  }
  const Mat fin = Norm(x, t.at("norm.weight").values, h, s.rms_norm_eps);
  std::vector<float> head_values = target.HeadRowMajor();  // the target is packed for the CPU
  if (head_values.empty()) head_values = target.EmbedRowMajor();
  testing::RawTensor head{{s.vocab_size, h}, head_values};
  return Mul(fin, head);
}

class DFlashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig tc = TargetConfig();
    target_ = Transformer::FromWeights(tc, RandomWeights(tc, 5, 0.3f));
    tensors_ = testing::RandomDFlashTensors(spec_, 17, 0.3f);
  }

  absl::StatusOr<std::unique_ptr<DFlashModel>> Load(const std::string& config,
                                                    const RawTensors& tensors) {
    EXPECT_TRUE(testing::WriteDFlashCheckpoint(dir_.path().string(), config, tensors).ok());
    return DFlashModel::Load(dir_.path().string(), target_.get());
  }

  // [k][n][H] random rows and their flat [k, n, H] layout.
  std::vector<std::vector<std::vector<float>>> RandomRows(int n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::vector<std::vector<float>>> rows(
        spec_.target_layer_ids.size(),
        std::vector<std::vector<float>>(n, std::vector<float>(spec_.hidden_size)));
    for (auto& layer : rows) {
      for (auto& row : layer) {
        for (float& x : row) x = normal(rng);
      }
    }
    return rows;
  }
  static std::vector<float> Flat(const std::vector<std::vector<std::vector<float>>>& rows, int from,
                                 int to) {
    std::vector<float> flat;
    for (const auto& layer : rows) {
      for (int t = from; t < to; ++t) flat.insert(flat.end(), layer[t].begin(), layer[t].end());
    }
    return flat;
  }

  DFlashSpec spec_;
  RawTensors tensors_;
  std::unique_ptr<Transformer> target_;
  tandem::test::TempDir dir_;
};

TEST_F(DFlashTest, BlockLogitsMatchDenseReference) {
  for (int kv_heads : {2, 4, 1}) {  // GQA groups of 2, plain MHA, MQA
    spec_.num_kv_heads = kv_heads;
    tensors_ = testing::RandomDFlashTensors(spec_, 17 + kv_heads, 0.3f);
    auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
    ASSERT_TRUE(model.ok()) << model.status();
    std::mt19937 rng(kv_heads);
    for (auto [p, a] : {std::pair{0, 1}, {1, 1}, {5, 1}, {7, 2}, {9, 3}, {2, 5}}) {
      const auto rows = RandomRows(p, rng);
      DFlashContext context;
      ASSERT_TRUE((*model)->AppendContext(context, Flat(rows, 0, p), p).ok());
      std::vector<int32_t> clean(a);
      for (int32_t& tok : clean) tok = static_cast<int32_t>(rng() % spec_.vocab_size);
      auto logits = (*model)->BlockLogits(context, clean);
      ASSERT_TRUE(logits.ok()) << logits.status();
      const Mat want = Reference(spec_, tensors_, target_->weights(), rows, clean);
      double worst = 0;
      for (int j = 0; j < spec_.block_size; ++j) {
        for (int v = 0; v < spec_.vocab_size; ++v) {
          const double got = (*logits)[static_cast<size_t>(j) * spec_.vocab_size + v];
          worst = std::max(worst, std::abs(got - want[j][v]) / std::max(1.0, std::abs(want[j][v])));
        }
      }
      EXPECT_LT(worst, 1e-4) << "kv_heads " << kv_heads << " p " << p << " a " << a;
      auto drafts = (*model)->Draft(context, clean);
      ASSERT_TRUE(drafts.ok());
      ASSERT_EQ(drafts->size(), static_cast<size_t>(spec_.block_size - a));
      for (int j = a; j < spec_.block_size; ++j) {
        const auto& row = want[j];
        const int best = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
        EXPECT_EQ((*drafts)[j - a], best) << "slot " << j;
      }
    }
  }
}

TEST_F(DFlashTest, IncrementalContextEqualsAllAtOnce) {
  auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(3);
  const auto rows = RandomRows(8, rng);
  DFlashContext whole, parts;
  ASSERT_TRUE((*model)->AppendContext(whole, Flat(rows, 0, 8), 8).ok());
  int at = 0;
  for (int n : {3, 1, 0, 4}) {
    ASSERT_TRUE((*model)->AppendContext(parts, Flat(rows, at, at + n), n).ok());
    at += n;
  }
  ASSERT_EQ(parts.length(), 8);
  std::vector<std::vector<float>> whole_keys, whole_values, parts_keys, parts_values;
  ASSERT_TRUE((*model)->ReadContext(whole, whole_keys, whole_values).ok());
  ASSERT_TRUE((*model)->ReadContext(parts, parts_keys, parts_values).ok());
  ASSERT_EQ(whole_keys.size(), static_cast<size_t>(spec_.num_layers));
  for (size_t l = 0; l < whole_keys.size(); ++l) {
    ASSERT_EQ(whole_keys[l].size(), parts_keys[l].size());
    for (size_t i = 0; i < whole_keys[l].size(); ++i) {
      EXPECT_NEAR(whole_keys[l][i], parts_keys[l][i], 1e-5);
      EXPECT_NEAR(whole_values[l][i], parts_values[l][i], 1e-5);
    }
  }
  const std::vector<int32_t> clean = {4, 9};
  auto a = (*model)->BlockLogits(whole, clean);
  auto b = (*model)->BlockLogits(parts, clean);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_NEAR((*a)[i], (*b)[i], 1e-4);
  // Truncating and re-appending restores the same context.
  DFlashModel::TruncateContext(parts, 5);
  EXPECT_EQ(parts.length(), 5);
  ASSERT_TRUE((*model)->AppendContext(parts, Flat(rows, 5, 8), 3).ok());
  auto c = (*model)->BlockLogits(parts, clean);
  ASSERT_TRUE(c.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_NEAR((*a)[i], (*c)[i], 1e-4);
}

// Host-side bookkeeping of a context: length, truncation bounds, the rows ReadContext returns.
// The drafter's matrices are packed once, in its target's weight type; their row-major values
// come back exactly, and a model made from another's (packed) weights drafts the same bits.
TEST_F(DFlashTest, WeightsArePackedInTheTargetsTypeAndReadBackExactly) {
  auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
  ASSERT_TRUE(model.ok()) << model.status();
  const DFlashWeights& w = (*model)->weights();
  ASSERT_TRUE(w.packed());
  EXPECT_TRUE(w.fc.empty());
  EXPECT_TRUE(w.layers[0].qkv.empty());
  EXPECT_EQ(w.packed_fc.type(), kernels::cpu::WeightType::kF32);
  EXPECT_EQ(w.FcRowMajor(), tensors_.at("fc.weight").values);
  EXPECT_EQ(w.RowMajorLayer(0).o, tensors_.at("layers.0.self_attn.o_proj.weight").values);
  EXPECT_EQ(w.RowMajorLayer(0).down, tensors_.at("layers.0.mlp.down_proj.weight").values);

  auto copy = DFlashModel::Create((*model)->config(), w, target_.get());
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::mt19937 rng(3);
  const auto rows = RandomRows(7, rng);
  DFlashContext a, b;
  ASSERT_TRUE((*model)->AppendContext(a, Flat(rows, 0, 7), 7).ok());
  ASSERT_TRUE((*copy)->AppendContext(b, Flat(rows, 0, 7), 7).ok());
  const std::vector<int32_t> clean = {3, 1};
  auto want = (*model)->BlockLogits(a, clean);
  auto got = (*copy)->BlockLogits(b, clean);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(*got, *want);

  // A bf16 target: the drafter's products hold bf16 too.
  const ModelConfig tc = TargetConfig();
  std::unique_ptr<Transformer> bf16_target =
      Transformer::FromWeights(tc, RandomWeights(tc, 5, 0.3f), kernels::cpu::WeightType::kBf16);
  auto bf16 = DFlashModel::Create((*model)->config(), w, bf16_target.get());
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->weights().packed_fc.type(), kernels::cpu::WeightType::kBf16);
  DFlashContext c;
  ASSERT_TRUE((*bf16)->AppendContext(c, Flat(rows, 0, 7), 7).ok());
  auto logits = (*bf16)->BlockLogits(c, clean);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(logits->size(), want->size());
}

TEST_F(DFlashTest, ContextBookkeeping) {
  auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
  ASSERT_TRUE(model.ok()) << model.status();
  const size_t kv_row = static_cast<size_t>(spec_.num_kv_heads) * spec_.head_dim;
  DFlashContext context;
  EXPECT_EQ(context.length(), 0);
  EXPECT_FALSE(context.on_device());
  std::vector<std::vector<float>> keys, values;
  ASSERT_TRUE((*model)->ReadContext(context, keys, values).ok());
  ASSERT_EQ(keys.size(), static_cast<size_t>(spec_.num_layers));
  EXPECT_TRUE(keys[0].empty());
  std::mt19937 rng(8);
  const auto rows = RandomRows(6, rng);
  ASSERT_TRUE((*model)->AppendContext(context, Flat(rows, 0, 6), 6).ok());
  EXPECT_EQ(context.length(), 6);
  EXPECT_FALSE(context.on_device());
  DFlashModel::TruncateContext(context, 9);  // past the end: unchanged
  EXPECT_EQ(context.length(), 6);
  ASSERT_TRUE((*model)->ReadContext(context, keys, values).ok());
  const std::vector<float> first_keys = keys[1];
  ASSERT_EQ(first_keys.size(), 6 * kv_row);
  DFlashModel::TruncateContext(context, 4);
  EXPECT_EQ(context.length(), 4);
  ASSERT_TRUE((*model)->ReadContext(context, keys, values).ok());
  ASSERT_EQ(keys[1].size(), 4 * kv_row);
  ASSERT_EQ(values[1].size(), 4 * kv_row);
  EXPECT_TRUE(std::equal(keys[1].begin(), keys[1].end(), first_keys.begin()));
  DFlashModel::TruncateContext(context, -3);  // clamps to empty
  EXPECT_EQ(context.length(), 0);
  // A moved context keeps its rows.
  ASSERT_TRUE((*model)->AppendContext(context, Flat(rows, 0, 2), 2).ok());
  DFlashContext moved = std::move(context);
  EXPECT_EQ(moved.length(), 2);
  ASSERT_TRUE((*model)->ReadContext(moved, keys, values).ok());
  EXPECT_EQ(keys[0].size(), 2 * kv_row);
}

// Device rows need the model on CUDA; on the CPU the call is refused and the context unchanged.
TEST_F(DFlashTest, DeviceRowsNeedTheModelOnCuda) {
  auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
  ASSERT_TRUE(model.ok()) << model.status();
  DFlashContext context;
  const absl::Status status = (*model)->AppendContextDevice(context, nullptr, 3, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("UseDevice"));
  EXPECT_EQ(context.length(), 0);
  EXPECT_EQ((*model)->device(), Device::kCpu);
}

// --device cuda where it cannot run (a build without CUDA, or no GPU): UseDevice gives
// CheckDeviceAvailable's error and the model keeps drafting on the CPU.
TEST_F(DFlashTest, UseDeviceWithoutAGpuKeepsTheCpu) {
  auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->UseDevice({.device = Device::kCpu}).ok());
  const absl::Status available = CheckDeviceAvailable(Device::kCuda);
  if (available.ok()) GTEST_SKIP() << "a CUDA device is visible (cuda_dflash_test covers it)";
  const absl::Status status = (*model)->UseDevice({.device = Device::kCuda});
  EXPECT_EQ(status.code(), available.code());
  EXPECT_EQ(status.message(), available.message());
  EXPECT_EQ((*model)->device(), Device::kCpu);
  std::mt19937 rng(2);
  DFlashContext context;
  ASSERT_TRUE((*model)->AppendContext(context, Flat(RandomRows(3, rng), 0, 3), 3).ok());
  EXPECT_FALSE(context.on_device());
  EXPECT_TRUE((*model)->Draft(context, std::vector<int32_t>{5}).ok());
}

TEST_F(DFlashTest, Bf16CheckpointLoads) {
  ASSERT_TRUE(testing::WriteDFlashCheckpoint(dir_.path().string(), testing::DFlashConfigJson(spec_),
                                             tensors_, DType::kBF16)
                  .ok());
  EXPECT_TRUE(IsDFlashCheckpoint(dir_.path().string()));
  auto model = DFlashModel::Load(dir_.path().string(), target_.get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config().target_layer_ids, (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ((*model)->config().max_anchor, 3);
  EXPECT_EQ((*model)->config().block_size, 6);
}

TEST_F(DFlashTest, ConfigAndShapeErrorsNameTheCulprit) {
  auto error = [&](const DFlashSpec& s, const RawTensors& t) {
    auto m = Load(testing::DFlashConfigJson(s), t);
    EXPECT_FALSE(m.ok());
    return m.ok() ? std::string() : std::string(m.status().message());
  };
  DFlashSpec s = spec_;
  s.target_layer_ids = {1, 4};  // the target has 3 layers
  EXPECT_THAT(error(s, testing::RandomDFlashTensors(s, 1, 0.1f)), HasSubstr("target_layer_ids"));
  s = spec_;
  s.hidden_size = 24;
  EXPECT_THAT(error(s, testing::RandomDFlashTensors(s, 1, 0.1f)), HasSubstr("hidden_size"));
  s = spec_;
  s.max_anchor = 6;
  EXPECT_THAT(error(s, tensors_), HasSubstr("max_anchor"));
  s = spec_;
  s.mask_token_id = 97;
  EXPECT_THAT(error(s, tensors_), HasSubstr("mask_token_id"));
  s = spec_;
  s.vocab_size = 98;
  s.mask_token_id = 5;
  EXPECT_THAT(error(s, tensors_), HasSubstr("vocab_size"));

  RawTensors missing = tensors_;
  missing.erase("layers.1.mlp.up_proj.weight");
  EXPECT_THAT(error(spec_, missing), HasSubstr("layers.1.mlp.up_proj.weight"));
  RawTensors wrong = tensors_;
  wrong["fc.weight"].shape = {32, 64};
  wrong["fc.weight"].values.resize(32 * 64);
  EXPECT_THAT(error(spec_, wrong), HasSubstr("fc.weight"));

  std::string no_dflash = testing::DFlashConfigJson(spec_);
  no_dflash = no_dflash.substr(0, no_dflash.find(", \"dflash\"")) + "}";
  EXPECT_THAT(std::string(Load(no_dflash, tensors_).status().message()), HasSubstr("dflash"));
  std::string plain = testing::DFlashConfigJson(spec_);
  plain.replace(plain.find("TandemDFlashDrafter"), 19, "Qwen3ForCausalLM");
  EXPECT_THAT(std::string(Load(plain, tensors_).status().message()),
              HasSubstr("TandemDFlashDrafter"));
  EXPECT_FALSE(IsDFlashCheckpoint(dir_.path().string()));

  auto model = Load(testing::DFlashConfigJson(spec_), tensors_);
  ASSERT_TRUE(model.ok()) << model.status();
  DFlashContext context;
  EXPECT_THAT(std::string((*model)->AppendContext(context, std::vector<float>(10), 2).message()),
              HasSubstr("hidden values"));
  EXPECT_FALSE((*model)->BlockLogits(context, {}).ok());
  EXPECT_FALSE((*model)->BlockLogits(context, std::vector<int32_t>{97}).ok());
  EXPECT_FALSE((*model)->BlockLogits(context, std::vector<int32_t>(7, 1)).ok());
}

// The trained drafter's drafts and logits against PyTorch's (fixtures/drafts.json of
// models/tandem-dflash, computed in fp32 from the bf16 weights): the context comes from the
// bundled target's own taps, as in serving.
TEST(DFlashBundledTest, MatchesPyTorchFixtures) {
  const std::string root = std::string(TANDEM_SOURCE_DIR) + "/models/";
  auto target = Transformer::Load(root + "tandem-target");
  ASSERT_TRUE(target.ok()) << target.status();
  auto model = DFlashModel::Load(root + "tandem-dflash", target->get());
  ASSERT_TRUE(model.ok()) << model.status();
  std::ifstream in(root + "tandem-dflash/fixtures/drafts.json");
  ASSERT_TRUE(in.good()) << "missing fixtures/drafts.json";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const DFlashConfig& c = (*model)->config();
  ASSERT_EQ(fixture["block_size"].get<int>(), c.block_size);
  ASSERT_EQ(fixture["mask_token_id"].get<int>(), c.mask_token_id);
  ASSERT_EQ(fixture["target_layer_ids"].get<std::vector<int32_t>>(), c.target_layer_ids);
  const int h = c.model.hidden_size, vocab = c.model.vocab_size;
  const int k = static_cast<int>(c.target_layer_ids.size());
  int cases = 0, compared_drafts = 0;
  double worst_logit = 0;
  for (const nlohmann::json& prompt : fixture["prompts"]) {
    const std::vector<int32_t> tokens = prompt["tokens"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(tokens.size());
    // The target's taps of every token from one causal forward.
    KvCache kv((*target)->KvOptions(n + 16, 16));
    ASSERT_TRUE(kv.AddSequence(1).ok());
    ASSERT_TRUE(kv.Reserve(1, n).has_value());
    std::vector<int32_t> positions(n);
    for (int i = 0; i < n; ++i) positions[i] = i;
    Extend extend{
        .seq = 1, .tokens = tokens, .positions = positions, .hidden_layers = c.target_layer_ids};
    auto out = (*target)->Forward({&extend, 1}, kv);
    ASSERT_TRUE(out.ok()) << out.status();
    for (const nlohmann::json& fc : prompt["cases"]) {
      const int p = fc["p"].get<int>(), a = fc["a"].get<int>();
      std::vector<float> rows;
      for (int l = 0; l < k; ++l) {
        const float* begin = (*out)[0].hidden.data() + static_cast<size_t>(l) * n * h;
        rows.insert(rows.end(), begin, begin + static_cast<size_t>(p) * h);
      }
      DFlashContext context;
      ASSERT_TRUE((*model)->AppendContext(context, rows, p).ok());
      const std::span<const int32_t> clean = std::span(tokens).subspan(p, a);
      auto logits = (*model)->BlockLogits(context, clean);
      ASSERT_TRUE(logits.ok()) << logits.status();
      auto drafts = (*model)->Draft(context, clean);
      ASSERT_TRUE(drafts.ok());
      const auto want = fc["drafts"].get<std::vector<int32_t>>();
      const auto gaps = fc["top2_gaps"].get<std::vector<double>>();
      ASSERT_EQ(drafts->size(), want.size()) << "p " << p << " a " << a;
      for (size_t j = 0; j < want.size(); ++j) {
        // A near tie may flip under a different summation order.
        if (gaps[j] < 1e-3) continue;
        EXPECT_EQ((*drafts)[j], want[j]) << "p " << p << " a " << a << " draft " << j;
        ++compared_drafts;
      }
      const int slot = fc["logits_slot"].get<int>();
      for (const nlohmann::json& top : fc["logits_top"]) {
        const int id = top[0].get<int>();
        const double ref = top[1].get<double>();
        const double got = (*logits)[static_cast<size_t>(slot) * vocab + id];
        worst_logit = std::max(worst_logit, std::abs(got - ref));
        EXPECT_NEAR(got, ref, 2e-3 * std::max(1.0, std::abs(ref)))
            << "p " << p << " a " << a << " slot " << slot << " token " << id;
      }
      ++cases;
    }
  }
  std::printf("[ dflash   ] %d cases, %d drafts compared, worst logit difference %.2e\n", cases,
              compared_drafts, worst_logit);
  EXPECT_GT(cases, 0);
}

}  // namespace
}  // namespace tandem
