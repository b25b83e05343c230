// ComputeRope against transformers (fixture from tools/fixtures/make_rope_fixtures.py).
#include <bit>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/model_config.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

// Distance in representable floats; both arguments finite and of the same sign here.
int64_t UlpDistance(float a, float b) {
  return std::llabs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                    static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

Json LoadCases() {
  const std::string path = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/rope/rope_cases.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return Json::parse(in);
}

// torch evaluates pow with a vectorised routine accurate to 1 ulp; everything else in the
// pipeline follows torch's fp32 operation order, so 2 ulp is the whole budget.
constexpr int64_t kMaxUlp = 2;

TEST(RopeFixtureTest, MatchesTransformersForEveryCase) {
  const Json document = LoadCases();
  ASSERT_GE(document["cases"].size(), 10u);
  for (const Json& c : document["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    absl::StatusOr<ModelConfig> config = ParseModelConfig(c["config"].dump(), name);
    ASSERT_TRUE(config.ok()) << config.status();
    const RopeTables tables = ComputeRope(*config, c["seq_len"].get<int>());
    const std::vector<float> expected = c["inv_freq"].get<std::vector<float>>();
    ASSERT_EQ(tables.inv_freq.size(), expected.size());
    int64_t worst = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      const int64_t ulp = UlpDistance(tables.inv_freq[i], expected[i]);
      EXPECT_LE(ulp, kMaxUlp) << "i=" << i << " got " << tables.inv_freq[i] << " want "
                              << expected[i];
      worst = std::max(worst, ulp);
    }
    RecordProperty(name, static_cast<int>(worst));
    EXPECT_FLOAT_EQ(tables.attention_scaling, c["attention_scaling"].get<float>());
  }
}

ModelConfig SmallConfig() {
  ModelConfig config;
  config.head_dim = 64;
  config.rope_theta = 10000.0f;
  config.max_position_embeddings = 4096;
  return config;
}

TEST(RopeTest, DefaultFrequenciesFollowTheFormula) {
  const RopeTables tables = ComputeRope(SmallConfig());
  ASSERT_EQ(tables.inv_freq.size(), 32u);
  EXPECT_EQ(tables.inv_freq[0], 1.0f);
  for (size_t i = 0; i < tables.inv_freq.size(); ++i) {
    const double want = std::pow(10000.0, -2.0 * static_cast<double>(i) / 64.0);
    EXPECT_NEAR(tables.inv_freq[i], want, want * 1e-6) << i;
  }
  EXPECT_EQ(tables.attention_scaling, 1.0f);
}

TEST(RopeTest, LinearDividesEveryFrequency) {
  ModelConfig config = SmallConfig();
  const RopeTables plain = ComputeRope(config);
  config.rope_scaling.kind = RopeScaling::Kind::kLinear;
  config.rope_scaling.factor = 4.0f;
  const RopeTables linear = ComputeRope(config);
  for (size_t i = 0; i < plain.inv_freq.size(); ++i) {
    EXPECT_EQ(linear.inv_freq[i], plain.inv_freq[i] / 4.0f);
  }
}

TEST(RopeTest, DynamicOnlyChangesBeyondTheTrainedContext) {
  ModelConfig config = SmallConfig();
  const RopeTables plain = ComputeRope(config);
  config.rope_scaling.kind = RopeScaling::Kind::kDynamic;
  config.rope_scaling.factor = 2.0f;
  EXPECT_EQ(ComputeRope(config, 0).inv_freq, plain.inv_freq);
  EXPECT_EQ(ComputeRope(config, 4096).inv_freq, plain.inv_freq);
  const RopeTables longer = ComputeRope(config, 8192);
  EXPECT_EQ(longer.inv_freq[0], 1.0f);
  for (size_t i = 1; i < plain.inv_freq.size(); ++i) {
    EXPECT_LT(longer.inv_freq[i], plain.inv_freq[i]) << i;  // a larger base lowers frequencies
  }
}

TEST(RopeTest, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  ModelConfig config = SmallConfig();
  config.rope_theta = 500000.0f;
  const RopeTables plain = ComputeRope(config);
  config.rope_scaling.kind = RopeScaling::Kind::kLlama3;
  config.rope_scaling.factor = 8.0f;
  config.rope_scaling.original_max_position_embeddings = 8192;
  const RopeTables scaled = ComputeRope(config);
  EXPECT_EQ(scaled.inv_freq.front(), plain.inv_freq.front());
  EXPECT_EQ(scaled.inv_freq.back(), plain.inv_freq.back() / 8.0f);
  for (size_t i = 0; i < plain.inv_freq.size(); ++i) {
    EXPECT_LE(scaled.inv_freq[i], plain.inv_freq[i]);
    EXPECT_GE(scaled.inv_freq[i], plain.inv_freq[i] / 8.0f * 0.999999f);
  }
}

TEST(RopeTest, YarnAttentionFactorDefaultsToMscale) {
  ModelConfig config = SmallConfig();
  config.rope_scaling.kind = RopeScaling::Kind::kYarn;
  config.rope_scaling.factor = 4.0f;
  config.rope_scaling.original_max_position_embeddings = 1024;
  EXPECT_FLOAT_EQ(ComputeRope(config).attention_scaling, 0.1f * std::log(4.0f) + 1.0f);
  config.rope_scaling.attention_factor = 0.75f;
  EXPECT_EQ(ComputeRope(config).attention_scaling, 0.75f);
}

}  // namespace
}  // namespace tandem
