// The router's verifier table: model catalog, least-loaded choice, health.
#include "router/verifier_pool.h"

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

VerifierInfo Info(std::string model, std::vector<std::string> modes, int context,
                  std::string worker) {
  return {.model = std::move(model),
          .modes = std::move(modes),
          .max_context = context,
          .worker_id = std::move(worker)};
}

TEST(VerifierPoolTest, KnowsNoModelBeforeAnyInfo) {
  VerifierPool pool({"a:1"});
  EXPECT_TRUE(pool.Models().empty());
  EXPECT_EQ(pool.ResolveModel("m").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.Acquire("m", "ar").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.WorkerId(0), "");
}

TEST(VerifierPoolTest, ModelsMergeModesAndTakeTheSmallestContext) {
  VerifierPool pool({"a:1", "b:2", "c:3"});
  pool.SetInfo(0, Info("m", {"ar", "spec"}, 512, "w0"));
  pool.SetInfo(1, Info("m", {"ar", "jacobi"}, 256, "w1"));
  pool.SetInfo(2, Info("k", {"ar"}, 1024, "w2"));
  auto models = pool.Models();
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[0].id, "k");
  EXPECT_EQ(models[1].id, "m");
  EXPECT_EQ(models[1].modes, (std::vector<std::string>{"ar", "spec", "jacobi"}));
  EXPECT_EQ(models[1].max_context, 256);
}

TEST(VerifierPoolTest, ResolvesEmptyModelOnlyWhenThereIsOne) {
  VerifierPool pool({"a:1", "b:2"});
  pool.SetInfo(0, Info("m", {"ar"}, 512, "w0"));
  auto only = pool.ResolveModel("");
  ASSERT_TRUE(only.ok()) << only.status();
  EXPECT_EQ(only->id, "m");
  auto unknown = pool.ResolveModel("x");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown model 'x'; this router serves: m"),
            std::string::npos)
      << unknown.status();
  pool.SetInfo(1, Info("k", {"ar"}, 512, "w1"));
  EXPECT_EQ(pool.ResolveModel("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(VerifierPoolTest, AcquiresTheLeastLoadedHealthyVerifier) {
  VerifierPool pool({"a:1", "b:2", "c:3"});
  for (size_t i = 0; i < 3; ++i) {
    pool.SetInfo(i, Info("m", {"ar"}, 512, "w" + std::to_string(i)));
    pool.SetHealthy(i, true);
  }
  std::vector<int> picks(3, 0);
  for (int n = 0; n < 6; ++n) {
    auto index = pool.Acquire("m", "ar");
    ASSERT_TRUE(index.ok()) << index.status();
    ++picks[*index];
  }
  EXPECT_EQ(picks, (std::vector<int>{2, 2, 2}));
  pool.Release(1);
  pool.Release(1);
  EXPECT_EQ(*pool.Acquire("m", "auto"), 1u);
  pool.SetHealthy(1, false);
  auto next = pool.Acquire("m", "");
  ASSERT_TRUE(next.ok());
  EXPECT_NE(*next, 1u);
  EXPECT_EQ(pool.InFlight(1), 1);
}

TEST(VerifierPoolTest, AcquireHonoursModelAndMode) {
  VerifierPool pool({"a:1", "b:2"});
  pool.SetInfo(0, Info("m", {"ar"}, 512, "w0"));
  pool.SetInfo(1, Info("m", {"ar", "spec"}, 512, "w1"));
  pool.SetHealthy(0, true);
  pool.SetHealthy(1, true);
  for (int n = 0; n < 3; ++n) EXPECT_EQ(*pool.Acquire("m", "spec"), 1u);
  auto missing = pool.Acquire("k", "ar");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(missing.status().message().find("model 'k'"), std::string::npos);
  pool.SetHealthy(1, false);
  EXPECT_EQ(pool.Acquire("m", "spec").status().code(), absl::StatusCode::kUnavailable);
}

TEST(VerifierPoolTest, AGainBeyondTheMarginBeatsBalancingAndTiesStayLeastLoaded) {
  VerifierPool pool({"a:1", "b:2"});
  for (size_t i = 0; i < 2; ++i) {
    pool.SetInfo(i, Info("m", {"ar"}, 512, "w" + std::to_string(i)));
    pool.SetHealthy(i, true);
  }
  // b carries one stream more than a.
  ASSERT_EQ(*pool.Acquire("m", "ar"), 0u);
  ASSERT_EQ(*pool.Acquire("m", "ar"), 1u);
  ASSERT_EQ(*pool.Acquire("m", "ar"), 0u);
  pool.Release(0);
  ASSERT_EQ(pool.InFlight(0), 1);
  ASSERT_EQ(pool.InFlight(1), 1);
  ASSERT_EQ(*pool.Acquire("m", "ar"), 1u);  // now a: 1, b: 2
  std::vector<double> gains = {100, 150};   // by index
  auto gain = [&](const VerifierInfo& info, const VerifierLoad*, double) -> std::optional<double> {
    return gains[info.worker_id == "w0" ? 0 : 1];
  };
  // b's request adds 50 % more: it goes there although b is busier.
  EXPECT_EQ(*pool.Acquire("m", "", {.gain = gain}), 1u);
  pool.Release(1);
  // Within the margin (105 vs 100): balancing decides.
  gains = {100, 105};
  EXPECT_EQ(*pool.Acquire("m", "", {.gain = gain}), 0u);
  pool.Release(0);
  // Without an estimate for the least-loaded verifier, balancing decides too.
  auto partial = [&](const VerifierInfo& info, const VerifierLoad*,
                     double) -> std::optional<double> {
    if (info.worker_id == "w0") return std::nullopt;
    return 1000.0;
  };
  EXPECT_EQ(*pool.Acquire("m", "", {.gain = partial}), 0u);
  pool.Release(0);
  // A verifier that must be avoided is never picked, however good its estimate.
  gains = {100, 1000};
  EXPECT_EQ(*pool.Acquire("m", "", {.avoid = 1, .gain = gain}), 0u);
}

// A closed-loop client at C = 2: the report saw both of the router's streams running; one ended
// since and its successor is being placed. The verifier holds 2 sequences now, not the report's
// 2 plus the new one; other routers' streams in the report still count.
TEST(VerifierPoolTest, LoadEstimateReplacesTheRoutersOwnStreamsInTheReportWithCurrentOnes) {
  VerifierPool pool({"a:1"});
  pool.SetInfo(0, Info("m", {"ar"}, 512, "w0"));
  pool.SetHealthy(0, true);
  EXPECT_EQ(EstimatedSequences(nullptr, 0), 0);
  EXPECT_EQ(EstimatedSequences(nullptr, 3), 3);
  ASSERT_TRUE(pool.Acquire("m", "ar").ok());
  ASSERT_TRUE(pool.Acquire("m", "ar").ok());
  pool.SetLoad(0, VerifierLoad{.running = 2, .queued = 0});
  EXPECT_EQ(pool.Load(0)->own_streams, 2);
  pool.Release(0);                            // a request ended
  ASSERT_TRUE(pool.Acquire("m", "ar").ok());  // its successor arrives
  EXPECT_EQ(EstimatedSequences(pool.Load(0).get(), pool.InFlight(0)), 2);
  pool.Release(0);
  EXPECT_EQ(EstimatedSequences(pool.Load(0).get(), pool.InFlight(0)), 1);

  // Another router's 3 streams were in the report as well.
  pool.SetLoad(0, VerifierLoad{.running = 4, .queued = 1});
  EXPECT_EQ(pool.Load(0)->own_streams, 1);
  EXPECT_EQ(EstimatedSequences(pool.Load(0).get(), pool.InFlight(0)), 5);
  ASSERT_TRUE(pool.Acquire("m", "ar").ok());
  EXPECT_EQ(EstimatedSequences(pool.Load(0).get(), pool.InFlight(0)), 6);
  // A report that counted fewer than the router's streams (they had not reached the verifier
  // yet) adds no negative load.
  pool.SetLoad(0, VerifierLoad{.running = 0, .queued = 0});
  EXPECT_EQ(EstimatedSequences(pool.Load(0).get(), pool.InFlight(0)), 2);
}

// Four closed-loop clients that started together finish together: their next requests arrive
// one by one, seeing 1, 2, 3 streams in flight, while the verifier is back at 4 within
// milliseconds. Streams() holds the recent average for them; a burst still counts at once, and
// an old load fades within seconds.
TEST(VerifierPoolTest, StreamsHoldTheRecentAverageWhileFinishedRequestsAreReplaced) {
  absl::Time now = absl::UnixEpoch();
  VerifierPool pool({"a:1"}, [&now] { return now; });
  pool.SetInfo(0, Info("m", {"ar"}, 512, "w0"));
  pool.SetHealthy(0, true);
  EXPECT_EQ(pool.Streams(0), 0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.Acquire("m", "ar").ok());
  EXPECT_EQ(pool.Streams(0), 4);  // the burst counts at once
  now += absl::Seconds(5);
  EXPECT_NEAR(pool.Streams(0), 4, 0.01);
  for (int i = 0; i < 4; ++i) pool.Release(0);
  for (int i = 1; i <= 3; ++i) {
    now += absl::Milliseconds(1);
    ASSERT_TRUE(pool.Acquire("m", "ar").ok());
    EXPECT_EQ(pool.InFlight(0), i);
    EXPECT_GT(pool.Streams(0), 3.9) << "arrival " << i;
  }
  // Load that went away fades: after 5 s at 1 stream the average is near 1.
  pool.Release(0);
  pool.Release(0);
  now += absl::Seconds(5);
  EXPECT_NEAR(pool.Streams(0), 1, 0.05);
  // The estimate of a verifier adds other routers' streams from the report to these.
  pool.SetLoad(0, VerifierLoad{.running = 3});
  EXPECT_NEAR(EstimatedSequences(pool.Load(0).get(), pool.Streams(0)), 3, 0.05);
}

// The rule between prefix affinity and balancing: the verifier that likely holds the prefix
// gets the request while it carries at most `prefer_slack` streams more than the least loaded.
TEST(VerifierPoolTest, APreferredVerifierWinsWithinTheSlackOnly) {
  VerifierPool pool({"a:1", "b:2"});
  for (size_t i = 0; i < 2; ++i) {
    pool.SetInfo(i, Info("m", {"ar"}, 512, "w" + std::to_string(i)));
    pool.SetHealthy(i, true);
  }
  const VerifierPool::Choice prefer_a{.prefer = 0, .prefer_slack = 2};
  // Even, then one, then two streams ahead: still the preferred one.
  EXPECT_EQ(*pool.Acquire("m", "ar", prefer_a), 0u);
  EXPECT_EQ(*pool.Acquire("m", "ar", prefer_a), 0u);
  EXPECT_EQ(*pool.Acquire("m", "ar", prefer_a), 0u);
  EXPECT_EQ(pool.InFlight(0), 3);
  // Three ahead is past the slack: the least loaded.
  EXPECT_EQ(*pool.Acquire("m", "ar", prefer_a), 1u);
  EXPECT_EQ(*pool.Acquire("m", "ar", prefer_a), 0u);  // two ahead again
  // Slack 0: only while it is no busier than the least loaded.
  EXPECT_EQ(*pool.Acquire("m", "ar", {.prefer = 0}), 1u);
  // Never a verifier that is down, avoided or without the model.
  pool.SetHealthy(0, false);
  EXPECT_EQ(*pool.Acquire("m", "ar", prefer_a), 1u);
  pool.SetHealthy(0, true);
  EXPECT_EQ(*pool.Acquire("m", "ar", {.avoid = 0, .prefer = 0, .prefer_slack = 100}), 1u);
  EXPECT_EQ(pool.Acquire("k", "ar", prefer_a).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::router
