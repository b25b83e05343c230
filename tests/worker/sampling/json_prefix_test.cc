// JSON mode's recogniser: every prefix of a JSON object is accepted and the object is complete
// exactly at its end; texts that are no prefix of an object fail at the first byte that breaks
// them.
#include "worker/sampling/json_prefix.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// The offset of the first byte `text` cannot have, or -1 when every byte fits.
int FirstBadByte(const std::string& text) {
  JsonPrefix json;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!json.Feed(text[i])) return static_cast<int>(i);
  }
  return -1;
}

TEST(JsonPrefixTest, AcceptsObjectsByteByByteAndCompletesAtTheirEnd) {
  for (const std::string text :
       {R"({})", R"({ "a" : 1 } )", R"({"a": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null]})",
        R"({"s": "q\"uo\\te\n\u00e9 é ✓", "o": {"n": {"d": []}}, "e": ""})",
        "{\n  \"k\": [ {}, [ ], \"x\" ]\n}\n"}) {
    JsonPrefix json;
    size_t end = text.find_last_of('}');
    for (size_t i = 0; i < text.size(); ++i) {
      ASSERT_TRUE(json.Feed(text[i])) << text << " at " << i;
      EXPECT_EQ(json.complete(), i >= end) << text << " at " << i;
    }
  }
}

TEST(JsonPrefixTest, RefusesAtTheFirstByteThatBreaksTheObject) {
  EXPECT_EQ(FirstBadByte("[1]"), 0);  // the top level is an object
  EXPECT_EQ(FirstBadByte("\"s\""), 0);
  EXPECT_EQ(FirstBadByte("{a"), 1);  // keys are strings
  EXPECT_EQ(FirstBadByte(R"({"a" 1})"), 5);
  EXPECT_EQ(FirstBadByte(R"({"a": 01})"), 7);  // no leading zeros
  EXPECT_EQ(FirstBadByte(R"({"a": -})"), 7);
  EXPECT_EQ(FirstBadByte(R"({"a": 1.})"), 8);
  EXPECT_EQ(FirstBadByte(R"({"a": 1e})"), 8);
  EXPECT_EQ(FirstBadByte(R"({"a": tru})"), 9);
  EXPECT_EQ(FirstBadByte(R"({"a": "\x"})"), 8);
  EXPECT_EQ(FirstBadByte(R"({"a": "\u12g4"})"), 11);
  EXPECT_EQ(FirstBadByte("{\"a\": \"line\nbreak\"}"), 11);  // raw control characters
  EXPECT_EQ(FirstBadByte(R"({"a": 1,})"), 8);               // no trailing comma
  EXPECT_EQ(FirstBadByte(R"({"a": [1 2]})"), 9);
  EXPECT_EQ(FirstBadByte(R"({"a": [1}})"), 8);
  EXPECT_EQ(FirstBadByte(R"({} x)"), 3);  // only whitespace after the object
  EXPECT_EQ(FirstBadByte(R"({}{})"), 2);
  EXPECT_EQ(FirstBadByte(" {}"), 0);  // the object starts at once
  const std::string blanks(JsonPrefix::kMaxWhitespace, ' ');
  EXPECT_EQ(FirstBadByte("{" + blanks + "}"), -1);
  EXPECT_EQ(FirstBadByte("{" + blanks + " }"), JsonPrefix::kMaxWhitespace + 1);
}

TEST(JsonPrefixTest, NestingIsBounded) {
  std::string deep = R"({"a": )";
  for (size_t i = 1; i < JsonPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(FirstBadByte(deep), -1);
  EXPECT_EQ(FirstBadByte(deep + "["), static_cast<int>(deep.size()));
}

}  // namespace
}  // namespace tandem
