// The registry's records and the router's view of it, without Redis.
#include "router/registry.h"

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

WorkerRecord Verifier(const std::string& id, const std::string& address) {
  return WorkerRecord{.role = "verifier",
                      .worker_id = id,
                      .address = address,
                      .model = "m",
                      .modes = {"ar", "jacobi"},
                      .max_context = 512};
}

WorkerRecord Drafter(const std::string& id, const std::string& address, int running) {
  return WorkerRecord{.role = "drafter", .worker_id = id, .address = address, .running = running};
}

TEST(WorkerRecordTest, RoundTripsThroughJson) {
  WorkerRecord record = Verifier("v1", "10.0.0.1:7000");
  record.running = 3;
  record.queued = 2;
  record.kv_usage_ratio = 0.25;
  record.draining = true;
  EXPECT_EQ(WorkerKey(record), "tandem:worker:verifier:v1");
  absl::StatusOr<WorkerRecord> decoded = DecodeWorkerRecord(EncodeWorkerRecord(record));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->role, "verifier");
  EXPECT_EQ(decoded->worker_id, "v1");
  EXPECT_EQ(decoded->address, "10.0.0.1:7000");
  EXPECT_EQ(decoded->model, "m");
  EXPECT_EQ(decoded->modes, (std::vector<std::string>{"ar", "jacobi"}));
  EXPECT_EQ(decoded->max_context, 512);
  EXPECT_EQ(decoded->running, 3);
  EXPECT_EQ(decoded->queued, 2);
  EXPECT_DOUBLE_EQ(decoded->kv_usage_ratio, 0.25);
  EXPECT_TRUE(decoded->draining);
  WorkerRecord drafter = Drafter("d1", "10.0.0.2:7001", 0);
  drafter.target = "m";
  absl::StatusOr<WorkerRecord> decoded_drafter = DecodeWorkerRecord(EncodeWorkerRecord(drafter));
  ASSERT_TRUE(decoded_drafter.ok()) << decoded_drafter.status();
  EXPECT_EQ(decoded_drafter->target, "m");
}

TEST(WorkerRecordTest, MalformedRecordsSayWhatIsWrong) {
  EXPECT_EQ(DecodeWorkerRecord("not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeWorkerRecord("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status missing = DecodeWorkerRecord(R"({"role":"verifier","worker_id":"v"})").status();
  EXPECT_NE(missing.message().find("'address'"), std::string::npos) << missing;
  absl::Status wrong_type =
      DecodeWorkerRecord(R"({"role":"verifier","worker_id":"v","address":"a:1","max_context":"x"})")
          .status();
  EXPECT_EQ(wrong_type.code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegistryViewTest, RegisteredVerifiersJoinAndExpiredOnesAreRetired) {
  VerifierPool pool({"static:1"});
  RegistryView view(&pool);
  RegistryView::Changes changes = view.Apply({Verifier("a", "a:1"), Verifier("b", "b:1")});
  EXPECT_EQ(changes.added, (std::vector<std::string>{"verifier a:1", "verifier b:1"}));
  ASSERT_EQ(pool.size(), 3u);
  EXPECT_EQ(pool.address(1), "a:1");
  EXPECT_FALSE(pool.Retired(1));

  // A listing without b while b answers the router's polls (the registry lost its data): b
  // stays in service.
  pool.SetHealthy(2, true);
  changes = view.Apply({Verifier("a", "a:1")});
  EXPECT_TRUE(changes.removed.empty());
  EXPECT_FALSE(pool.Retired(2));
  // b stops answering (the monitor marks it down): the next listing without it retires it; its
  // index stays.
  pool.SetHealthy(2, false);
  changes = view.Apply({Verifier("a", "a:1")});
  EXPECT_EQ(changes.removed, (std::vector<std::string>{"verifier b:1"}));
  EXPECT_TRUE(pool.Retired(2));
  EXPECT_FALSE(pool.Retired(1));

  // b comes back (a restart at the same address): same index, revived.
  changes = view.Apply({Verifier("a", "a:1"), Verifier("b2", "b:1")});
  EXPECT_EQ(changes.added, (std::vector<std::string>{"verifier b:1"}));
  EXPECT_EQ(pool.size(), 3u);
  EXPECT_FALSE(pool.Retired(2));
}

TEST(RegistryViewTest, StaticVerifiersAreNeverRetired) {
  VerifierPool pool({"static:1"});
  RegistryView view(&pool);
  view.Apply({Verifier("s", "static:1")});
  RegistryView::Changes changes = view.Apply({});
  EXPECT_TRUE(changes.removed.empty());
  EXPECT_FALSE(pool.Retired(0));
  EXPECT_EQ(pool.size(), 1u);
}

TEST(RegistryViewTest, RetiredVerifiersAreOutOfModelsAndAcquire) {
  VerifierPool pool({});
  RegistryView view(&pool);
  view.Apply({Verifier("a", "a:1")});
  pool.SetInfo(0, VerifierInfo{.model = "m", .modes = {"ar"}, .max_context = 512});
  pool.SetHealthy(0, true);
  ASSERT_EQ(pool.Models().size(), 1u);
  ASSERT_TRUE(pool.Acquire("m", "ar").ok());
  pool.SetHealthy(0, false);  // gone from the registry and no longer answering
  view.Apply({});
  EXPECT_TRUE(pool.Models().empty());
  EXPECT_EQ(pool.Acquire("m", "ar").status().code(), absl::StatusCode::kUnavailable);
  pool.Release(0);  // a stream in flight on a retired entry still ends normally
  EXPECT_EQ(pool.InFlight(0), 0);
}

TEST(RegistryViewTest, PicksTheLeastBusyDrafterThatIsNotDraining) {
  VerifierPool pool({});
  RegistryView view(&pool);
  EXPECT_EQ(view.PickDrafter("m"), "");
  WorkerRecord draining = Drafter("d0", "d0:1", 0);
  draining.draining = true;
  view.Apply({draining, Drafter("d1", "d1:1", 5), Drafter("d2", "d2:1", 1)});
  EXPECT_EQ(view.PickDrafter("m"), "d2:1");
  EXPECT_EQ(view.Drafters().size(), 3u);
  // Drafters missing from a listing are kept for a few (a registry that lost its data has them
  // back within a heartbeat), then dropped.
  RegistryView::Changes changes;
  for (int listing = 1; listing < kDrafterAbsentListings; ++listing) {
    changes = view.Apply({Drafter("d1", "d1:1", 5)});
    EXPECT_TRUE(changes.removed.empty()) << listing;
    EXPECT_EQ(view.Drafters().size(), 3u);
  }
  changes = view.Apply({Drafter("d1", "d1:1", 5)});
  EXPECT_EQ(changes.removed, (std::vector<std::string>{"drafter d0:1", "drafter d2:1"}));
  EXPECT_EQ(view.PickDrafter("m"), "d1:1");
  // One that comes back in time is never dropped.
  view.Apply({Drafter("d1", "d1:1", 5), Drafter("d2", "d2:1", 1)});
  for (int listing = 1; listing < kDrafterAbsentListings; ++listing) {
    view.Apply({Drafter("d1", "d1:1", 5)});
  }
  changes = view.Apply({Drafter("d1", "d1:1", 5), Drafter("d2", "d2:1", 1)});
  EXPECT_TRUE(changes.removed.empty());
  EXPECT_EQ(view.Drafters().size(), 2u);
}

// A drafter built for a model (a DFlash drafter's target, or a drafter hosting the tri-mode
// target itself) serves that model's requests first and never another model's; a generic one
// serves any model that has none of its own.
TEST(RegistryViewTest, PicksADrafterBuiltForTheRequestsModelFirst) {
  VerifierPool pool({});
  RegistryView view(&pool);
  WorkerRecord for_a = Drafter("da", "da:1", 7);
  for_a.target = "a";
  WorkerRecord for_b = Drafter("db", "db:1", 0);
  for_b.target = "b";
  view.Apply({for_a, for_b, Drafter("g", "g:1", 0)});
  EXPECT_EQ(view.PickDrafter("a"), "da:1");  // built for it, though busier than the generic one
  EXPECT_EQ(view.PickDrafter("b"), "db:1");
  EXPECT_EQ(view.PickDrafter("c"), "g:1");  // none built for it: the generic one
  // Without a generic drafter, a model with none of its own gets none (not another model's).
  view.Apply({for_a, for_b});
  for (int listing = 0; listing < kDrafterAbsentListings; ++listing) view.Apply({for_a, for_b});
  EXPECT_EQ(view.PickDrafter("c"), "");
  // A draining one is skipped even when built for the model.
  for_a.draining = true;
  view.Apply({for_a, for_b, Drafter("g", "g:1", 3)});
  EXPECT_EQ(view.PickDrafter("a"), "g:1");
}

// Redis restarted empty: the listing is empty until the workers' next heartbeats. Answering
// verifiers stay in service throughout (before, every one was dropped and requests failed with
// "no healthy verifier" until each registered again).
TEST(RegistryViewTest, AnEmptiedRegistryKeepsAnsweringVerifiersInService) {
  VerifierPool pool({});
  RegistryView view(&pool);
  view.Apply({Verifier("a", "a:1"), Verifier("b", "b:1"), Drafter("d", "d:1", 0)});
  for (size_t i = 0; i < 2; ++i) {
    pool.SetInfo(i, VerifierInfo{.model = "m", .modes = {"ar"}, .max_context = 512});
    pool.SetHealthy(i, true);
  }
  for (int listing = 0; listing < 3; ++listing) {
    RegistryView::Changes changes = view.Apply({});
    EXPECT_TRUE(changes.removed.empty());
    absl::StatusOr<size_t> acquired = pool.Acquire("m", "ar");
    ASSERT_TRUE(acquired.ok()) << acquired.status();
    pool.Release(*acquired);
    EXPECT_EQ(view.PickDrafter("m"), "d:1");
  }
  // The heartbeats register them again: nothing was ever removed, so nothing is added.
  RegistryView::Changes back =
      view.Apply({Verifier("a", "a:1"), Verifier("b", "b:1"), Drafter("d", "d:1", 0)});
  EXPECT_TRUE(back.added.empty());
  EXPECT_TRUE(back.removed.empty());
}

TEST(VerifierPoolTest, AcquireAvoidsTheVerifierThatJustFailed) {
  VerifierPool pool({"a:1", "b:1"});
  for (size_t i = 0; i < 2; ++i) {
    pool.SetInfo(i, VerifierInfo{.model = "m", .modes = {"ar"}, .max_context = 512});
    pool.SetHealthy(i, true);
  }
  for (int k = 0; k < 4; ++k) {
    absl::StatusOr<size_t> picked = pool.Acquire("m", "ar", {.avoid = 0});
    ASSERT_TRUE(picked.ok());
    EXPECT_EQ(*picked, 1u);
  }
  pool.SetHealthy(1, false);
  EXPECT_EQ(pool.Acquire("m", "ar", {.avoid = 0}).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.Add("b:1"), 1u);
  EXPECT_EQ(pool.Add("c:1"), 2u);
}

}  // namespace
}  // namespace tandem::router
