// Shared helpers for the tokenizer tests: fixture paths and loading.
#pragma once

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem::testing {

inline std::string TokenizerFixtureDir(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

inline std::string ReadTestFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

inline std::unique_ptr<Tokenizer> LoadFixtureTokenizer(const std::string& name) {
  auto tokenizer = Tokenizer::FromFile(TokenizerFixtureDir(name) + "/tokenizer.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

}  // namespace tandem::testing
