#include "worker/sampling/stop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kWord = 100;  // any non-stop token id

StopConditions Conditions(std::vector<std::string> stop_strings, int max_tokens = 1000,
                          std::vector<int32_t> stop_tokens = {kEos}) {
  StopConditions conditions;
  conditions.stop_token_ids = std::move(stop_tokens);
  conditions.stop_strings = std::move(stop_strings);
  conditions.max_tokens = max_tokens;
  return conditions;
}

struct Streamed {
  std::vector<std::string> steps;  // text emitted by each Push
  std::string text;                // everything emitted, Flush included when unfinished
  FinishReason finish = FinishReason::kNone;
  int finished_at = -1;  // index of the finishing Push
};

// Pushes `pieces` as consecutive non-stop tokens until one finishes the stream; flushes if none
// does.
Streamed Stream(StopConditions conditions, const std::vector<std::string>& pieces) {
  StopChecker checker(std::move(conditions));
  Streamed out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    StopChecker::Step step = checker.Push(kWord, pieces[i]);
    out.steps.push_back(step.text);
    out.text += step.text;
    if (step.finish != FinishReason::kNone) {
      out.finish = step.finish;
      out.finished_at = static_cast<int>(i);
      return out;
    }
  }
  out.text += checker.Flush();
  return out;
}

TEST(StopCheckerTest, StopTokenEndsWithoutItsText) {
  StopChecker checker(Conditions({}));
  StopChecker::Step step = checker.Push(kWord, "Hello");
  EXPECT_EQ(step.text, "Hello");
  EXPECT_EQ(step.finish, FinishReason::kNone);
  step = checker.Push(kEos, "</s>");
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(step.finish, FinishReason::kStop);
  EXPECT_EQ(checker.tokens_seen(), 2);
}

TEST(StopCheckerTest, StopTokenReleasesHeldText) {
  // "EN" could have become "END", but the stream ended on a stop token: it is plain output.
  StopChecker checker(Conditions({"END"}));
  EXPECT_EQ(checker.Push(kWord, "The EN").text, "The ");
  const StopChecker::Step step = checker.Push(kEos, "");
  EXPECT_EQ(step.text, "EN");
  EXPECT_EQ(step.finish, FinishReason::kStop);
}

TEST(StopCheckerTest, StopStringSpanningThreeTokens) {
  const Streamed out = Stream(Conditions({"<|end|>"}), {"answer<|", "en", "d|>trailing", "more"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"answer", "", ""}));
  EXPECT_EQ(out.text, "answer");
  EXPECT_EQ(out.finish, FinishReason::kStop);
  EXPECT_EQ(out.finished_at, 2);
}

TEST(StopCheckerTest, FalseStartsAreReleased) {
  Streamed out = Stream(Conditions({"END"}), {"xEN", "Q", "y"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"x", "ENQ", "y"}));
  EXPECT_EQ(out.finish, FinishReason::kNone);

  // A failed start whose tail begins the real match: only the first "E" is released.
  out = Stream(Conditions({"END"}), {"E", "E", "ND", "tail"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"", "E", ""}));
  EXPECT_EQ(out.text, "E");
  EXPECT_EQ(out.finish, FinishReason::kStop);

  // Self-overlapping stop string: "aab" in "aaab" is found after the third 'a'.
  out = Stream(Conditions({"aab"}), {"a", "a", "a", "b"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"", "", "a", ""}));
}

TEST(StopCheckerTest, StopStringAtVeryStart) {
  Streamed out = Stream(Conditions({"STOP"}), {"STOP"});
  EXPECT_EQ(out.text, "");
  EXPECT_EQ(out.finish, FinishReason::kStop);
  out = Stream(Conditions({"STOP"}), {"STOPand more", "x"});
  EXPECT_EQ(out.text, "");
  EXPECT_EQ(out.finished_at, 0);
  out = Stream(Conditions({"STOP"}), {"S", "TOP"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(out.finish, FinishReason::kStop);
}

TEST(StopCheckerTest, OverlappingStopStringsStopAtTheFirstToComplete) {
  // "bc" completes before "abcd" whatever the token boundaries.
  for (const std::vector<std::string>& pieces : std::vector<std::vector<std::string>>{
           {"abcd"}, {"ab", "cd"}, {"a", "b", "c", "d"}, {"abc", "d"}}) {
    const Streamed out = Stream(Conditions({"abcd", "bc"}), pieces);
    EXPECT_EQ(out.text, "a");
    EXPECT_EQ(out.finish, FinishReason::kStop);
  }
  // Two stop strings ending on the same byte: the longer one, starting first, wins.
  const Streamed out = Stream(Conditions({"c", "abc"}), {"xab", "cy"});
  EXPECT_EQ(out.text, "x");
  // A held prefix of one stop string completed as another.
  const Streamed other = Stream(Conditions({"<|end|>", "<|eot|>"}), {"hi <|e", "ot|> x"});
  EXPECT_EQ(other.text, "hi ");
  EXPECT_EQ(other.finish, FinishReason::kStop);
}

TEST(StopCheckerTest, UnicodeStopStrings) {
  Streamed out = Stream(Conditions({"。"}), {"你好", "。", "再见"});
  EXPECT_EQ(out.text, "你好");
  EXPECT_EQ(out.finish, FinishReason::kStop);

  // U+1F6D1 is F0 9F 9B 91; byte-level tokens may split it.
  const std::string stop_sign = "\xF0\x9F\x9B\x91";
  out = Stream(Conditions({stop_sign}), {"go \xF0\x9F", "\x9B\x91 more"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"go ", ""}));
  EXPECT_EQ(out.finish, FinishReason::kStop);

  // U+1F600 shares the first two bytes: held back, then released whole.
  out = Stream(Conditions({stop_sign}), {"go \xF0\x9F", "\x98\x80 on"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"go ", "\xF0\x9F\x98\x80 on"}));
  EXPECT_EQ(out.finish, FinishReason::kNone);

  out = Stream(Conditions({"Ende®"}), {"xEnde", "®", "y"});
  EXPECT_EQ(out.text, "x");
}

TEST(StopCheckerTest, MaxTokensEmitsTheLastTokenText) {
  // The held "EN" is released: the stream ends before "END" could complete.
  const Streamed out = Stream(Conditions({"END"}, 2), {"x", "yEN", "D"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"x", "yEN"}));
  EXPECT_EQ(out.finish, FinishReason::kLength);
}

TEST(StopCheckerTest, StopBeatsLengthOnTheSameToken) {
  Streamed out = Stream(Conditions({"STOP"}, 2), {"a", "bSTOPc"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(out.finish, FinishReason::kStop);

  StopChecker checker(Conditions({}, 2));
  checker.Push(kWord, "a");
  const StopChecker::Step step = checker.Push(kEos, "</s>");
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(step.finish, FinishReason::kStop);
}

TEST(StopCheckerTest, FlushReleasesHeldText) {
  StopChecker checker(Conditions({"END"}));
  EXPECT_EQ(checker.Push(kWord, "abE").text, "ab");
  EXPECT_EQ(checker.Flush(), "E");
  // Finished: further tokens are ignored.
  const StopChecker::Step step = checker.Push(kWord, "late");
  EXPECT_EQ(step.text, "");
  EXPECT_EQ(step.finish, FinishReason::kNone);
  EXPECT_EQ(checker.tokens_seen(), 1);
}

TEST(StopCheckerTest, NoStopStringsPassesTextThrough) {
  const Streamed out = Stream(Conditions({""}), {"a", "", "bc"});
  EXPECT_EQ(out.steps, (std::vector<std::string>{"a", "", "bc"}));
}

TEST(StopCheckerTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(FinishReason::kNone), "");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
}

// The emitted text is the text before the first-completing stop string, however the text is cut
// into tokens.
std::string ExpectedOutput(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    const std::string_view prefix(text.data(), end);
    size_t cut = std::string::npos;
    for (const std::string& stop : stops) {
      if (prefix.ends_with(stop)) cut = std::min(cut, end - stop.size());
    }
    if (cut != std::string::npos) return text.substr(0, cut);
  }
  return text;
}

TEST(StopCheckerTest, OutputIndependentOfTokenBoundaries) {
  const std::vector<std::string> stops = {"abab", "bac", "ca", "aaaa"};
  std::mt19937 rng(31337);
  std::uniform_int_distribution<int> letter(0, 2);
  std::uniform_int_distribution<int> piece_length(0, 4);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    for (int i = 0; i < 12; ++i) text += static_cast<char>('a' + letter(rng));
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t length = std::min<size_t>(piece_length(rng), text.size() - at);
      pieces.push_back(text.substr(at, length));
      at += length;
    }
    const std::string expected = ExpectedOutput(text, stops);
    const Streamed out = Stream(Conditions(stops), pieces);
    ASSERT_EQ(out.text, expected) << "text " << text;
    ASSERT_EQ(out.finish, expected.size() < text.size() ? FinishReason::kStop : FinishReason::kNone)
        << "text " << text;
  }
}

TEST(StopCheckerTest, MinTokensHoldsStopsBackUntilReached) {
  // Stop strings count once min_tokens tokens are out (the token that reaches it included).
  StopConditions strings = Conditions({"ab"});
  strings.min_tokens = 3;
  const Streamed early = Stream(strings, {"ab", "x", "ab", "y"});
  EXPECT_EQ(early.finish, FinishReason::kStop);
  EXPECT_EQ(early.finished_at, 2);
  EXPECT_EQ(early.text, "abx");
  // A match that began before min_tokens and ends after it counts.
  const Streamed straddling = Stream(strings, {"x", "a", "b"});
  EXPECT_EQ(straddling.finished_at, 2);
  EXPECT_EQ(straddling.text, "x");

  // A stop token counts from the token after the min_tokens-th.
  StopConditions tokens = Conditions({});
  tokens.min_tokens = 2;
  StopChecker checker(tokens);
  EXPECT_EQ(checker.Push(kEos, "").finish, FinishReason::kNone);
  EXPECT_EQ(checker.Push(kEos, "").finish, FinishReason::kNone);
  EXPECT_EQ(checker.Push(kEos, "").finish, FinishReason::kStop);
}

}  // namespace
}  // namespace tandem
