#include "worker/sampling/grammar.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace tandem {
namespace {

// A vocabulary of every printable ASCII byte, whitespace, a few multi-byte tokens, then an EOS
// (no bytes) and two padding ids.
class GrammarTest : public ::testing::Test {
 protected:
  GrammarTest() {
    for (char c : std::string(" \n\t")) bytes_.push_back(std::string(1, c));
    for (int c = 33; c < 127; ++c) bytes_.push_back(std::string(1, static_cast<char>(c)));
    for (const char* t : {"{\"", "\":", "true", "<tool_call>", "</tool_call>", "hello"}) {
      bytes_.push_back(t);
    }
    eos_ = static_cast<int32_t>(bytes_.size());
    bytes_.push_back("");
    vocab_ = static_cast<int>(bytes_.size()) + 2;
    compiler_ = std::make_unique<GrammarCompiler>(bytes_, vocab_, std::vector<int32_t>{eos_});
  }

  int32_t Id(const std::string& token) const {
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if (bytes_[i] == token) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token '" << token << "'";
    return -1;
  }
  // One token per byte.
  std::vector<int32_t> Chars(const std::string& text) const {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(Id(std::string(1, c)));
    return ids;
  }
  GrammarCursor Cursor(const GrammarSpec& spec) const {
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar = compiler_->Compile(spec);
    EXPECT_TRUE(grammar.ok()) << grammar.status();
    return GrammarCursor(*grammar, {eos_});
  }
  // The tokens the cursor allows next, as their bytes ("<eos>" for the stop token).
  std::vector<std::string> Allowed(GrammarCursor& cursor) const {
    std::vector<float> row(static_cast<size_t>(vocab_), 0.0f);
    cursor.Mask(row);
    std::vector<std::string> allowed;
    for (size_t t = 0; t < row.size(); ++t) {
      if (std::isinf(row[t])) continue;
      allowed.push_back(static_cast<int32_t>(t) == eos_ ? "<eos>" : bytes_.at(t));
    }
    return allowed;
  }

  std::vector<std::string> bytes_;
  int32_t eos_ = 0;
  int vocab_ = 0;
  std::unique_ptr<GrammarCompiler> compiler_;
};

TEST_F(GrammarTest, JsonObjectStartsAtOnceAndEndsWithAStopToken) {
  GrammarCursor cursor = Cursor({.kind = GrammarSpec::Kind::kJsonObject});
  EXPECT_THAT(Allowed(cursor), ::testing::UnorderedElementsAre("{", "{\""));
  EXPECT_FALSE(cursor.complete());

  const std::vector<int32_t> document = Chars(R"({"a": [1, true, null], "b": {"c": "x\n"}})");
  ASSERT_TRUE(cursor.MoveTo(document, {}));
  EXPECT_TRUE(cursor.complete());
  EXPECT_THAT(Allowed(cursor), ::testing::ElementsAre("<eos>"));
  // Multi-byte tokens are accepted as their bytes.
  ASSERT_TRUE(cursor.MoveTo({}, std::vector<int32_t>{Id("{\""), Id("a"), Id("\":"), Id("true")}));
  EXPECT_FALSE(cursor.complete());
}

TEST_F(GrammarTest, RefusesTextThatIsNoObjectPrefix) {
  GrammarCursor cursor = Cursor({.kind = GrammarSpec::Kind::kJsonObject});
  for (const char* bad : {"[1]", "{a", "{\"a\" 1", "{\"a\": tru3", "{\"a\": 1}}", "\"s\""}) {
    EXPECT_FALSE(cursor.MoveTo(Chars(bad), {})) << bad;
  }
  // A refused path leaves the longest accepted prefix: masking there is still sound.
  EXPECT_TRUE(cursor.MoveTo(Chars("{\"a\""), {}));
  EXPECT_THAT(Allowed(cursor), ::testing::IsSupersetOf({":", " "}));
  EXPECT_THAT(Allowed(cursor), ::testing::Not(::testing::Contains("<eos>")));
}

TEST_F(GrammarTest, WhitespaceRunsAreBounded) {
  GrammarCursor cursor = Cursor({.kind = GrammarSpec::Kind::kJsonObject});
  const std::string open = "{\"a\":";
  EXPECT_TRUE(cursor.MoveTo(Chars(open + std::string(kMaxJsonWhitespace, ' ')), {}));
  EXPECT_THAT(Allowed(cursor), ::testing::Not(::testing::Contains(" ")));
  EXPECT_FALSE(cursor.MoveTo(Chars(open + std::string(kMaxJsonWhitespace + 1, ' ')), {}));
}

TEST_F(GrammarTest, MovingBetweenPathsGivesTheMaskOfAFreshCursor) {
  const GrammarSpec spec{.kind = GrammarSpec::Kind::kJsonObject};
  GrammarCursor moved = Cursor(spec);
  const std::vector<int32_t> base = Chars("{\"ab\": [1");
  // Verify-like rows: the base, then drafts on two branches, then back to a shorter base.
  ASSERT_TRUE(moved.MoveTo(base, Chars(", 2")));
  ASSERT_TRUE(moved.MoveTo(base, Chars("]}")));
  ASSERT_TRUE(moved.MoveTo(std::span(base).first(3), Chars("c\"")));
  GrammarCursor fresh = Cursor(spec);
  ASSERT_TRUE(fresh.MoveTo(Chars("{\"ac\""), {}));
  EXPECT_EQ(Allowed(moved), Allowed(fresh));
  // A refused continuation, then back to an accepted one.
  EXPECT_FALSE(moved.MoveTo(base, Chars("]]}")));
  EXPECT_TRUE(moved.MoveTo(base, Chars("]}")));
}

TEST_F(GrammarTest, JsonSchemaConstrainsKeysAndTypes) {
  const std::string schema = R"({"type": "object",
      "properties": {"n": {"type": "integer"}, "tag": {"enum": ["x", "y"]}},
      "required": ["n", "tag"]})";
  GrammarCursor cursor = Cursor({.kind = GrammarSpec::Kind::kJsonSchema, .text = schema});
  EXPECT_TRUE(cursor.MoveTo(Chars(R"({"n": 12, "tag": "y"})"), {}));
  EXPECT_TRUE(cursor.complete());
  for (const char* bad : {R"({"m")", R"({"n": 1.5)", R"({"n": 1, "tag": "z")", R"({"n": 1})",
                          R"({"tag": "x", "n": 1, "o")"}) {
    EXPECT_FALSE(cursor.MoveTo(Chars(bad), {})) << bad;
  }
}

TEST_F(GrammarTest, ARequestsOwnStopTokenEndsTheTextOnlyAtAWholeMatch) {
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
      compiler_->Compile({.kind = GrammarSpec::Kind::kJsonObject});
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  // "hello" is text to the grammar (a string may hold it) but a stop token to this request.
  const int32_t hello = Id("hello");
  GrammarCursor plain(*grammar, {eos_});
  ASSERT_TRUE(plain.MoveTo(Chars("{\""), {}));
  EXPECT_THAT(Allowed(plain), ::testing::Contains("hello"));
  GrammarCursor cursor(*grammar, {eos_, hello});
  ASSERT_TRUE(cursor.MoveTo(Chars("{\""), {}));
  EXPECT_THAT(Allowed(cursor), ::testing::Not(::testing::Contains("hello")));
  ASSERT_TRUE(cursor.MoveTo(Chars("{}"), {}));
  EXPECT_THAT(Allowed(cursor), ::testing::UnorderedElementsAre("<eos>", "hello"));
}

TEST_F(GrammarTest, StructuralTagLeavesTextFreeUntilItsTrigger) {
  const std::string tag = R"({"type": "structural_tag", "format": {
      "type": "triggered_tags", "triggers": ["<tool_call>"],
      "tags": [{"type": "tag", "begin": "<tool_call>{\"name\": \"f\", \"arguments\": ",
                "content": {"type": "json_schema", "json_schema": {"type": "object",
                    "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
                "end": "}</tool_call>"}]}})";
  GrammarCursor cursor = Cursor({.kind = GrammarSpec::Kind::kStructuralTag, .text = tag});
  EXPECT_TRUE(cursor.MoveTo(Chars("any text! "), {}));
  EXPECT_TRUE(cursor.complete());
  std::vector<int32_t> call = Chars("any text! ");
  call.push_back(Id("<tool_call>"));
  EXPECT_TRUE(cursor.MoveTo(call, {}));
  EXPECT_FALSE(cursor.complete());
  EXPECT_TRUE(cursor.MoveTo(call, Chars(R"({"name": "f", "arguments": {"x": 3}}</tool_call>)")));
  EXPECT_FALSE(cursor.MoveTo(call, Chars(R"({"name": "g")")));
  EXPECT_FALSE(cursor.MoveTo(call, Chars(R"({"name": "f", "arguments": {"x": "s")")));
}

TEST_F(GrammarTest, RefusesBadAndOversizedSchemas) {
  for (const std::string& schema : {std::string("{not json"), std::string(R"({"type": 7})")}) {
    absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
        compiler_->Compile({.kind = GrammarSpec::Kind::kJsonSchema, .text = schema});
    EXPECT_EQ(grammar.status().code(), absl::StatusCode::kInvalidArgument) << schema;
  }
  absl::StatusOr<std::shared_ptr<const Grammar>> tag =
      compiler_->Compile({.kind = GrammarSpec::Kind::kStructuralTag, .text = R"({"format": 1})"});
  EXPECT_EQ(tag.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string huge =
      R"({"type": "object", "description": ")" + std::string(kMaxGrammarBytes, 'x') + "\"}";
  absl::StatusOr<std::shared_ptr<const Grammar>> big =
      compiler_->Compile({.kind = GrammarSpec::Kind::kJsonSchema, .text = huge});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.status().message(), ::testing::HasSubstr("at most"));
  // Deep nesting is refused before compiling (it compiles in time growing faster than linearly).
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < kMaxGrammarDepth; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  absl::StatusOr<std::shared_ptr<const Grammar>> nested =
      compiler_->Compile({.kind = GrammarSpec::Kind::kJsonSchema, .text = deep});
  EXPECT_EQ(nested.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nested.status().message(), ::testing::HasSubstr("nests 129"));
  // xgrammar's refusals come without its log prefix (no source paths).
  absl::StatusOr<std::shared_ptr<const Grammar>> regex =
      compiler_->Compile({.kind = GrammarSpec::Kind::kJsonSchema,
                          .text = R"({"type": "string", "pattern": "a{1000}{1000}"})"});
  ASSERT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(regex.status().message(), ::testing::Not(::testing::HasSubstr(".cc:")));
  EXPECT_THAT(regex.status().message(), ::testing::HasSubstr("Regex parsing error"));
}

}  // namespace
}  // namespace tandem
