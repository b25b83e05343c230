// Logits of the engine against transformers on small random checkpoints (tests/fixtures/models,
// made by tools/fixtures/make_model_fixtures.py): prefill, incremental decode through the KV
// cache, and hidden states.
#include <cstring>

#include "gtest/gtest.h"
#include "worker/model/checkpoint/safetensors.h"
#include "worker/model/transformer.h"

namespace tandem {
namespace {

constexpr double kRelTol = 1e-4;

std::string FixtureDir(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

std::vector<int32_t> Ints(const SafetensorsFile& f, const std::string& name) {
  const TensorView* t = f.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->dtype, DType::kI32);
  std::vector<int32_t> v(t->NumElements());
  std::memcpy(v.data(), t->data.data(), v.size() * sizeof(int32_t));
  return v;
}

std::vector<float> Floats(const SafetensorsFile& f, const std::string& name) {
  const TensorView* t = f.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> v(t->NumElements());
  EXPECT_TRUE(ConvertToF32(t->dtype, t->data.data(), v.size(), v.data()).ok());
  return v;
}

// Relative error with the scale of the whole row, so entries near zero do not dominate.
double RowError(const float* got, const float* want, size_t n) {
  double scale = 0.0, worst = 0.0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  for (size_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  return worst / std::max(scale, 1e-6);
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, PrefillDecodeAndHiddenStatesMatchTransformers) {
  const std::string dir = FixtureDir(GetParam());
  auto model = Transformer::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto expected = SafetensorsFile::Open(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const ModelConfig& c = (*model)->config();
  const size_t vocab = c.vocab_size, hidden = c.hidden_size;

  const std::vector<int32_t> prompt = Ints(**expected, "prompt_ids");
  const std::vector<int32_t> decode = Ints(**expected, "decode_ids");
  const std::vector<float> prefill_logits = Floats(**expected, "prefill_logits");
  const std::vector<float> decode_logits = Floats(**expected, "decode_logits");
  const int t = static_cast<int>(prompt.size());
  ASSERT_EQ(prefill_logits.size(), t * vocab);

  KvCache kv((*model)->KvOptions(256, 4));
  ASSERT_TRUE(kv.AddSequence(1).ok());
  ASSERT_TRUE(kv.Reserve(1, t).has_value());
  std::vector<int32_t> positions(t), outputs(t);
  for (int i = 0; i < t; ++i) positions[i] = outputs[i] = i;
  const std::vector<int32_t> taps = {0, 1};
  Extend prefill{.seq = 1,
                 .tokens = prompt,
                 .positions = positions,
                 .outputs = outputs,
                 .hidden_layers = taps};
  auto out = (*model)->Forward({&prefill, 1}, kv);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < t; ++i) {
    EXPECT_LT(RowError(&(*out)[0].logits[i * vocab], &prefill_logits[i * vocab], vocab), kRelTol)
        << "prefill position " << i;
  }
  for (int tap : taps) {
    const std::vector<float> want = Floats(**expected, "hidden_layer_" + std::to_string(tap));
    ASSERT_EQ(want.size(), t * hidden);
    for (int i = 0; i < t; ++i) {
      EXPECT_LT(RowError(&(*out)[0].hidden[(tap * t + i) * hidden], &want[i * hidden], hidden),
                kRelTol)
          << "hidden layer " << tap << " position " << i;
    }
  }
  ASSERT_TRUE(kv.Commit(1, outputs).ok());

  // Step s feeds decode_ids[s] at position t + s; greedy choices must chain the same way.
  for (size_t s = 0; s < decode.size(); ++s) {
    ASSERT_TRUE(kv.Reserve(1, 1).has_value());
    const std::vector<int32_t> tok = {decode[s]}, pos = {t + static_cast<int32_t>(s)}, o = {0};
    Extend step{.seq = 1, .tokens = tok, .positions = pos, .outputs = o};
    auto r = (*model)->Forward({&step, 1}, kv);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(kv.Commit(1, o).ok());
    EXPECT_LT(RowError((*r)[0].logits.data(), &decode_logits[s * vocab], vocab), kRelTol)
        << "decode step " << s;
    if (s + 1 < decode.size()) {
      const auto& l = (*r)[0].logits;
      EXPECT_EQ(std::max_element(l.begin(), l.end()) - l.begin(), decode[s + 1]) << "step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("qwen2_tiny", "qwen2_tiny_sharded", "qwen3_tiny",
                                           "qwen3_tiny_bf16", "llama_tiny", "llama_linear_rope",
                                           "mistral_tiny"));

}  // namespace
}  // namespace tandem
