// A late draft stalls no one: on the bundled target, `ar` sequences batched with `spec`
// sequences whose drafter is slow keep their own pace (the spec sequences sit steps out until
// their chains come), while the spec sequences still draft and stay exact.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/bundled_model_test.h"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::InProcessDraftChannel;

constexpr char kDrafter[] = "slow";
constexpr int kTokens = 40;
constexpr int kStreams = 2;  // of each mode
constexpr absl::Duration kDraftDelay = absl::Milliseconds(60);

class EngineDraftWaitTest : public testing::BundledModelTest {
 protected:
  // Far above the delay by default: every chain is waited for, none is late.
  std::unique_ptr<Engine> MakeEngine(absl::Duration draft_timeout = absl::Seconds(5)) {
    EngineOptions options;
    options.default_drafter = kDrafter;
    options.draft_timeout = draft_timeout;
    channel_ = nullptr;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(
        model_, options,
        [](const std::string& address,
           DraftChannel::ChainCallback on_chain) -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
          if (address != kDrafter) return absl::NotFoundError("no such drafter");
          auto channel = std::make_unique<InProcessDraftChannel>(model_->model.get(), 512,
                                                                 std::move(on_chain));
          channel->set_delay(kDraftDelay);
          channel_ = channel.get();
          return channel;
        });
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  struct Run {
    std::vector<std::shared_ptr<CollectingSink>> sinks;  // per stream, in submission order
    std::vector<absl::Duration> took;                    // submission to the last token
  };

  // Streams of `modes` over prompts 0, 1, ... (a mode's k-th stream takes prompt k).
  Run Submit(Engine& engine, const std::vector<std::string>& modes, int tokens = kTokens) {
    Run run;
    std::vector<int> prompt_of_mode(modes.size());
    const absl::Time start = absl::Now();
    for (size_t i = 0; i < modes.size(); ++i) {
      SequenceRequest r;
      int prompt = 0;
      for (size_t j = 0; j < i; ++j) prompt += modes[j] == modes[i] ? 1 : 0;
      r.prompt_ids = (*prompts_)[prompt];
      r.mode = modes[i];
      r.mode_options.spec_gamma = 3;
      r.max_tokens = tokens;
      r.ignore_eos = true;
      run.sinks.push_back(std::make_shared<CollectingSink>());
      EXPECT_TRUE(engine.Submit(std::move(r), run.sinks.back()).ok());
    }
    for (const auto& sink : run.sinks) {
      EXPECT_TRUE(sink->Wait());
      EXPECT_TRUE(sink->error().ok()) << sink->error();
      run.took.push_back(absl::Now() - start);
    }
    return run;
  }

  static inline InProcessDraftChannel* channel_ = nullptr;  // the engine's one drafter
};

// Before: every step waited for the spec sequences' chains, so each ar token cost the drafter's
// delay (40 tokens x 60 ms = 2.4 s a stream).
TEST_F(EngineDraftWaitTest, ASlowDrafterDoesNotSlowArSequencesInTheSameBatch) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const std::vector<std::string> ar(kStreams, "ar");
  std::vector<std::string> mixed = ar;
  mixed.insert(mixed.end(), kStreams, "spec");
  Submit(*engine, ar);  // warm-up: the step time estimate and caches
  const Run alone = Submit(*engine, ar);
  const Run beside = Submit(*engine, mixed);
  absl::Duration alone_ar, beside_ar;
  for (int i = 0; i < kStreams; ++i) {
    alone_ar = std::max(alone_ar, alone.took[i]);
    beside_ar = std::max(beside_ar, beside.took[i]);
    // The spec streams are exact (greedy: the ar output of the same prompt) and really drafted.
    const auto& spec = beside.sinks[kStreams + i];
    EXPECT_EQ(spec->tokens(), beside.sinks[i]->tokens()) << "prompt " << i;
    EXPECT_EQ(spec->tokens(), alone.sinks[i]->tokens()) << "prompt " << i;
    EXPECT_GT(spec->usage().drafted, 0) << "prompt " << i;
    // Its drafts were waited for (the drafter is slower than a step), and counted as such.
    const SequenceUsage& usage = spec->usage();
    EXPECT_GT(usage.drafts_waited, 0) << "prompt " << i;
    EXPECT_LE(usage.drafts_ready + usage.drafts_waited, usage.draft_steps) << "prompt " << i;
    EXPECT_EQ(beside.sinks[i]->usage().draft_steps, 0) << "ar prompt " << i;
  }
  std::printf(
      "[ no-stall ] %d ar streams x %d tokens: %.0f ms alone, %.0f ms beside %d spec "
      "streams whose drafter answers in %.0f ms\n",
      kStreams, kTokens, absl::ToDoubleMilliseconds(alone_ar),
      absl::ToDoubleMilliseconds(beside_ar), kStreams, absl::ToDoubleMilliseconds(kDraftDelay));
  // The spec sequences' verify rows make the shared steps a little longer; waiting for their
  // chains would add the delay to every step.
  EXPECT_LT(beside_ar, 2 * alone_ar + kTokens / 4 * kDraftDelay);
}

// A drafter whose chains come late several steps in a row is not waited for until one comes. A
// chain that comes after its sequence ended shows the drafter back too: before, only a chain for
// a live sequence did, so once a slow spell had passed, short requests (each over before its
// first chain came) kept decoding without drafts for good.
TEST_F(EngineDraftWaitTest, AChainForAnEndedSequenceStillShowsTheDrafterIsBack) {
  auto engine = MakeEngine(/*draft_timeout=*/absl::Milliseconds(300));
  ASSERT_NE(engine, nullptr);
  constexpr int kShort = 6;
  // A slow spell: every chain comes after its step gave up on it, and after the request ended.
  Submit(*engine, {"spec"}, kShort);
  ASSERT_NE(channel_, nullptr);
  channel_->set_delay(absl::Milliseconds(1500));
  const Run slow = Submit(*engine, {"spec"}, kShort);  // three late steps, then AR steps
  absl::SleepFor(absl::Milliseconds(1000));            // its chain comes now, to an ended sequence
  // The drafter answers within the timeout again, but later than a short request takes when it
  // does not wait: short requests must wait for its chains to draft.
  channel_->set_delay(absl::Milliseconds(100));
  int drafted = 0;
  for (int i = 0; i < 3; ++i) {
    const Run fast = Submit(*engine, {"spec"}, kShort);
    drafted += fast.sinks[0]->usage().drafted;
    EXPECT_EQ(fast.sinks[0]->tokens(), slow.sinks[0]->tokens());
  }
  EXPECT_GT(drafted, 0);
}

}  // namespace
}  // namespace tandem
