#include "worker/tokenizer/internal/regex.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::tokenizer_internal {
namespace {

using ::testing::ElementsAre;

constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> Split(std::string_view pattern, std::string_view text) {
  auto regex = Regex::Compile(pattern, /*literal=*/false);
  EXPECT_TRUE(regex.ok()) << regex.status();
  if (!regex.ok()) return {};
  Regex::Matcher matcher(**regex);
  std::vector<std::string_view> pieces;
  EXPECT_TRUE(matcher.SplitIsolated(text, &pieces).ok());
  return {pieces.begin(), pieces.end()};
}

TEST(RegexTest, WhitespaceIsSpelledAsTheReferenceEngineDefinesIt) {
  EXPECT_EQ(WithOnigurumaWhitespace(R"(\s+(?!\S))"),
            R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}]))");
  EXPECT_EQ(WithOnigurumaWhitespace(R"([^\s\p{L}])"), R"([^\t-\r\x{85}\p{Z}\p{L}])");
  // Escaped backslashes and brackets, literal ']' members and POSIX classes are left alone.
  EXPECT_EQ(WithOnigurumaWhitespace(R"(\\s\[\s)"), R"(\\s\[[\t-\r\x{85}\p{Z}])");
  EXPECT_EQ(WithOnigurumaWhitespace(R"([]\s][[:alpha:]\s]\s)"),
            R"([]\t-\r\x{85}\p{Z}][[:alpha:]\t-\r\x{85}\p{Z}][\t-\r\x{85}\p{Z}])");
}

TEST(RegexTest, MongolianVowelSeparatorIsNotWhitespace) {
  // Expected pieces are HF tokenizers' pre-tokenization of the same strings.
  EXPECT_THAT(Split(kQwen2Pattern, "x\u180e\u180e y"), ElementsAre("x", "\u180e\u180e", " y"));
  EXPECT_THAT(Split(kQwen2Pattern, "a \u180e\n z"), ElementsAre("a", " \u180e\n", " z"));
  EXPECT_THAT(Split(kGpt2Pattern, "a\u3000\u3000b\n"),
              ElementsAre("a", "\u3000", "\u3000", "b", "\n"));
}

TEST(RegexTest, SplitKeepsGapsAndSkipsEmptyMatches) {
  // "x*" matches empty strings between the letters; only non-empty pieces are kept.
  EXPECT_THAT(Split("x*", "axxbx"), ElementsAre("a", "xx", "b", "x"));
  EXPECT_THAT(Split("[0-9]+", "ab12cd3"), ElementsAre("ab", "12", "cd", "3"));
  EXPECT_THAT(Split("[0-9]+", ""), ElementsAre());
}

}  // namespace
}  // namespace tandem::tokenizer_internal
