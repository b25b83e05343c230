// The engine's cost model and per-step γ on the bundled target model: start-up calibration
// measures every lossless mode the engine can run (and skips the ones it refuses), AR's measured
// tokens per step is exactly one, and spec sequences whose γ the engine chooses per step
// (mixed with sequences that pin theirs) still reproduce AR's greedy output token for token.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/engine/bundled_model_test.h"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "worker/engine/calibration.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

constexpr char kDrafter[] = "in-process";

using Sink = testing::CollectingSink;

class EngineCostTest : public testing::BundledModelTest {
 protected:
  // With an in-process drafter (the target itself) unless `drafter` is false.
  std::unique_ptr<Engine> MakeEngine(bool drafter = true, bool adaptive_gamma = true) {
    EngineOptions options;
    options.draft_timeout = absl::Seconds(10);  // chains always arrive: spec really drafts
    options.adaptive_gamma = adaptive_gamma;
    DraftChannelFactory factory;
    if (drafter) {
      options.default_drafter = kDrafter;
      factory = [](const std::string&, DraftChannel::ChainCallback on_chain)
          -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
        return std::make_unique<testing::InProcessDraftChannel>(model_->model.get(), 512,
                                                                std::move(on_chain));
      };
    }
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(model_, options, std::move(factory));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
};

// The engine's published cost model once its mean request length is `request_tokens`, or
// after 10 s: a sink hears its sequence end inside a step, and the engine publishes its load
// after the step.
CostModel PublishedWith(const Engine& engine, double request_tokens) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  CostModel cost = engine.Load().cost;
  while (cost.request_tokens != request_tokens && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
    cost = engine.Load().cost;
  }
  return cost;
}

TEST_F(EngineCostTest, CalibrationMeasuresEveryLosslessMode) {
  // Fixed γ: whether the engine would draft at all depends on the measured (noisy) curve.
  auto engine = MakeEngine(/*drafter=*/true, /*adaptive_gamma=*/false);
  ASSERT_NE(engine, nullptr);
  CalibrationOptions options;
  options.batch_sizes = {1, 2};
  options.tokens = 8;
  options.budget = absl::Seconds(60);  // a loaded machine; the bundled model needs well under 1 s
  absl::StatusOr<CalibrationResult> result = Calibrate(*engine, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->out_of_time);
  EXPECT_TRUE(result->skipped.empty()) << result->skipped.front();
  EXPECT_EQ(result->requests, static_cast<int>(AutoModes().size()) * 3);
  const CostModel cost = engine->Load().cost;
  EXPECT_FALSE(cost.step_times.empty());
  for (const std::string& mode : AutoModes()) {
    EXPECT_NE(std::find(result->measured.begin(), result->measured.end(), mode),
              result->measured.end())
        << mode;
    ASSERT_TRUE(cost.modes.count(mode)) << mode;
    const std::optional<double> goodput = cost.Goodput(mode, 1);
    ASSERT_TRUE(goodput.has_value()) << mode;
    EXPECT_GT(*goodput, 0) << mode;
  }
  // An AR decode step gains exactly one token and puts one into the batch.
  for (const ModeLoadPoint& point : cost.modes.at("ar")) {
    EXPECT_DOUBLE_EQ(point.tokens_per_step, 1.0);
    EXPECT_DOUBLE_EQ(point.extend_tokens, 1.0);
  }
  // The target drafting for itself: every draft is accepted, so spec gains more than one.
  EXPECT_GT(cost.modes.at("spec").front().tokens_per_step, 1.0);
  // Every mode's first requests measured their start; calibration's lengths are not served
  // traffic's, so they leave the request length unknown.
  for (const std::string& mode : AutoModes()) {
    EXPECT_GT(cost.modes.at(mode).front().start_seconds, 0) << mode;
  }
  EXPECT_EQ(cost.request_tokens, 0);
}

TEST_F(EngineCostTest, ARequestsStartAndLengthAreMeasured) {
  auto engine = MakeEngine(/*drafter=*/false);
  ASSERT_NE(engine, nullptr);
  double longest = 0;  // the longest request's submission to its end
  for (int max_tokens : {6, 10}) {
    auto sink = std::make_shared<Sink>();
    SequenceRequest request;
    request.prompt_ids = (*prompts_)[0];
    request.mode = "ar";
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    const absl::Time before = absl::Now();
    ASSERT_TRUE(engine->Submit(request, sink).ok());
    ASSERT_TRUE(sink->Wait());
    ASSERT_TRUE(sink->error().ok()) << sink->error();
    longest = std::max(longest, absl::ToDoubleSeconds(absl::Now() - before));
    // The running mean of the lengths: 6, then (6 + 10) / 2.
    const CostModel cost = PublishedWith(*engine, max_tokens == 6 ? 6.0 : 8.0);
    ASSERT_TRUE(cost.modes.count("ar"));
    const ModeLoadPoint& point = cost.modes.at("ar").front();
    // Submission to first token, averaged over the requests so far: more than nothing, less
    // than the longest whole request.
    EXPECT_GT(point.start_seconds, 0);
    EXPECT_LT(point.start_seconds, longest);
  }
  EXPECT_DOUBLE_EQ(engine->Load().cost.request_tokens, 8.0);
}

TEST_F(EngineCostTest, CalibrationSkipsModesTheEngineRefusesAndKeepsItsBudget) {
  auto engine = MakeEngine(/*drafter=*/false);
  ASSERT_NE(engine, nullptr);
  CalibrationOptions options;
  options.modes = {"ar", "spec"};
  options.batch_sizes = {1};
  options.tokens = 4;
  options.budget = absl::Seconds(60);
  absl::StatusOr<CalibrationResult> result = Calibrate(*engine, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->measured, std::vector<std::string>{"ar"});
  ASSERT_EQ(result->skipped.size(), 1u);
  EXPECT_EQ(result->skipped[0].rfind("spec: ", 0), 0u) << result->skipped[0];
  EXPECT_FALSE(engine->Load().cost.modes.count("spec"));

  options.budget = absl::ZeroDuration();
  result = Calibrate(*engine, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->out_of_time);
  EXPECT_EQ(result->requests, 0);

  options.batch_sizes.clear();
  EXPECT_EQ(Calibrate(*engine, options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineCostTest, AdaptiveGammaKeepsGreedyOutputsExact) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  constexpr int kPrompts = 8;
  ASSERT_GE(static_cast<int>(prompts_->size()), kPrompts);
  // Per prompt: AR, spec with the engine's γ (up to 6), spec pinned at γ = 3; all at once, so
  // that the batch is large enough for the choice to matter.
  struct Run {
    int prompt;
    std::string mode;
    bool pinned;
    std::shared_ptr<Sink> sink = std::make_shared<Sink>();
  };
  std::vector<Run> runs;
  for (int p = 0; p < kPrompts; ++p) {
    runs.push_back({p, "ar", false});
    runs.push_back({p, "spec", false});
    runs.push_back({p, "spec", true});
  }
  for (const Run& run : runs) {
    SequenceRequest request;
    request.prompt_ids = (*prompts_)[run.prompt];
    request.mode = run.mode;
    request.mode_options.spec_gamma = run.pinned ? 3 : 6;
    request.spec_gamma_pinned = run.pinned;
    request.max_tokens = 32;
    ASSERT_TRUE(engine->Submit(request, run.sink).ok());
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_TRUE(runs[i].sink->Wait());
    EXPECT_TRUE(runs[i].sink->error().ok()) << runs[i].sink->error();
    const Run& ar = runs[i - i % 3];
    EXPECT_EQ(runs[i].sink->tokens(), ar.sink->tokens())
        << runs[i].mode << (runs[i].pinned ? " pinned" : "") << " prompt " << runs[i].prompt;
    if (runs[i].pinned) {
      EXPECT_GT(runs[i].sink->usage().drafted, 0);
    }
  }
  const CostModel cost = engine->Load().cost;
  EXPECT_TRUE(cost.modes.count("spec"));
  EXPECT_TRUE(cost.modes.count("ar"));
}

TEST_F(EngineCostTest, AModesLoadCountsOnlyItsOwnSequences) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  // Three AR sequences and one spec sequence decoding in the same batches.
  std::vector<std::pair<std::string, std::shared_ptr<Sink>>> runs;
  for (const char* mode : {"ar", "ar", "ar", "spec"}) {
    runs.emplace_back(mode, std::make_shared<Sink>());
    SequenceRequest request;
    request.prompt_ids = (*prompts_)[runs.size() - 1];
    request.mode = mode;
    request.max_tokens = 24;
    ASSERT_TRUE(engine->Submit(request, runs.back().second).ok());
  }
  for (const auto& [mode, sink] : runs) {
    ASSERT_TRUE(sink->Wait()) << mode;
    EXPECT_TRUE(sink->error().ok()) << sink->error();
  }
  const CostModel cost = engine->Load().cost;
  ASSERT_TRUE(cost.modes.count("ar"));
  ASSERT_TRUE(cost.modes.count("spec"));
  // The steps held up to four sequences, but AR's load is its own three at most and spec's its
  // one: the other mode's sequences in the batch are not part of a mode's load.
  for (const ModeLoadPoint& point : cost.modes.at("ar")) {
    EXPECT_LE(point.sequences, 3.0);
  }
  for (const ModeLoadPoint& point : cost.modes.at("spec")) {
    EXPECT_DOUBLE_EQ(point.sequences, 1.0);
  }
}

}  // namespace
}  // namespace tandem
