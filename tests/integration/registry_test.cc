// The Redis worker registry with real processes: a redis-server started by the test, workers
// started with --redis, and a router that knows its verifiers and drafter only from the registry.
// Registration, expiry of a killed worker, a Redis restart while requests flow, AUTH and TLS.
#include "router/registry.h"

#include <signal.h>

#include <atomic>
#include <cstdlib>
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

// Draft tokens a `spec` request through the router verified: the first of up to five requests
// that drafted at all. On a loaded machine a request's chains can all come late, and after a
// few late steps the verifier stops waiting for that drafter until a chain reaches a live
// sequence; requests of 64 tokens outlast a slow drafter's first chain, so the waits resume.
int SpecDraftTokens(v1::Generation::Stub& stub) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    v1::GenerateRequest request = Short("spec");
    request.set_max_tokens(64);
    const StreamResult spec = Generate(stub, request);
    EXPECT_TRUE(spec.status.ok()) << spec.status.error_message();
    if (spec.last.usage().draft_tokens() > 0) return spec.last.usage().draft_tokens();
  }
  return 0;
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

  // A worker of `folder` registered in this test's Redis, with `extra` flags; its address.
  std::string StartWorker(const std::string& folder, std::unique_ptr<ChildProcess>* process,
                          const std::vector<std::string>& extra = {}) {
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
    argv.insert(argv.end(), extra.begin(), extra.end());
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
  // The spec requests draft with the registered drafter: they verify draft tokens.
  EXPECT_GT(SpecDraftTokens(*stub), 0) << router_->StderrTail();
}

// A drafter hosting the tri-mode target with mask drafts (split self-speculation) registers as
// built for that model, and the router hands it that model's spec requests.
TEST_F(RegistryTest, AMaskDraftsDrafterRegistersAsBuiltForItsModel) {
  std::unique_ptr<ChildProcess> drafter, verifier;
  StartWorker("drafter", &drafter, {"--mask-drafts", "4"});
  StartWorker("verifier", &verifier);
  ASSERT_TRUE(drafter && verifier);
  ASSERT_TRUE(
      WaitFor([&] { return Registered(*client_, "drafter").size() == 1; }, absl::Seconds(5)));
  const std::vector<router::WorkerRecord> drafters = Registered(*client_, "drafter");
  ASSERT_EQ(drafters.size(), 1u);
  EXPECT_EQ(drafters[0].target, "tandem-target");
  EXPECT_EQ(drafters[0].modes, (std::vector<std::string>{"mask_drafts"}));
  ASSERT_TRUE(
      WaitFor([&] { return Registered(*client_, "verifier").size() == 1; }, absl::Seconds(5)));
  const std::string router_address = StartRouter();
  ASSERT_TRUE(router_);
  auto stub = GenerationStub(router_address);
  ASSERT_TRUE(WaitFor([&] { return ModelCount(*stub) == 1; }, absl::Seconds(10)));
  EXPECT_GT(SpecDraftTokens(*stub), 0) << router_->StderrTail();
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

// Certificates made by openssl for the TLS tests: a CA, a Redis server certificate for 127.0.0.1
// and localhost, a client certificate, all signed by the CA, and a second, unrelated CA.
class RedisTlsTest : public ::testing::Test {
 protected:
  // In SetUp, not SetUpTestSuite: a failure there fails the test instead of reading as a skip.
  void SetUp() override {
    const std::string script =
        "set -e; cd " + dir_.path().string() +
        "; for ca in ca other-ca; do openssl req -x509 -newkey rsa:2048 -nodes -keyout \\$ca.key "
        "-out \\$ca.pem -days 2 -subj /CN=tandem-\\$ca 2>/dev/null; done"
        "; printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext"
        "; openssl req -newkey rsa:2048 -nodes -keyout redis.key -out redis.csr "
        "-subj /CN=redis 2>/dev/null"
        "; openssl x509 -req -in redis.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out redis.pem -days 2 -extfile san.ext 2>/dev/null"
        "; openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
        "-subj /CN=tandem-worker 2>/dev/null"
        "; openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out client.pem -days 2 2>/dev/null";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
  }
  std::string File(const std::string& name) const { return dir_.File(name); }

  // A Redis on TLS only that requires a client certificate and a password.
  void StartRedis() {
    const absl::Status started = redis_.Start(FreeLoopbackPort(), "registry-secret",
                                              {.cert_file = File("redis.pem"),
                                               .key_file = File("redis.key"),
                                               .ca_file = File("ca.pem"),
                                               .require_client_cert = true});
    ASSERT_TRUE(started.ok()) << started;
  }

  // The command's status from a client with `auth`'s TLS and the test's password.
  absl::Status Ping(const RedisAuth& auth, const std::string& host = "127.0.0.1") {
    absl::StatusOr<RedisClient::Options> options =
        RedisClient::WithAuth({.host = host, .port = redis_.port()}, auth);
    if (!options.ok()) return options.status();
    options->password = "registry-secret";
    return RedisClient(*options).Command({"PING"}).status();
  }

  RedisAuth Trusted() const {
    return {.tls_ca_file = File("ca.pem"),
            .tls_cert_file = File("client.pem"),
            .tls_key_file = File("client.key")};
  }

  const test::TempDir dir_;
  RedisProcess redis_;
};

// Over TLS the client verifies Redis' certificate (its CA and the name or address dialled) and
// presents its own; every refusal is an error that says why, and replies larger than one TLS
// record arrive whole.
TEST_F(RedisTlsTest, ClientsVerifyRedisAndPresentTheirCertificate) {
  StartRedis();
  const RedisAuth trusted = Trusted();
  ASSERT_TRUE(Ping(trusted).ok()) << Ping(trusted);
  RedisAuth named = trusted;
  named.tls_server_name = "localhost";
  EXPECT_TRUE(Ping(named).ok()) << Ping(named);

  RedisAuth other_ca = trusted;
  other_ca.tls_ca_file = File("other-ca.pem");
  absl::Status refused = Ping(other_ca);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("not trusted"));
  RedisAuth wrong_name = trusted;
  wrong_name.tls_server_name = "redis.example";
  refused = Ping(wrong_name);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("redis.example"));
  // Without a client certificate Redis ends the handshake; without TLS it never answers.
  refused = Ping({.tls_ca_file = File("ca.pem")});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  refused = Ping({});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;

  // Files that cannot be loaded are named before any connection is tried.
  absl::Status bad = Ping({.tls_ca_file = File("missing.pem")});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("missing.pem"));
  bad = Ping({.tls_ca_file = File("ca.pem"), .tls_cert_file = File("client.pem")});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  bad = Ping({.tls_ca_file = File("ca.pem"),
              .tls_cert_file = File("client.pem"),
              .tls_key_file = File("redis.key")});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("does not match"));

  // A 1 MiB value, many TLS records each way.
  absl::StatusOr<RedisClient::Options> options =
      RedisClient::WithAuth({.host = "127.0.0.1", .port = redis_.port()}, trusted);
  ASSERT_TRUE(options.ok()) << options.status();
  options->password = "registry-secret";
  options->min_backoff = options->max_backoff = absl::Milliseconds(50);
  RedisClient client(*options);
  const std::string value(1 << 20, 'v');
  ASSERT_TRUE(client.Command({"SET", "big", value}).ok());
  absl::StatusOr<RedisReply> read = client.Command({"GET", "big"});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->str, value);
  // A Redis restart: the next commands fail, then one reconnects with a new handshake.
  const absl::Status restarted = redis_.Start(redis_.port(), "registry-secret",
                                              {.cert_file = File("redis.pem"),
                                               .key_file = File("redis.key"),
                                               .ca_file = File("ca.pem"),
                                               .require_client_cert = true});
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE(WaitFor([&] { return client.Command({"PING"}).ok(); }, absl::Seconds(5)));
}

// Workers and the router given the TLS options (--redis-tls-ca, --redis-tls-cert,
// --redis-tls-key) register and serve through a Redis that speaks TLS only.
TEST_F(RedisTlsTest, WorkersAndTheRouterUseTheRegistryOverTls) {
  StartRedis();
  const std::string password_file = File("redis-password");
  std::ofstream(password_file) << "registry-secret\n";
  const std::vector<std::string> redis_args = {
      "--redis",         redis_.address(),  "--redis-password-file", password_file,
      "--redis-tls-ca",  File("ca.pem"),    "--redis-tls-cert",      File("client.pem"),
      "--redis-tls-key", File("client.key")};
  std::vector<std::string> verifier_argv = {BinaryPath("verifier", "tandem-verifier"), "--model",
                                            TargetModelDir(), "--listen", "127.0.0.1:0"};
  verifier_argv.insert(verifier_argv.end(), redis_args.begin(), redis_args.end());
  std::string verifier_address, router_address;
  auto verifier = StartService("verifier", verifier_argv, &verifier_address);
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  absl::StatusOr<RedisClient::Options> options =
      RedisClient::WithAuth({.host = "127.0.0.1", .port = redis_.port()}, Trusted());
  ASSERT_TRUE(options.ok()) << options.status();
  options->password = "registry-secret";
  RedisClient client(*options);
  ASSERT_TRUE(
      WaitFor([&] { return Registered(client, "verifier").size() == 1; }, absl::Seconds(10)))
      << (*verifier)->StderrTail();
  std::vector<std::string> router_argv = {BinaryPath("router", "tandem-router"), "--listen",
                                          "127.0.0.1:0"};
  router_argv.insert(router_argv.end(), redis_args.begin(), redis_args.end());
  auto router = StartService("router", router_argv, &router_address);
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
