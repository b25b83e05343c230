// The engine with a drafter that dies, falls silent or cannot be reached (outputs stay exact,
// the waits stay bounded), and one that asks for the target's hidden states (each final token's
// rows exactly once, equal to one causal forward's).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/engine_test_fixture.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::EngineTest;
using testing::InProcessDraftChannel;
using testing::Job;
using testing::kDrafter;
using testing::kGamma;
using testing::kNewTokens;
using testing::kPrompts;

TEST_F(EngineTest, DyingDrafterLeavesOutputsExactWithoutErrors) {
  for (auto failure :
       {InProcessDraftChannel::Failure::kError, InProcessDraftChannel::Failure::kSilent}) {
    failure_ = failure;
    chains_before_failure_ = 6;
    EngineOptions options;
    // Long enough that the chains before the failure arrive on a loaded machine; a silent
    // drafter then costs this much per step.
    options.draft_timeout = failure == InProcessDraftChannel::Failure::kError
                                ? absl::Seconds(2)
                                : absl::Milliseconds(300);
    channels_made_ = 0;
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    // The drafter's chains before it fails go to whichever sequences asked first: some may
    // get none on a loaded machine, so drafting is checked over the batch.
    const auto sinks = ExpectMatchesReference(*engine, Jobs({"spec"}, 4), /*each_drafts=*/false);
    int drafted = 0;
    for (const auto& sink : sinks) drafted += sink->usage().drafted;
    EXPECT_GT(drafted, 0);
    EXPECT_EQ(channels_made_, 1);
    if (failure == InProcessDraftChannel::Failure::kError) {
      // The broken channel is replaced for the next request.
      failure_ = InProcessDraftChannel::Failure::kNone;
      ExpectMatchesReference(*engine, Jobs({"spec"}, 1));
      EXPECT_EQ(channels_made_, 2);
    }
  }
}

// A drafter that is up but sends nothing costs its sequences a few draft timeouts, not one per
// step; one the channel cannot reach costs none (before: every step of every spec sequence
// waited the full timeout, and a dead drafter multiplied request latency several times).
TEST_F(EngineTest, ASilentOrUnreachableDrafterCostsAFewDraftTimeoutsAtMost) {
  for (auto failure :
       {InProcessDraftChannel::Failure::kSilent, InProcessDraftChannel::Failure::kUnreachable}) {
    failure_ = failure;
    chains_before_failure_ = 2;  // a couple of drafts, then nothing
    EngineOptions options;
    options.draft_timeout = absl::Seconds(1);
    auto engine = MakeEngine(options);
    ASSERT_NE(engine, nullptr);
    const absl::Time start = absl::Now();
    // One sequence, so that the drafts before the failure are its own: kNewTokens steps, exact.
    ExpectMatchesReference(*engine, Jobs({"spec"}, 1));
    const absl::Duration took = absl::Now() - start;
    // Silent: three steps wait the timeout, then none. Unreachable: none waits. (Before: ~22 s.)
    const absl::Duration bound = failure == InProcessDraftChannel::Failure::kSilent
                                     ? absl::Seconds(3) + absl::Seconds(4)
                                     : absl::Seconds(4);
    EXPECT_LT(took, bound) << "failure " << static_cast<int>(failure);
  }
}

// A drafter that asks for hidden layers receives, for every token of its session but the
// newest, the target's hidden state of those layers exactly once and in order; they equal (to
// bf16 rounding) one causal forward over the whole sequence, whatever chunking and preemption
// the engine did, and the outputs stay exact.
TEST_F(EngineTest, DrafterReceivesTheHiddenStatesOfEveryFinalToken) {
  const std::vector<int32_t> layers = {1, 3};
  hidden_layers_ = layers;
  const int hidden = target().config().hidden_size;
  struct Case {
    std::string name;
    EngineOptions options;
    std::vector<std::string> modes;
  };
  std::vector<Case> cases(3);
  cases[0].name = "plain";
  cases[0].modes = {"spec", "ar"};
  cases[1].name = "chunked prefill";
  cases[1].options.prefill_chunk = 7;
  cases[1].options.max_batch_tokens = 40;
  cases[1].modes = {"spec", "ar"};
  // Small slices too, so that sequences are preempted halfway through their prefill and
  // recompute with other slice boundaries.
  cases[2].name = "preemption";
  cases[2].options.context = 128;
  cases[2].options.kv_tokens = 128 + kEngineKvHeadroom;
  cases[2].options.prefill_chunk = 5;
  cases[2].options.max_batch_tokens = 48;
  cases[2].modes = {"spec", "ar", "spec", "jacobi", "spec"};
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    c.options.draft_timeout = absl::Seconds(10);
    auto engine = MakeEngine(c.options);
    ASSERT_NE(engine, nullptr);
    const std::vector<Job> jobs = Jobs(c.modes, 4);
    const auto sinks = ExpectMatchesReference(*engine, jobs);
    ASSERT_NE(last_channel_, nullptr);
    const std::map<uint64_t, InProcessDraftChannel::Received> received = last_channel_->received();
    int spec_jobs = 0;
    int spec_preemptions = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].mode != "spec") continue;
      ++spec_jobs;
      spec_preemptions += sinks[i]->usage().preemptions;
    }
    ASSERT_EQ(static_cast<int>(received.size()), spec_jobs);
    if (c.name == "preemption") {
      EXPECT_GT(spec_preemptions, 0);
    }
    for (const auto& [session, r] : received) {
      const std::string label = "session " + std::to_string(session);
      // The session's tokens are a prompt and a prefix of its sequence's completion.
      bool matched = false;
      for (size_t i = 0; i < jobs.size() && !matched; ++i) {
        if (jobs[i].mode != "spec") continue;
        std::vector<int32_t> all = (*prompts_)[jobs[i].prompt];
        const std::vector<int32_t> completion = sinks[i]->tokens();
        all.insert(all.end(), completion.begin(), completion.end());
        matched = r.tokens.size() > (*prompts_)[jobs[i].prompt].size() &&
                  r.tokens.size() <= all.size() &&
                  std::equal(r.tokens.begin(), r.tokens.end(), all.begin());
      }
      EXPECT_TRUE(matched) << label;
      const int n = static_cast<int>(r.tokens.size());
      int next = 0;
      for (const HiddenRows& rows : r.hidden) {
        ASSERT_EQ(rows.offset, next) << label;  // no gap, no duplicate
        ASSERT_EQ(rows.layers, static_cast<int>(layers.size())) << label;
        ASSERT_EQ(rows.hidden_size, hidden) << label;
        ASSERT_GT(rows.tokens, 0) << label;
        ASSERT_EQ(rows.bf16.size(), layers.size() * rows.tokens * hidden) << label;
        next += rows.tokens;
      }
      // Every token but the newest, whose KV the next step would have computed.
      ASSERT_EQ(next, n - 1) << label;

      KvCache kv(target().KvOptions(n + 16));
      ASSERT_TRUE(kv.AddSequence(1).ok());
      ASSERT_TRUE(kv.Reserve(1, n).has_value());
      std::vector<int32_t> positions(n);
      for (int i = 0; i < n; ++i) positions[i] = i;
      const int32_t last = n - 1;
      Extend extend{.seq = 1,
                    .tokens = r.tokens,
                    .positions = positions,
                    .visible = Visibility::Causal(),
                    .outputs = {&last, 1},
                    .hidden_layers = layers};
      absl::StatusOr<std::vector<ExtendOutput>> full = target().Forward({&extend, 1}, kv);
      ASSERT_TRUE(full.ok()) << full.status();
      const std::vector<float>& want = (*full)[0].hidden;
      ASSERT_EQ(want.size(), layers.size() * n * hidden);
      double worst = 0;
      for (const HiddenRows& rows : r.hidden) {
        for (int l = 0; l < rows.layers; ++l) {
          for (int t = 0; t < rows.tokens; ++t) {
            for (int h = 0; h < hidden; ++h) {
              const float got =
                  Bf16ToFloat(rows.bf16[(static_cast<size_t>(l) * rows.tokens + t) * hidden + h]);
              const float ref = want[(static_cast<size_t>(l) * n + rows.offset + t) * hidden + h];
              // bf16 keeps 8 significant bits: half an ulp is 2^-9 of the value; the rest is
              // batched-versus-single fp32 arithmetic.
              const double err = std::abs(got - ref) / (std::abs(ref) * 0x1p-8 + 1e-3);
              worst = std::max(worst, err);
            }
          }
        }
      }
      EXPECT_LE(worst, 1.0) << label;
    }
  }
}

}  // namespace
}  // namespace tandem
