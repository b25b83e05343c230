// Logit adjustments against a direct transcription of their definitions (vLLM's sampler, the
// CTRL repetition penalty, OpenAI's logit_bias), the range checks, and the token counts.
#include "worker/sampling/logit_adjust.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/sampling/logit_adjust_reference.h"

namespace tandem {
namespace {

LogitAdjust Everything() {
  LogitAdjust a;
  a.presence_penalty = 0.7f;
  a.frequency_penalty = 0.3f;
  a.repetition_penalty = 1.3f;
  a.logit_bias = {{2, 5.0f}, {9, -100.0f}};
  a.min_tokens = 3;
  a.min_tokens_ban = {0, 1};
  return a;
}

TEST(LogitAdjustTest, EqualsItsDefinitionWithPathTokensAddedAndRemoved) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, 11);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  const LogitAdjust a = Everything();
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> prompt(1 + trial % 5), generated(trial % 7);
    for (int32_t& t : prompt) t = token(rng);
    for (int32_t& t : generated) t = token(rng);
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), generated.begin(), generated.end());
    TokenHistory history;
    history.Sync(tokens, static_cast<int>(prompt.size()));
    // The row's context: the last `cut` generated tokens taken away, `extra` drafts appended.
    const int cut = generated.empty() ? 0 : trial % (static_cast<int>(generated.size()) + 1);
    std::vector<int32_t> removed(generated.end() - cut, generated.end());
    std::vector<int32_t> added(trial % 4);
    for (int32_t& t : added) t = token(rng);
    std::vector<int32_t> context(generated.begin(), generated.end() - cut);
    context.insert(context.end(), added.begin(), added.end());

    std::vector<float> row(12);
    for (float& x : row) x = logit(rng);
    const std::vector<float> expected = testing::ReferenceAdjust(a, row, prompt, context);
    AdjustLogits(a, history, added, removed, static_cast<int>(context.size()), row);
    for (size_t t = 0; t < row.size(); ++t) {
      if (std::isinf(expected[t])) {
        EXPECT_EQ(row[t], expected[t]) << "trial " << trial << " token " << t;
      } else {
        EXPECT_NEAR(row[t], expected[t], 1e-5f) << "trial " << trial << " token " << t;
      }
    }
  }
}

LogitAdjust Bias(std::vector<std::pair<int32_t, float>> bias) {
  LogitAdjust a;
  a.logit_bias = std::move(bias);
  return a;
}

TEST(LogitAdjustTest, InactiveByDefaultAndMinTokensWithoutBanIsInactive) {
  LogitAdjust a;
  EXPECT_FALSE(a.active());
  a.min_tokens = 4;
  EXPECT_FALSE(a.active());
  a.min_tokens_ban = {3};
  EXPECT_TRUE(a.active());
  EXPECT_TRUE(LogitAdjust{.repetition_penalty = 1.1f}.active());
  EXPECT_TRUE(Bias({{1, 0.5f}}).active());
}

// The message of CheckLogitAdjust's refusal, which must be InvalidArgument.
std::string Refusal(const LogitAdjust& a, int vocab = 0) {
  const absl::Status status = CheckLogitAdjust(a, vocab);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(LogitAdjustTest, RangesAreCheckedAndNamed) {
  EXPECT_TRUE(CheckLogitAdjust(Everything(), 12).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(Refusal({.presence_penalty = 2.5f}).find("presence_penalty"), std::string::npos);
  EXPECT_NE(Refusal({.frequency_penalty = nan}).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(Refusal({.repetition_penalty = 0}).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(Refusal({.repetition_penalty = 11}).find("repetition_penalty"), std::string::npos);
  EXPECT_NE(Refusal(Bias({{12, 1.0f}}), 12).find("vocabulary"), std::string::npos);
  EXPECT_TRUE(CheckLogitAdjust(Bias({{12, 1.0f}}), 0).ok());  // the vocabulary is unknown
  EXPECT_NE(Refusal(Bias({{-1, 1.0f}})).find("-1"), std::string::npos);
  EXPECT_NE(Refusal(Bias({{3, 1.0f}, {3, 2.0f}})).find("twice"), std::string::npos);
  EXPECT_NE(Refusal(Bias({{3, 100.5f}})).find("[-100, 100]"), std::string::npos);
  EXPECT_NE(Refusal(Bias({{3, nan}})).find("logit_bias"), std::string::npos);
  LogitAdjust many;
  for (int i = 0; i <= kMaxLogitBias; ++i) many.logit_bias.emplace_back(i, 1.0f);
  EXPECT_NE(Refusal(many).find("at most 300"), std::string::npos);
  EXPECT_NE(Refusal({.min_tokens = -1}).find("min_tokens"), std::string::npos);
}

TEST(TokenHistoryTest, CountsGrowthAndRecountsWhenTheSequenceChanged) {
  TokenHistory history;
  std::vector<int32_t> tokens = {5, 6, 5, 7, 7, 7};
  history.Sync(tokens, 3);
  EXPECT_EQ(history.prompt().size(), 2u);
  EXPECT_EQ(history.generated().at(7), 3);
  EXPECT_EQ(history.generated().count(5), 0u);
  tokens.push_back(5);
  history.Sync(tokens, 3);
  EXPECT_EQ(history.generated().at(5), 1);
  // Same length, another last token (a preempted and rebuilt sequence, say): recounted.
  tokens.back() = 6;
  history.Sync(tokens, 3);
  EXPECT_EQ(history.generated().count(5), 0u);
  EXPECT_EQ(history.generated().at(6), 1);
  // Another prompt length: recounted.
  history.Sync(tokens, 4);
  EXPECT_EQ(history.generated().at(7), 2);
  EXPECT_TRUE(history.prompt().contains(7));
}

}  // namespace
}  // namespace tandem
