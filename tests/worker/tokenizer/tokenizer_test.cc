// Behaviour beyond the golden fixtures: special tokens, errors, incremental detokenization,
// ChatML, hand-built tokenizer.json variants and concurrent use.
#include "worker/tokenizer/tokenizer.h"

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/tokenizer/test_util.h"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class QwenStyleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = testing::LoadFixtureTokenizer("qwen2_style");
    ASSERT_NE(tokenizer_, nullptr);
  }
  int32_t Id(std::string_view token) const {
    auto id = tokenizer_->TokenId(token);
    EXPECT_TRUE(id.has_value()) << token;
    return id.value_or(-1);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(QwenStyleTest, VocabularyAccessors) {
  // 1000 trained tokens (ids 0-999, specials first) plus one added token at 1000.
  EXPECT_EQ(tokenizer_->vocab_size(), 1001);
  EXPECT_EQ(Id("<|endoftext|>"), 0);
  EXPECT_EQ(Id("<|im_start|>"), 1);
  EXPECT_EQ(Id("<|im_end|>"), 2);
  EXPECT_EQ(Id("<|mask|>"), 3);
  EXPECT_TRUE(tokenizer_->IsSpecial(2));
  EXPECT_FALSE(tokenizer_->IsSpecial(1000));  // "café" is added but not special
  EXPECT_FALSE(tokenizer_->IsSpecial(-1));
  EXPECT_FALSE(tokenizer_->IsSpecial(1001));
  EXPECT_EQ(tokenizer_->TokenText(1), "<|im_start|>");
  // Model tokens are spelled in the byte-level alphabet: a space is "Ġ".
  const int32_t space = Id("\xC4\xA0");
  EXPECT_EQ(tokenizer_->TokenText(space), "\xC4\xA0");
  EXPECT_EQ(tokenizer_->Decode(std::vector<int32_t>{space}).value(), " ");
  EXPECT_EQ(tokenizer_->TokenText(1001), std::nullopt);
  EXPECT_EQ(tokenizer_->TokenId("no such token"), std::nullopt);
}

TEST_F(QwenStyleTest, SpecialTokensAreMatchedLiterally) {
  auto ids = tokenizer_->Encode("a<|im_end|>b");
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 3u);
  EXPECT_EQ((*ids)[1], 2);
  EXPECT_EQ(tokenizer_->Decode(*ids).value(), "a<|im_end|>b");
  EXPECT_EQ(tokenizer_->Decode(*ids, /*skip_special=*/true).value(), "ab");
}

TEST_F(QwenStyleTest, ParseSpecialFalseTreatsSpecialTokensAsText) {
  auto ids = tokenizer_->Encode("<|im_end|>", /*parse_special=*/false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), 1u);
  for (const int32_t id : *ids) EXPECT_FALSE(tokenizer_->IsSpecial(id)) << id;
  EXPECT_EQ(tokenizer_->Decode(*ids, /*skip_special=*/true).value(), "<|im_end|>");
  // Non-special added tokens are still matched.
  auto added = tokenizer_->Encode("caf\xC3\xA9", /*parse_special=*/false);
  ASSERT_TRUE(added.ok());
  EXPECT_THAT(*added, ElementsAre(1000));
}

TEST_F(QwenStyleTest, InvalidUtf8IsRejected) {
  for (const std::string& bad : {std::string("abc\xFF"), std::string("\xC0\xAF"),
                                 std::string("\xED\xA0\x80"), std::string("ok\xE4\xB8")}) {
    auto ids = tokenizer_->Encode(bad);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(ids.status().message(), HasSubstr("UTF-8"));
  }
}

TEST_F(QwenStyleTest, OutOfRangeIdIsRejected) {
  for (const int32_t bad : {-1, 1001, 1 << 30}) {
    auto text = tokenizer_->Decode(std::vector<int32_t>{5, bad});
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(text.status().message(), HasSubstr(std::to_string(bad)));
  }
}

TEST_F(QwenStyleTest, ChatMlPromptEncodesSpecialTokens) {
  const std::vector<ChatTurn> turns = {{"system", "Be brief."}, {"user", "Hi!"}};
  const std::string prompt = ApplyChatMl(turns);
  EXPECT_EQ(prompt,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ApplyChatMl(turns, /*add_generation_prompt=*/false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n");
  EXPECT_EQ(ApplyChatMl({}), "<|im_start|>assistant\n");
  auto ids = tokenizer_->Encode(prompt);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 1), 3);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), 2), 2);
  EXPECT_EQ(tokenizer_->Decode(*ids).value(), prompt);
}

TEST_F(QwenStyleTest, IncrementalDetokenizerNeverSplitsCharacters) {
  const std::string text =
      "Hi \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 "
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C "
      "\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5<|im_end|>\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4";
  auto ids = tokenizer_->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // The test only means something if some token ends inside a character.
  int split_tokens = 0;
  for (const int32_t id : *ids) {
    if (!IsValidUtf8(tokenizer_->Decode(std::vector<int32_t>{id}).value())) ++split_tokens;
  }
  ASSERT_GT(split_tokens, 2);

  IncrementalDetokenizer detokenizer(*tokenizer_, /*skip_special=*/true);
  std::string streamed;
  int empty_deltas = 0;
  for (const int32_t id : *ids) {
    auto delta = detokenizer.Push(std::vector<int32_t>{id});
    ASSERT_TRUE(delta.ok()) << delta.status();
    EXPECT_TRUE(IsValidUtf8(*delta));
    if (delta->empty()) ++empty_deltas;
    streamed += *delta;
  }
  streamed += detokenizer.Flush();
  EXPECT_GT(empty_deltas, 0);
  EXPECT_EQ(streamed, tokenizer_->Decode(*ids, /*skip_special=*/true).value());
}

TEST_F(QwenStyleTest, IncrementalDetokenizerRepairsBrokenBytes) {
  // Byte-level spellings of single raw bytes (both bytes are self-mapped characters).
  auto lead = tokenizer_->TokenId("\xC3\xA4");          // byte 0xE4 (lead of a 3-byte char)
  auto continuation = tokenizer_->TokenId("\xC2\xBD");  // byte 0xBD
  ASSERT_TRUE(lead.has_value() && continuation.has_value());
  IncrementalDetokenizer detokenizer(*tokenizer_);
  // A lone continuation byte can never become valid: replaced at once.
  EXPECT_EQ(detokenizer.Push(std::vector<int32_t>{*continuation}).value(), "\xEF\xBF\xBD");
  // A lead byte waits; an ASCII byte then proves it broken.
  EXPECT_EQ(detokenizer.Push(std::vector<int32_t>{*lead}).value(), "");
  EXPECT_EQ(detokenizer.Push(tokenizer_->Encode("a").value()).value(),
            "\xEF\xBF\xBD"
            "a");
  // A lead byte still pending at the end of the stream is flushed as U+FFFD.
  EXPECT_EQ(detokenizer.Push(std::vector<int32_t>{*lead, *continuation}).value(), "");
  EXPECT_EQ(detokenizer.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(detokenizer.Flush(), "");
  EXPECT_EQ(detokenizer.Push(std::vector<int32_t>{5000}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(QwenStyleTest, ConcurrentEncodeIsConsistent) {
  const std::string text =
      "def f(x):\n    return x * 2  # \xE4\xBD\xA0\xE5\xA5\xBD <|im_start|>caf\xC3\xA9";
  const std::vector<int32_t> expected = tokenizer_->Encode(text).value();
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (tokenizer_->Encode(text).value() != expected) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

// --- Hand-built tokenizer.json variants -------------------------------------------------------

// GPT-2 byte-to-character mapping, written independently of the library's.
std::string ByteChar(int byte) {
  int code_point = byte;
  const bool printable =
      (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  if (!printable) {
    int n = 0;
    for (int b = 0; b < byte; ++b) {
      if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) ++n;
    }
    code_point = 256 + n;
  }
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

// 256 byte tokens (id = byte) plus `extra` tokens from id 256, with `merges`.
json MakeConfig(const std::vector<std::string>& extra, const json& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  return {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}}},
  };
}

std::vector<int32_t> EncodeWith(const json& config, std::string_view text) {
  auto tokenizer = Tokenizer::FromJson(config.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  if (!tokenizer.ok()) return {};
  auto ids = (*tokenizer)->Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.value_or(std::vector<int32_t>{});
}

TEST(TokenizerJsonTest, MergesApplyByRankInBothFormats) {
  const std::vector<std::string> extra = {"ab", "bc", "abc"};
  // "b c" ranks first: abc -> a + bc, and no merge joins those two.
  EXPECT_THAT(EncodeWith(MakeConfig(extra, {"b c", "a b", "ab c"}), "abc"), ElementsAre('a', 257));
  EXPECT_THAT(
      EncodeWith(MakeConfig(extra, json::array({{"a", "b"}, {"b", "c"}, {"ab", "c"}})), "abc"),
      ElementsAre(258));
}

TEST(TokenizerJsonTest, IgnoreMergesTakesWholeWordsFromVocabulary) {
  json config = MakeConfig({"abcd"}, json::array());
  EXPECT_THAT(EncodeWith(config, "abcd"), ElementsAre('a', 'b', 'c', 'd'));
  config["model"]["ignore_merges"] = true;
  // The GPT-2 regex splits "abcd" / " abc"; only the first is a vocabulary entry.
  EXPECT_THAT(EncodeWith(config, "abcd abc"), ElementsAre(256, ' ', 'a', 'b', 'c'));
}

TEST(TokenizerJsonTest, MissingBytesBecomeUnknownOrVanish) {
  json config = MakeConfig({"<unk>"}, json::array());
  config["model"]["vocab"].erase(ByteChar('x'));
  EXPECT_THAT(EncodeWith(config, "axxb"), ElementsAre('a', 'b'));
  config["model"]["unk_token"] = "<unk>";
  EXPECT_THAT(EncodeWith(config, "axxb"), ElementsAre('a', 256, 256, 'b'));
  config["model"]["fuse_unk"] = true;
  EXPECT_THAT(EncodeWith(config, "axxb"), ElementsAre('a', 256, 'b'));
}

TEST(TokenizerJsonTest, SequenceNormalizerAndLiteralSplit) {
  json config = MakeConfig({}, json::array());
  config["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  // A literal split on "-" then ByteLevel without its own regex: "a-b" -> "a", "-", "b".
  config["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"String", "-"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  // e + combining acute -> U+00E9 (bytes C3 A9) under NFC.
  EXPECT_THAT(EncodeWith(config, "e\xCC\x81-b"), ElementsAre(0xC3, 0xA9, '-', 'b'));
}

TEST(TokenizerJsonTest, AddedTokensExtendTheVocabulary) {
  json config = MakeConfig({}, json::array());
  // One byte token removed: id 120 becomes a hole.
  config["model"]["vocab"].erase(ByteChar('x'));
  config["added_tokens"] =
      json::array({{{"id", 255}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                   {{"id", 256}, {"content", "hello world"}, {"special", false}}});
  auto tokenizer = Tokenizer::FromJson(config.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 257);
  EXPECT_EQ((*tokenizer)->TokenText('x'), std::nullopt);
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{'x'}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT((*tokenizer)->Encode("<s>hello world!").value(), ElementsAre(255, 256, '!'));
  EXPECT_TRUE((*tokenizer)->IsSpecial(255));
  EXPECT_FALSE((*tokenizer)->IsSpecial(256));
  // An added token whose spelling is not byte-level decodes to its own text.
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{256, 255}).value(), "hello world<s>");
  EXPECT_EQ((*tokenizer)->Decode(std::vector<int32_t>{256, 255}, true).value(), "hello world");
}

TEST(TokenizerJsonTest, AddedTokenIdsAreAssignedAsTheReferenceLoadsThem) {
  // The written ids disagree with the vocabulary; HF tokenizers (checked with 0.23)
  // numbers new contents from the vocabulary size in file order and reuses vocabulary ids.
  json config = MakeConfig({}, json::array());
  config["added_tokens"] = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 5}, {"content", "hello world"}},
                                        {{"id", 7}, {"content", "a"}, {"special", true}},
                                        {{"id", 9}, {"content", "<s>"}, {"special", true}}});
  auto tokenizer = Tokenizer::FromJson(config.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 258);
  EXPECT_EQ((*tokenizer)->TokenId("<s>"), 256);
  EXPECT_EQ((*tokenizer)->TokenId("hello world"), 257);
  EXPECT_TRUE((*tokenizer)->IsSpecial('a'));
  EXPECT_THAT((*tokenizer)->Encode("<s>hello worlda").value(), ElementsAre(256, 257, 'a'));
}

struct MalformedCase {
  std::string name;
  std::function<void(json&)> mutate;
  std::string expected_field;
};

TEST(TokenizerJsonTest, MalformedFilesNameTheField) {
  const std::vector<MalformedCase> cases = {
      {"missing model", [](json& c) { c.erase("model"); }, "model"},
      {"unknown model type", [](json& c) { c["model"]["type"] = "WordPiece"; }, "model.type"},
      {"model without type", [](json& c) { c["model"].erase("type"); }, "model.type"},
      {"byte fallback", [](json& c) { c["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {"vocab not object", [](json& c) { c["model"]["vocab"] = json::array(); }, "model.vocab"},
      {"negative id", [](json& c) { c["model"]["vocab"]["zz"] = -4; }, "model.vocab['zz']"},
      {"merge of unknown token", [](json& c) { c["model"]["merges"] = {"a q9"}; },
       "model.merges[0]"},
      {"merge without space", [](json& c) { c["model"]["merges"] = {"ab"}; }, "model.merges[0]"},
      {"missing pre-tokenizer", [](json& c) { c.erase("pre_tokenizer"); }, "pre_tokenizer"},
      {"unknown pre-tokenizer",
       [](json& c) {
         c["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type"},
      {"split behavior",
       [](json& c) {
         c["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              json::array(
                  {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
                   {{"type", "ByteLevel"}}})}};
       },
       "pre_tokenizer.pretokenizers[0].behavior"},
      {"bad regex",
       [](json& c) {
         c["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", json::array({{{"type", "Split"},
                                                               {"pattern", {{"Regex", "(\\p{L}"}}},
                                                               {"behavior", "Isolated"}},
                                                              {{"type", "ByteLevel"}}})}};
       },
       "pre_tokenizer.pretokenizers[0].pattern"},
      {"ByteLevel not last",
       [](json& c) {
         c["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers", json::array({{{"type", "ByteLevel"}}, {{"type", "ByteLevel"}}})}};
       },
       "pre_tokenizer.pretokenizers[0].type"},
      {"unknown normalizer",
       [](json& c) {
         c["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type"},
      {"missing decoder", [](json& c) { c.erase("decoder"); }, "decoder"},
      {"unknown decoder",
       [](json& c) {
         c["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type"},
      {"added token without content",
       [](json& c) {
         c["added_tokens"] = json::array({{{"id", 3}}});
       },
       "added_tokens[0].content"},
      {"added token with negative id",
       [](json& c) {
         c["added_tokens"] = json::array({{{"id", -1}, {"content", "x"}}});
       },
       "added_tokens[0].id"},
      {"absurd id", [](json& c) { c["model"]["vocab"]["zz"] = 2000000000; }, "largest id"},
  };
  for (const MalformedCase& c : cases) {
    json config = MakeConfig({"ab"}, {"a b"});
    c.mutate(config);
    auto tokenizer = Tokenizer::FromJson(config.dump());
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(c.expected_field)) << c.name;
  }
  // The unmodified configuration loads: the failures above come from the mutations.
  EXPECT_TRUE(Tokenizer::FromJson(MakeConfig({"ab"}, {"a b"}).dump()).ok());
}

TEST(TokenizerJsonTest, NonJsonAndMissingFilesFail) {
  EXPECT_EQ(Tokenizer::FromJson("{\"model\": ").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/dir/tokenizer.json"));
}

}  // namespace
}  // namespace tandem
