// Token-for-token agreement with Hugging Face `tokenizers` on the committed fixtures
// (tools/fixtures/make_tokenizer_fixtures.py).
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/tokenizer/test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::ElementsAreArray;

// Checks every case of `cases` against `tokenizer`; counts them in `checked`.
void CheckCases(const Tokenizer& tokenizer, const json& cases, int* checked) {
  for (const json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE("case " + name);
    const auto expected_ids = c.at("ids").get<std::vector<int32_t>>();
    const auto expected_no_special = c.at("ids_no_special").get<std::vector<int32_t>>();

    auto ids = tokenizer.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_THAT(*ids, ElementsAreArray(expected_ids));
    auto ids_no_special = tokenizer.Encode(text, /*parse_special=*/false);
    ASSERT_TRUE(ids_no_special.ok()) << ids_no_special.status();
    EXPECT_THAT(*ids_no_special, ElementsAreArray(expected_no_special));

    // HF tokenizers decodes lossily; compare after the same repair.
    auto decoded = tokenizer.Decode(expected_ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(ToValidUtf8(*decoded), c.at("decoded").get<std::string>());
    auto decoded_skip = tokenizer.Decode(expected_ids, /*skip_special=*/true);
    ASSERT_TRUE(decoded_skip.ok()) << decoded_skip.status();
    EXPECT_EQ(ToValidUtf8(*decoded_skip), c.at("decoded_skip_special").get<std::string>());
    ++*checked;
  }
}

json LoadCases(const std::string& name) {
  return json::parse(testing::ReadTestFile(testing::TokenizerFixtureDir(name) + "/cases.json"));
}

TEST(TokenizerGoldenTest, Qwen2StyleMatchesReference) {
  auto tokenizer = testing::LoadFixtureTokenizer("qwen2_style");
  ASSERT_NE(tokenizer, nullptr);
  const json fixture = LoadCases("qwen2_style");
  int checked = 0;
  CheckCases(*tokenizer, fixture.at("cases"), &checked);
  EXPECT_GE(checked, 100);
}

TEST(TokenizerGoldenTest, Gpt2StyleMatchesReference) {
  auto tokenizer = testing::LoadFixtureTokenizer("gpt2_style");
  ASSERT_NE(tokenizer, nullptr);
  const json fixture = LoadCases("gpt2_style");
  int checked = 0;
  CheckCases(*tokenizer, fixture.at("cases"), &checked);
  EXPECT_GE(checked, 100);
}

TEST(TokenizerGoldenTest, Gpt2StyleWithPrefixSpaceMatchesReference) {
  // Same file with ByteLevel.add_prefix_space switched on, as the fixture script does.
  json config = json::parse(
      testing::ReadTestFile(testing::TokenizerFixtureDir("gpt2_style") + "/tokenizer.json"));
  config["pre_tokenizer"]["add_prefix_space"] = true;
  auto tokenizer = Tokenizer::FromJson(config.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const json fixture = LoadCases("gpt2_style");
  int checked = 0;
  CheckCases(**tokenizer, fixture.at("prefix_space_cases"), &checked);
  EXPECT_GE(checked, 30);
}

TEST(TokenizerGoldenTest, DecodeOfEncodeIsNfcOfText) {
  auto tokenizer = testing::LoadFixtureTokenizer("qwen2_style");
  ASSERT_NE(tokenizer, nullptr);
  // NFC composes e + U+0301; everything else survives byte for byte.
  const std::string text = "e\xCC\x81t\xC3\xA9 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 \tx\n";
  auto ids = tokenizer->Encode(text, /*parse_special=*/false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  auto decoded = tokenizer->Decode(*ids);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, "\xC3\xA9t\xC3\xA9 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 \tx\n");
}

}  // namespace
}  // namespace tandem
