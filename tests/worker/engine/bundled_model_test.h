// A test suite over the bundled target model: the model and its greedy.json prompts, loaded once
// per suite; every test skips when the model is absent.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/engine/local_generator.h"

namespace tandem::testing {

inline const std::string kBundledModelDir =
    std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";

class BundledModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kBundledModelDir + "/config.json")) return;
    absl::StatusOr<LoadedModel> loaded = LoadModelDir(kBundledModelDir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = new LoadedModel(std::move(*loaded));
    std::ifstream in(kBundledModelDir + "/fixtures/greedy.json");
    const nlohmann::json greedy = nlohmann::json::parse(in);
    prompts_ = new std::vector<std::vector<int32_t>>();
    for (const nlohmann::json& c : greedy["cases"]) {
      prompts_->push_back(c["prompt_ids"].get<std::vector<int32_t>>());
    }
  }
  static void TearDownTestSuite() {
    delete model_;
    delete prompts_;
    model_ = nullptr;
    prompts_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "no bundled model at " << kBundledModelDir;
  }

  static inline LoadedModel* model_ = nullptr;
  // Every greedy.json case's prompt ids, in the file's order.
  static inline std::vector<std::vector<int32_t>>* prompts_ = nullptr;
};

}  // namespace tandem::testing
