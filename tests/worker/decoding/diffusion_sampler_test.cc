// The diffusion mode's trained sampler on the bundled target (models/tandem-target/sampler):
// against tools/train/sampler.py's fixture (fixtures/sampler.json) the engine's slot summaries,
// features and probabilities on held-out block states, and the `diffusion` mode's decodes with
// the sampler; plus the refusals (a request for a sampler the model lacks, a bad threshold, a
// malformed folder). Skipped when the model folder is absent.
#include "worker/decoding/diffusion_sampler.h"

#include <filesystem>
#include <fstream>
#include <numeric>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/decoding/bundled_target.h"
#include "tests/worker/model/checkpoint/temp_dir.h"
#include "worker/decoding/modes.h"
#include "worker/model/checkpoint/safetensors.h"

namespace tandem {
namespace {

using testing::BundledTargetTest;
using testing::kBundledTargetDir;

class DiffusionSamplerTest : public BundledTargetTest {
 protected:
  void SetUp() override {
    BundledTargetTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    absl::StatusOr<std::unique_ptr<DiffusionSampler>> sampler =
        DiffusionSampler::Load(kBundledTargetDir + "/sampler", model_->config());
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    sampler_ = std::move(*sampler);
    fixture_ = testing::ReadJson(kBundledTargetDir + "/fixtures/sampler.json");
    ASSERT_FALSE(fixture_.is_discarded());
  }

  // Logits of the block rows after `prefix` (causal), each row seeing the prefix and the whole
  // block: the `diffusion` mode's layout.
  std::vector<float> BlockLogits(const std::vector<int32_t>& prefix,
                                 const std::vector<int32_t>& block) {
    std::vector<int32_t> tokens = prefix;
    tokens.insert(tokens.end(), block.begin(), block.end());
    const int p = static_cast<int>(prefix.size());
    const int n = static_cast<int>(tokens.size());
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 0);
    Visibility visible = Visibility::Explicit(n);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (j <= i || (i >= p && j >= p)) visible.Allow(i, j);
      }
    }
    std::vector<int32_t> outputs(block.size());
    std::iota(outputs.begin(), outputs.end(), p);
    KvCache kv(model_->KvOptions(n + 16));
    EXPECT_TRUE(kv.AddSequence(1).ok());
    EXPECT_TRUE(kv.Reserve(1, n).has_value());
    Extend extend{
        .seq = 1, .tokens = tokens, .positions = positions, .visible = visible, .outputs = outputs};
    absl::StatusOr<std::vector<ExtendOutput>> out = model_->Forward({&extend, 1}, kv);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)[0].logits : std::vector<float>();
  }

  std::unique_ptr<DiffusionSampler> sampler_;
  nlohmann::json fixture_;
};

TEST_F(DiffusionSamplerTest, SummariesFeaturesAndProbabilitiesMatchTheTrainingCode) {
  const int vocab = model_->config().vocab_size;
  const int32_t mask = *model_->config().diffusion.mask_token_id;
  ASSERT_GE(fixture_["cases"].size(), 2u);
  for (const nlohmann::json& c : fixture_["cases"]) {
    const std::vector<int32_t> block = c["block"].get<std::vector<int32_t>>();
    const std::vector<float> logits = BlockLogits(c["prefix"].get<std::vector<int32_t>>(), block);
    ASSERT_EQ(logits.size(), block.size() * vocab);
    std::vector<SlotSummary> summaries;
    for (size_t i = 0; i < block.size(); ++i) {
      if (block[i] != mask) continue;
      const size_t k = summaries.size();
      summaries.push_back(
          SummarizeSlot({logits.data() + i * vocab, static_cast<size_t>(vocab)}, mask));
      const SlotSummary& s = summaries.back();
      for (int r = 0; r < 3; ++r) {
        EXPECT_NEAR(s.prob[r], c["prob"][k][r].get<float>(), 2e-4) << "slot " << i;
        // Ids may differ only between near-equal probabilities.
        if (s.prob[r] - (r < 2 ? s.prob[r + 1] : 0.0f) > 1e-3) {
          EXPECT_EQ(s.top[r], c["top"][k][r].get<int32_t>()) << "slot " << i << " rank " << r;
        }
      }
      EXPECT_NEAR(s.entropy, c["entropy"][k].get<float>(), 1e-3) << "slot " << i;
    }
    absl::StatusOr<std::vector<float>> features = sampler_->Features(block, summaries);
    ASSERT_TRUE(features.ok()) << features.status();
    const int f = sampler_->features();
    for (size_t i = 0; i < block.size(); ++i) {
      for (int j = 0; j < f; ++j) {
        EXPECT_NEAR((*features)[i * f + j], c["features"][i][j].get<float>(), 5e-4)
            << "slot " << i << " feature " << j;
      }
    }
    absl::StatusOr<std::vector<float>> p = sampler_->Score(block, summaries);
    ASSERT_TRUE(p.ok()) << p.status();
    for (size_t i = 0; i < block.size(); ++i) {
      EXPECT_NEAR((*p)[i], c["probability"][i].get<float>(), 1e-3) << "slot " << i;
    }
  }
}

TEST_F(DiffusionSamplerTest, TheModeWithTheSamplerEqualsTheReferenceDecodes) {
  const nlohmann::json& ref = fixture_["decode"];
  ASSERT_EQ(ref["cases"].size(), prompts_.size());
  ModeOptions options;
  options.diffusion_block_size = ref["block_size"].get<int>();
  options.diffusion_sampler = ref["threshold"].get<float>();
  options.sampler_model = sampler_.get();
  int tokens = 0;
  int forwards = 0;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode("diffusion", options, model_->config(), SamplingParams{});
    ASSERT_TRUE(mode.ok()) << mode.status();
    absl::StatusOr<RunStats> r = Decode(**mode, prompts_[p], ref["new_tokens"].get<int>());
    ASSERT_TRUE(r.ok()) << r.status();
    const nlohmann::json& want = ref["cases"][p];
    // A probability this close to the threshold may fall either side between two fp32 codes.
    if (want["min_threshold_margin"].get<double>() < 1e-4) continue;
    EXPECT_EQ(r->tokens, want["continuation_ids"].get<std::vector<int32_t>>()) << "prompt " << p;
    EXPECT_EQ(r->forwards, want["forwards"].get<int>()) << "prompt " << p;
    tokens += static_cast<int>(r->tokens.size());
    forwards += r->forwards;
  }
  ASSERT_GT(forwards, 0);
  std::printf("[ tpf      ] diffusion with the trained sampler at %.2f: %.3f tokens/forward\n",
              ref["threshold"].get<double>(), static_cast<double>(tokens) / forwards);
}

TEST_F(DiffusionSamplerTest, RequestsTheModelCannotServeAreRefused) {
  ModeOptions options;
  options.diffusion_sampler = 0.5f;  // no sampler_model: a model without sampler/
  absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
      CreateMode("diffusion", options, model_->config(), SamplingParams{});
  EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mode.status().message().find("has none"), std::string::npos) << mode.status();

  options.diffusion_sampler = 1.5f;
  EXPECT_EQ(CheckModeOptions("diffusion", options, model_->config(), {}).code(),
            absl::StatusCode::kInvalidArgument);

  options.diffusion_sampler = 0.5f;
  options.sampler_model = sampler_.get();
  options.diffusion_block_size = sampler_->max_block() + 1;
  mode = CreateMode("diffusion", options, model_->config(), SamplingParams{});
  EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument) << mode.status();
}

TEST_F(DiffusionSamplerTest, MalformedFoldersAreClearErrors) {
  const test::TempDir dir;
  const std::string folder = dir.File("sampler");
  std::filesystem::copy(kBundledTargetDir + "/sampler", folder);
  // A missing tensor, named.
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(folder + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<std::vector<float>> values;
    std::vector<TensorToWrite> tensors;
    for (const auto& [name, view] : (*file)->tensors()) {
      if (name == "head.bias") continue;
      values.emplace_back(view.NumElements());
      ASSERT_TRUE(
          ConvertToF32(view.dtype, view.data.data(), values.back().size(), values.back().data())
              .ok());
    }
    size_t k = 0;
    for (const auto& [name, view] : (*file)->tensors()) {
      if (name == "head.bias") continue;
      tensors.push_back({name, view.shape, values[k++]});
    }
    file->reset();
    ASSERT_TRUE(WriteSafetensors(folder + "/model.safetensors", tensors, DType::kF32).ok());
  }
  absl::StatusOr<std::unique_ptr<DiffusionSampler>> loaded =
      DiffusionSampler::Load(folder, model_->config());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("head.bias"), std::string::npos) << loaded.status();
  // Another model's vocabulary.
  ModelConfig other = model_->config();
  other.vocab_size += 1;
  loaded = DiffusionSampler::Load(kBundledTargetDir + "/sampler", other);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("vocab_size"), std::string::npos) << loaded.status();
  // Not a sampler config.
  std::ofstream(folder + "/config.json") << "{\"format\": \"something-else\"}";
  loaded = DiffusionSampler::Load(folder, model_->config());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
