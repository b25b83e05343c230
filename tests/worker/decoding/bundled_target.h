// Fixture for tests on the bundled tri-mode target (models/tandem-target), or on it with an
// adapter merged in (MergeLora): the model, the held-out prompts of fixtures/greedy.json and
// their AR greedy decodes. Skips when the model folder (or the adapter) is absent.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/decoding/ar.h"
#include "worker/decoding/runner.h"

namespace tandem::testing {

inline const std::string kBundledTargetDir =
    std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";

// Parsed JSON, or a discarded value when the file is missing or malformed.
inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class BundledTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kBundledTargetDir + "/config.json")) {
      GTEST_SKIP() << "no bundled model at " << kBundledTargetDir;
    }
    const std::string merge = MergeLora();
    if (!merge.empty() && !std::filesystem::exists(merge + "/adapter_config.json")) {
      GTEST_SKIP() << "no adapter at " << merge;
    }
    absl::StatusOr<std::unique_ptr<Transformer>> model =
        Transformer::Load(kBundledTargetDir, kernels::cpu::WeightType::kF32, merge);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    const nlohmann::json greedy = ReadJson(kBundledTargetDir + "/fixtures/greedy.json");
    ASSERT_FALSE(greedy.is_discarded());
    new_tokens_ = greedy["new_tokens"].get<int>();
    for (const nlohmann::json& c : greedy["cases"]) {
      prompts_.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
      ArMode ar(model_->config().vocab_size);
      absl::StatusOr<RunStats> r = Decode(ar, prompts_.back());
      ASSERT_TRUE(r.ok()) << r.status();
      ar_.push_back(r->tokens);
    }
  }

  // A PEFT adapter directory merged into the model's weights; "" = the model as shipped. The AR
  // references are then the adapted model's.
  virtual std::string MergeLora() const { return ""; }

  // Decodes `prompt` with `mode` (new_tokens_ tokens unless `max_tokens` is given), ending early
  // at `stop` when set.
  absl::StatusOr<RunStats> Decode(DecodingMode& mode, std::span<const int32_t> prompt,
                                  int max_tokens = 0, std::optional<int32_t> stop = {}) {
    RunOptions options;
    options.max_tokens = max_tokens > 0 ? max_tokens : new_tokens_;
    if (stop) options.on_token = [t = *stop](int32_t token) { return token == t; };
    KvCache kv(model_->KvOptions(static_cast<int64_t>(prompt.size()) + options.max_tokens + 64));
    return RunSequence(*model_, kv, 1, mode, prompt, options);
  }

  std::unique_ptr<Transformer> model_;
  int new_tokens_ = 0;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::vector<int32_t>> ar_;  // AR greedy decode of each prompt
};

}  // namespace tandem::testing
