// The engine step's model-free stages (worker/engine/engine_stages.h): the prefill slice, the
// preemption victim, the mode's view of an output, emitting tokens with stops, and the cost
// model's accounting. The stages that run the model are covered through the engine in
// engine_test.cc.
#include "worker/engine/engine_stages.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/engine_impl.h"

namespace tandem {
namespace {

// Token i spells the letter 'a' + i; ids past 'z' are outside the vocabulary.
class LetterTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(c - 'a');
    return ids;
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, bool) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) return absl::InvalidArgumentError("id out of range");
      text += static_cast<char>('a' + id);
    }
    return text;
  }
  int32_t vocab_size() const override { return 26; }
  std::optional<int32_t> TokenId(std::string_view) const override { return std::nullopt; }
  std::optional<std::string> TokenText(int32_t id) const override {
    return std::string(1, static_cast<char>('a' + id));
  }
  bool IsSpecial(int32_t) const override { return false; }
};

TEST(PrefillSliceTest, SlicesOnlyWhatTheStepCannotTakeAndLeavesTheLastTokenToTheMode) {
  const std::vector<int32_t> tokens = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  std::optional<StepPlan> slice = PrefillSlice(tokens, 0, 4);
  ASSERT_TRUE(slice.has_value());
  EXPECT_EQ(slice->tokens, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(slice->positions, (std::vector<int32_t>{0, 1, 2, 3}));
  // From a built prefix: positions continue from kv_len.
  slice = PrefillSlice(tokens, 6, 2);
  ASSERT_TRUE(slice.has_value());
  EXPECT_EQ(slice->tokens, (std::vector<int32_t>{16, 17}));
  EXPECT_EQ(slice->positions, (std::vector<int32_t>{6, 7}));
  // A limit of pending - 1 or more slices all but the last pending token.
  slice = PrefillSlice(tokens, 0, 9);
  ASSERT_TRUE(slice.has_value());
  EXPECT_EQ(slice->tokens.size(), 9u);
  // The mode plans itself when the step can take everything pending, or one token is pending.
  EXPECT_FALSE(PrefillSlice(tokens, 0, 10).has_value());
  EXPECT_FALSE(PrefillSlice(tokens, 0, 64).has_value());
  EXPECT_FALSE(PrefillSlice(tokens, 9, 1).has_value());
  EXPECT_FALSE(PrefillSlice(tokens, 10, 1).has_value());
}

// Whole plans of ReplaySlice until the mode's step: the token counts of each extend.
std::vector<int> ReplayShapes(std::span<const int32_t> tokens, int chunk_limit, int prompt_len,
                              int exact_tokens) {
  std::vector<int> shapes;
  int kv_len = 0;
  while (std::optional<StepPlan> slice =
             ReplaySlice(tokens, kv_len, chunk_limit, prompt_len, exact_tokens)) {
    EXPECT_EQ(slice->positions.front(), kv_len);
    EXPECT_EQ(slice->tokens.front(), tokens[kv_len]);
    shapes.push_back(static_cast<int>(slice->tokens.size()));
    kv_len += shapes.back();
  }
  shapes.push_back(static_cast<int>(tokens.size()) - kv_len);  // the mode's step
  return shapes;
}

TEST(ReplaySliceTest, RebuildsThePromptAsItsFirstRunAndTheMigratedTokensInExactExtends) {
  std::vector<int32_t> tokens(30);
  for (int i = 0; i < 30; ++i) tokens[i] = 100 + i;
  // A 7-token prompt the first run extended in one step (its mode's), then 23 migrated tokens
  // in extends of at most 4, the last ones (at most 4) left to the mode.
  EXPECT_EQ(ReplayShapes(tokens, 64, 7, 4), (std::vector<int>{7, 4, 4, 4, 4, 4, 3}));
  // A prompt longer than a chunk: chunks, then the rest of the prompt in one extend.
  EXPECT_EQ(ReplayShapes(tokens, 8, 20, 4), (std::vector<int>{8, 8, 4, 4, 4, 2}));
  // No exact extends (a backend without the promise) or no migrated tokens: PrefillSlice's.
  EXPECT_EQ(ReplayShapes(tokens, 64, 7, 0), (std::vector<int>{30}));
  EXPECT_EQ(ReplayShapes(tokens, 8, 30, 4), (std::vector<int>{8, 8, 8, 6}));
  // Migrated tokens that fit one exact extend go to the mode with nothing sliced.
  EXPECT_EQ(ReplayShapes(std::span<const int32_t>(tokens).first(10), 64, 7, 4),
            (std::vector<int>{7, 3}));
}

TEST(PickVictimTest, TakesTheNewestSequenceOutsideTheBatchOtherThanTheOneReserving) {
  std::vector<std::shared_ptr<EngineSequence>> running;
  for (uint64_t id = 1; id <= 3; ++id) {
    running.push_back(std::make_shared<EngineSequence>());
    running.back()->id = id;
  }
  auto none = [](const EngineSequence*) { return false; };
  EXPECT_EQ(PickVictim(running, running[0].get(), none)->id, 3u);
  EXPECT_EQ(PickVictim(running, running[2].get(), none)->id, 2u);
  auto second_in_batch = [&](const EngineSequence* s) { return s == running[1].get(); };
  EXPECT_EQ(PickVictim(running, running[2].get(), second_in_batch)->id, 1u);
  auto all = [](const EngineSequence*) { return true; };
  EXPECT_EQ(PickVictim(running, running[0].get(), all), nullptr);
  EXPECT_EQ(PickVictim({}, running[0].get(), none), nullptr);
}

TEST(ModeViewTest, KeepsTheModesTapsAndLeavesTheDrafterRowsInPlace) {
  // 3 taps × 2 tokens × hidden 4; the mode asked for the first tap only.
  ExtendOutput out;
  out.logits = {1.0f, 2.0f, 3.0f};
  out.tokens = {7, 8};
  out.accepted = {1};
  for (int i = 0; i < 24; ++i) out.hidden.push_back(static_cast<float>(i));
  ExtendOutput view = ModeView(out, 1, 2, 4);
  EXPECT_EQ(view.logits, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(view.tokens, out.tokens);
  EXPECT_EQ(view.accepted, out.accepted);
  ASSERT_EQ(view.hidden.size(), 8u);
  EXPECT_EQ(view.hidden.back(), 7.0f);
  EXPECT_EQ(out.hidden.size(), 24u);  // the drafter's rows are read from here afterwards
  EXPECT_TRUE(ModeView(out, 0, 2, 4).hidden.empty());
}

class AppendTokensTest : public ::testing::Test {
 protected:
  // A sequence with prompt "ab" that may add `max_new` tokens.
  EngineSequence Sequence(int max_new, StopConditions stop) {
    EngineSequence s;
    s.tokens = {0, 1};
    s.prompt_len = 2;
    s.max_new = max_new;
    stop.max_tokens = max_new;
    s.checker = std::make_unique<StopChecker>(std::move(stop));
    s.detok = std::make_unique<IncrementalDetokenizer>(tokenizer_);
    return s;
  }
  LetterTokenizer tokenizer_;
};

TEST_F(AppendTokensTest, AppendsEveryTokenWithItsText) {
  EngineSequence s = Sequence(10, {});
  Emitted e = AppendTokens(s, std::vector<int32_t>{2, 3});
  EXPECT_EQ(e.offset, 2);
  EXPECT_EQ(e.tokens, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(e.text, "cd");
  EXPECT_EQ(e.finish, FinishReason::kNone);
  EXPECT_TRUE(e.error.ok());
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.generated, 2);
  e = AppendTokens(s, std::vector<int32_t>{4});
  EXPECT_EQ(e.offset, 4);
}

TEST_F(AppendTokensTest, StopsAtAStopTokenAndDropsWhatFollowsIt) {
  EngineSequence s = Sequence(10, {.stop_token_ids = {25}});
  Emitted e = AppendTokens(s, std::vector<int32_t>{2, 25, 3});
  EXPECT_EQ(e.finish, FinishReason::kStop);
  EXPECT_EQ(e.tokens, (std::vector<int32_t>{2, 25}));
  EXPECT_EQ(s.tokens.size(), 4u);
  EXPECT_EQ(s.generated, 2);
}

TEST_F(AppendTokensTest, HoldsBackAStopStringAndNeverEmitsIt) {
  EngineSequence s = Sequence(10, {.stop_strings = {"de"}});
  Emitted e = AppendTokens(s, std::vector<int32_t>{2, 3});
  EXPECT_EQ(e.text, "c");  // "d" may start the stop string
  EXPECT_EQ(e.finish, FinishReason::kNone);
  e = AppendTokens(s, std::vector<int32_t>{4, 5});
  EXPECT_EQ(e.finish, FinishReason::kStop);
  EXPECT_EQ(e.tokens, (std::vector<int32_t>{4}));
  EXPECT_EQ(e.text, "");
}

TEST_F(AppendTokensTest, EndsAtTheCompletionBudget) {
  EngineSequence s = Sequence(2, {});
  Emitted e = AppendTokens(s, std::vector<int32_t>{2, 3, 4});
  EXPECT_EQ(e.finish, FinishReason::kLength);
  EXPECT_EQ(e.tokens, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(s.generated, 2);
}

TEST_F(AppendTokensTest, ATokenThatCannotBeDetokenisedIsAnError) {
  EngineSequence s = Sequence(10, {});
  Emitted e = AppendTokens(s, std::vector<int32_t>{2, 40, 3});
  EXPECT_FALSE(e.error.ok());
  EXPECT_EQ(e.tokens, (std::vector<int32_t>{2, 40}));
  EXPECT_EQ(e.text, "c");
}

TEST(ObserveSequenceStepsTest, LoadIsTheModesResidentsAndStepTimeOnlyWhenOneModeRuns) {
  const std::vector<SequenceObservation> spec_steps = {
      {.mode = "spec", .gained = 3, .extend = 4, .wait = 0.0},
      {.mode = "spec", .gained = 1, .extend = 4, .wait = 0.0}};
  CostModelBuilder alone;
  ObserveSequenceSteps(alone, {{"spec", 3}}, spec_steps, 0.5);
  std::optional<ModeLoadPoint> point = alone.Snapshot().ModeAt("spec", 3);
  ASSERT_TRUE(point.has_value());
  EXPECT_DOUBLE_EQ(point->sequences, 3);  // the resident count, not the two in the step
  EXPECT_DOUBLE_EQ(point->tokens_per_step, 2);
  EXPECT_DOUBLE_EQ(point->extend_tokens, 4);
  EXPECT_DOUBLE_EQ(point->step_seconds, 0.5);

  CostModelBuilder mixed;
  ObserveSequenceSteps(mixed, {{"spec", 3}, {"ar", 1}}, spec_steps, 0.5);
  point = mixed.Snapshot().ModeAt("spec", 3);
  ASSERT_TRUE(point.has_value());
  EXPECT_DOUBLE_EQ(point->step_seconds, 0);  // the mix's time is not spec's

  CostModelBuilder unknown;  // a mode with no resident count loads as one sequence
  ObserveSequenceSteps(unknown, {{"ar", 2}}, spec_steps, 0.5);
  point = unknown.Snapshot().ModeAt("spec", 1);
  ASSERT_TRUE(point.has_value());
  EXPECT_DOUBLE_EQ(point->sequences, 1);
}

}  // namespace
}  // namespace tandem
