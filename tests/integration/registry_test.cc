// The Redis worker registry with real processes: a redis-server started by the test, workers
// started with --redis, and a router that knows its verifiers and drafter only from the registry.
// Registration, expiry of a killed worker, and a Redis restart while requests flow.
#include "router/registry.h"

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cli/child_process.h"
#include "services/cli/redis_process.h"
#include "services/common/redis_client.h"
#include "tests/integration/cluster.h"
#include "tests/worker/model/checkpoint/temp_dir.h"

namespace tandem::testing {
namespace {

// The registered records of `role`, read with a client of the test's own.
std::vector<router::WorkerRecord> Registered(RedisClient& client, const std::string& role) {
  std::vector<router::WorkerRecord> out;
  absl::StatusOr<RedisReply> keys =
      client.Command({"KEYS", absl::StrCat(std::string(router::kWorkerKeyPrefix), role, ":*")});
  if (!keys.ok()) return out;
  for (const RedisReply& key : keys->elements) {
    absl::StatusOr<RedisReply> value = client.Command({"GET", key.str});
    if (!value.ok() || value->type != RedisReply::Type::kString) continue;
    absl::StatusOr<router::WorkerRecord> record = router::DecodeWorkerRecord(value->str);
    if (record.ok()) out.push_back(*record);
  }
  return out;
}

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return condition();
}

int ModelCount(v1::Generation::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListModelsResponse reply;
  grpc::Status status = stub.ListModels(&context, v1::ListModelsRequest(), &reply);
  return status.ok() ? reply.models_size() : -1;
}

v1::GenerateRequest Short(const std::string& mode) {
  v1::GenerateRequest request;
  request.set_prompt("def add(a, b):");
  request.set_mode(mode);
  request.set_max_tokens(16);
  return request;
}

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status started = redis_.Start(FreeLoopbackPort());
    ASSERT_TRUE(started.ok()) << started;
    client_ = std::make_unique<RedisClient>(
        RedisClient::Options{.address = {.host = "127.0.0.1", .port = redis_.port()},
                             .min_backoff = absl::Milliseconds(20),
                             .max_backoff = absl::Milliseconds(100)});
  }

  // A worker of `folder` registered in this test's Redis; its address.
  std::string StartWorker(const std::string& folder, std::unique_ptr<ChildProcess>* process) {
    std::string address;
    std::vector<std::string> argv = {BinaryPath(folder, "tandem-" + folder),
                                     "--model",
                                     TargetModelDir(),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--redis",
                                     redis_.address()};
    // Drafts that come late make AR steps; on a loaded machine a short request could then end
    // without one draft, and these tests check where the drafter came from, not its speed.
    if (folder == "verifier") argv.insert(argv.end(), {"--draft-timeout-ms", "5000"});
    auto child = StartService(folder, argv, &address);
    EXPECT_TRUE(child.ok()) << child.status();
    if (child.ok()) *process = std::move(*child);
    return address;
  }

  std::string StartRouter() {
    std::string address;
    auto child = StartService("router",
                              {BinaryPath("router", "tandem-router"), "--listen", "127.0.0.1:0",
                               "--redis", redis_.address()},
                              &address);
    EXPECT_TRUE(child.ok()) << child.status();
    if (child.ok()) router_ = std::move(*child);
    return address;
  }

  RedisProcess redis_;
  std::unique_ptr<RedisClient> client_;
  std::unique_ptr<ChildProcess> router_;
};

TEST_F(RegistryTest, WorkersRegisterAndTheRouterServesFromTheRegistry) {
  std::unique_ptr<ChildProcess> drafter, verifier;
  const std::string drafter_address = StartWorker("drafter", &drafter);
  const std::string verifier_address = StartWorker("verifier", &verifier);
  ASSERT_TRUE(drafter && verifier);

  // A worker registers right after it announces its address; give it a moment.
  ASSERT_TRUE(
      WaitFor([&] { return Registered(*client_, "verifier").size() == 1; }, absl::Seconds(5)));
  ASSERT_TRUE(
      WaitFor([&] { return Registered(*client_, "drafter").size() == 1; }, absl::Seconds(5)));
  const std::vector<router::WorkerRecord> verifiers = Registered(*client_, "verifier");
  ASSERT_EQ(verifiers.size(), 1u);
  EXPECT_EQ(verifiers[0].address, verifier_address);
  EXPECT_EQ(verifiers[0].model, "tandem-target");
  EXPECT_EQ(verifiers[0].max_context, 512);
  EXPECT_FALSE(verifiers[0].modes.empty());
  absl::StatusOr<RedisReply> ttl = client_->Command({"PTTL", router::WorkerKey(verifiers[0])});
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GT(ttl->integer, 0);
  EXPECT_LE(ttl->integer, 6000);
  const std::vector<router::WorkerRecord> drafters = Registered(*client_, "drafter");
  ASSERT_EQ(drafters.size(), 1u);
  EXPECT_EQ(drafters[0].address, drafter_address);

  // The router has no --verifier and no --drafter: both come from the registry.
  const std::string router_address = StartRouter();
  ASSERT_TRUE(router_);
  auto stub = GenerationStub(router_address);
  EXPECT_EQ(ModelCount(*stub), 1);
  for (const std::string mode : {"ar", "spec"}) {
    const StreamResult result = Generate(*stub, Short(mode));
    ASSERT_TRUE(result.status.ok()) << mode << ": " << result.status.error_message();
    EXPECT_EQ(result.tokens.size(), 16u) << mode;
  }
  // The spec request drafted with the registered drafter: it accepted draft tokens.
  const StreamResult spec = Generate(*stub, Short("spec"));
  ASSERT_TRUE(spec.status.ok());
  EXPECT_GT(spec.last.usage().draft_tokens(), 0) << router_->StderrTail();
}

// A Redis that requires a password: clients without it or with a wrong one are refused with
// Redis' answer, and workers and the router given it (--redis-password-file) register and serve.
TEST(RedisAuthTest, WorkersAndTheRouterAuthenticateToRedis) {
  RedisProcess redis;
  const absl::Status started = redis.Start(FreeLoopbackPort(), "registry-secret");
  ASSERT_TRUE(started.ok()) << started;
  const RedisAddress address{.host = "127.0.0.1", .port = redis.port()};
  RedisClient anonymous({.address = address});
  absl::StatusOr<RedisReply> refused = anonymous.Command({"PING"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("NOAUTH"));
  RedisClient wrong({.address = address, .password = "not-it"});
  refused = wrong.Command({"PING"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("refused AUTH"));

  static const test::TempDir dir;
  const std::string password_file = dir.File("redis-password");
  std::ofstream(password_file) << "registry-secret\n";
  EXPECT_FALSE(RedisClient::WithAuth(address, {.password_file = dir.File("missing")}).ok());
  absl::StatusOr<RedisClient::Options> options =
      RedisClient::WithAuth(address, {.password_file = password_file});
  ASSERT_TRUE(options.ok()) << options.status();
  RedisClient client(*options);
  ASSERT_TRUE(client.Command({"PING"}).ok());

  std::string verifier_address, router_address;
  auto verifier = StartService(
      "verifier",
      {BinaryPath("verifier", "tandem-verifier"), "--model", TargetModelDir(), "--listen",
       "127.0.0.1:0", "--redis", redis.address(), "--redis-password-file", password_file},
      &verifier_address);
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  ASSERT_TRUE(
      WaitFor([&] { return Registered(client, "verifier").size() == 1; }, absl::Seconds(10)));
  auto router = StartService("router",
                             {BinaryPath("router", "tandem-router"), "--listen", "127.0.0.1:0",
                              "--redis", redis.address(), "--redis-password-file", password_file},
                             &router_address);
  ASSERT_TRUE(router.ok()) << router.status();
  auto stub = GenerationStub(router_address);
  ASSERT_TRUE(WaitFor([&] { return ModelCount(*stub) == 1; }, absl::Seconds(10)))
      << (*router)->StderrTail();
  const StreamResult result = Generate(*stub, Short("ar"));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens.size(), 16u);
}

TEST_F(RegistryTest, KilledWorkerExpiresFromTheRoutersView) {
  std::unique_ptr<ChildProcess> verifier;
  StartWorker("verifier", &verifier);
  ASSERT_TRUE(verifier);
  const std::string router_address = StartRouter();
  ASSERT_TRUE(router_);
  auto stub = GenerationStub(router_address);
  ASSERT_EQ(ModelCount(*stub), 1);

  verifier->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  // The key lives at most its TTL (6 s); the router lists the registry every second.
  EXPECT_TRUE(WaitFor([&] { return Registered(*client_, "verifier").empty(); }, absl::Seconds(8)));
  EXPECT_TRUE(WaitFor([&] { return ModelCount(*stub) == 0; }, absl::Seconds(3)))
      << router_->StderrTail();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(9));
  EXPECT_NE(router_->StderrTail().find("registration gone: verifier"), std::string::npos)
      << router_->StderrTail();
  const StreamResult result = Generate(*stub, Short("ar"));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(RegistryTest, RedisRestartWhileRequestsFlowFailsNothing) {
  std::unique_ptr<ChildProcess> verifier;
  StartWorker("verifier", &verifier);
  ASSERT_TRUE(verifier);
  const std::string router_address = StartRouter();
  ASSERT_TRUE(router_);
  auto stub = GenerationStub(router_address);
  ASSERT_EQ(ModelCount(*stub), 1);

  std::atomic<bool> stop{false};
  std::atomic<int> done{0};
  std::atomic<int> failed{0};
  std::string first_failure;
  std::thread load([&] {
    while (!stop.load()) {
      const StreamResult result = Generate(*stub, Short("ar"));
      if (result.status.ok()) {
        done.fetch_add(1);
      } else if (failed.fetch_add(1) == 0) {
        first_failure = result.status.error_message();
      }
    }
  });
  absl::SleepFor(absl::Seconds(1));
  redis_.Kill();
  const int before = done.load();
  // Longer than the TTL: a router that dropped workers it cannot see would fail requests now.
  absl::SleepFor(absl::Seconds(8));
  const int during = done.load();
  const absl::Status restarted = redis_.Start(redis_.port());
  ASSERT_TRUE(restarted.ok()) << restarted;
  // The worker registers again at its next heartbeat (2 s; its client backs off at most that).
  EXPECT_TRUE(
      WaitFor([&] { return Registered(*client_, "verifier").size() == 1; }, absl::Seconds(6)))
      << verifier->StderrTail();
  absl::SleepFor(absl::Seconds(2));
  stop.store(true);
  load.join();
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_GT(during, before) << "no request completed while Redis was away";
  EXPECT_GT(done.load(), during);
  EXPECT_NE(router_->StderrTail().find("cannot read the registry"), std::string::npos);
  EXPECT_NE(verifier->StderrTail().find("registered in Redis at"), std::string::npos)
      << verifier->StderrTail();
}

}  // namespace
}  // namespace tandem::testing
