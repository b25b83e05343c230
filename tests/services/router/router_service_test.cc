// The router's relay against an in-process scripted verifier: every message in order, upstream
// errors passed through, cancellation and deadlines carried upstream, admission.
#include "services/router/router_service.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "services/common/server.h"
#include "services/router/verifier_monitor.h"

namespace tandem {
namespace {

// Streams max_tokens messages of one token each (each over 23 bytes: gRPC serializes smaller
// ones differently). Prompt "fail" ends with FAILED_PRECONDITION
// after two messages; prompt "endless" streams until the call is cancelled.
class ScriptedVerifier final : public v1::Verifier::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::VerifyRequest* request) override {
    {
      absl::MutexLock lock(&mu_);
      last_request_ = *request;
      last_deadline_ = context->deadline();
    }
    return new Stream(this, *request);
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::WorkerInfoRequest*, v1::WorkerInfo* reply) override {
    reply->set_role("verifier");
    reply->set_model("m");
    reply->add_modes("ar");
    reply->add_modes("spec");
    reply->set_max_context(512);
    reply->set_worker_id("w1");
    reply->set_default_mode("ar");
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::WorkerLoadRequest*, v1::WorkerLoad* reply) override {
    reply->set_worker_id("w1");
    if (stalled) {
      reply->set_stalled(true);
      reply->set_stalled_seconds(42);
    }
    if (report_costs) {
      // 10 ms per step plus 1 ms per batch token; ar gains 1 token per 1-token extend, spec 3 per
      // 5-token extend: spec is the better mode at low load.
      for (double tokens : {1.0, 8.0, 64.0}) {
        v1::StepTime* point = reply->add_step_times();
        point->set_batch_tokens(tokens);
        point->set_step_seconds(0.010 + 0.001 * tokens);
        point->set_samples(10);
      }
      for (auto [mode, tpf, extend] : {std::tuple{"ar", 1.0, 1.0}, std::tuple{"spec", 3.0, 5.0}}) {
        v1::ModeCost* cost = reply->add_mode_costs();
        cost->set_mode(mode);
        v1::ModeLoad* point = cost->add_points();
        point->set_sequences(1);
        point->set_tokens_per_step(tpf);
        point->set_extend_tokens(extend);
        point->set_samples(10);
        // spec's first token comes 100 ms after submission, ar's after 1 ms.
        if (report_starts) point->set_start_seconds(std::string_view(mode) == "spec" ? 0.1 : 0.001);
      }
      if (report_starts) reply->set_request_tokens(64);
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::atomic<bool> report_costs{false};   // GetLoad carries a cost model
  std::atomic<bool> report_starts{false};  // ... with each mode's start cost
  std::atomic<bool> stalled{false};        // GetLoad reports a stalled engine

  v1::VerifyRequest last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }
  std::chrono::system_clock::time_point last_deadline() {
    absl::MutexLock lock(&mu_);
    return last_deadline_;
  }
  absl::Notification cancelled;

 private:
  class Stream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
   public:
    Stream(ScriptedVerifier* owner, const v1::VerifyRequest& request)
        : owner_(owner),
          script_(request.request().prompt()),
          count_(request.request().max_tokens()) {
      Next();
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
        return;
      }
      Next();
    }
    void OnCancel() override { owner_->cancelled.Notify(); }
    void OnDone() override { delete this; }

   private:
    void Next() {
      if (script_ == "fail" && sent_ == 2) {
        Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "boom"));
        return;
      }
      if (script_ != "endless" && sent_ == count_) {
        Finish(grpc::Status::OK);
        return;
      }
      response_.Clear();
      response_.add_token_ids(sent_);
      response_.set_text("t" + std::to_string(sent_));
      // Longer than gRPC's inlined slice, so the router's serialization takes its general path.
      response_.set_mode("a mode name long enough to leave the inline slice");
      if (script_ != "endless" && sent_ + 1 == count_) response_.set_finish_reason("length");
      ++sent_;
      StartWrite(&response_);
    }
    ScriptedVerifier* owner_;
    const std::string script_;
    const int count_;
    int sent_ = 0;
    v1::GenerateResponse response_;
  };

  absl::Mutex mu_;
  v1::VerifyRequest last_request_ ABSL_GUARDED_BY(mu_);
  std::chrono::system_clock::time_point last_deadline_ ABSL_GUARDED_BY(mu_);
};

class RouterServiceTest : public ::testing::Test {
 protected:
  void StartRouter(int max_in_flight, router::ModePolicy* policy = nullptr,
                   ServiceMetrics* metrics = nullptr) {
    auto verifier = StartServer(ServerFlags{}, {&verifier_});
    ASSERT_TRUE(verifier.ok()) << verifier.status();
    verifier_server_ = std::move(verifier->server);
    verifier_stub_ = v1::Verifier::NewStub(
        grpc::CreateChannel(verifier->address, grpc::InsecureChannelCredentials()));
    pool_ = std::make_unique<router::VerifierPool>(std::vector<std::string>{verifier->address});
    monitor_ = std::make_unique<VerifierMonitor>(
        pool_.get(), std::vector<v1::Verifier::Stub*>{verifier_stub_.get()});
    monitor_->Start(absl::Seconds(10));
    ASSERT_TRUE(pool_->Healthy(0));
    service_ = std::make_unique<RouterService>(
        pool_.get(), std::vector<v1::Verifier::Stub*>{verifier_stub_.get()},
        RouterOptions{.drafter = "drafter:1",
                      .max_in_flight = max_in_flight,
                      .metrics = metrics,
                      .mode_policy = policy});
    auto router = StartServer(ServerFlags{}, {service_.get()});
    ASSERT_TRUE(router.ok()) << router.status();
    router_server_ = std::move(router->server);
    client_ = v1::Generation::NewStub(
        grpc::CreateChannel(router->address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (router_server_) router_server_->Shutdown(std::chrono::system_clock::now());
    if (monitor_) monitor_->Stop();
    if (verifier_server_) verifier_server_->Shutdown(std::chrono::system_clock::now());
  }

  static v1::GenerateRequest Request(const std::string& prompt, int max_tokens) {
    v1::GenerateRequest request;
    request.set_prompt(prompt);
    request.set_max_tokens(max_tokens);
    return request;
  }

  ScriptedVerifier verifier_;
  std::unique_ptr<grpc::Server> verifier_server_;
  std::unique_ptr<v1::Verifier::Stub> verifier_stub_;
  std::unique_ptr<router::VerifierPool> pool_;
  std::unique_ptr<VerifierMonitor> monitor_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<grpc::Server> router_server_;
  std::unique_ptr<v1::Generation::Stub> client_;
};

TEST_F(RouterServiceTest, RelaysEveryMessageInOrder) {
  StartRouter(8);
  grpc::ClientContext context;
  auto reader = client_->Generate(&context, Request("hello", 100));
  v1::GenerateResponse message;
  int n = 0;
  while (reader->Read(&message)) {
    ASSERT_EQ(message.token_ids_size(), 1);
    EXPECT_EQ(message.token_ids(0), n);
    EXPECT_EQ(message.text(), "t" + std::to_string(n));
    EXPECT_EQ(message.mode(), "a mode name long enough to leave the inline slice");
    ++n;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(n, 100);
  EXPECT_EQ(message.finish_reason(), "length");
  const v1::VerifyRequest upstream = verifier_.last_request();
  EXPECT_EQ(upstream.request().model(), "m");  // "" resolved to the only model
  EXPECT_EQ(upstream.request().prompt(), "hello");
  EXPECT_EQ(upstream.drafter(), "drafter:1");
  EXPECT_EQ(pool_->InFlight(0), 0);
}

TEST_F(RouterServiceTest, PassesUpstreamErrorsThrough) {
  StartRouter(8);
  grpc::ClientContext context;
  auto reader = client_->Generate(&context, Request("fail", 10));
  v1::GenerateResponse message;
  int n = 0;
  while (reader->Read(&message)) ++n;
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(n, 2);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "boom");
}

TEST_F(RouterServiceTest, ClientCancellationCancelsTheVerifierCall) {
  StartRouter(8);
  grpc::ClientContext context;
  auto reader = client_->Generate(&context, Request("endless", 1));
  v1::GenerateResponse message;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&message));
  context.TryCancel();
  EXPECT_TRUE(verifier_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  while (reader->Read(&message)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(RouterServiceTest, ClientDeadlineReachesTheVerifier) {
  StartRouter(8);
  grpc::ClientContext context;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  context.set_deadline(deadline);
  auto reader = client_->Generate(&context, Request("hello", 3));
  v1::GenerateResponse message;
  while (reader->Read(&message)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  const auto seen = verifier_.last_deadline();
  EXPECT_LT(std::chrono::abs(seen - deadline), std::chrono::seconds(2));
}

TEST_F(RouterServiceTest, AdmitsAtMostMaxInFlight) {
  StartRouter(1);
  grpc::ClientContext holder_context;
  auto holder = client_->Generate(&holder_context, Request("endless", 1));
  v1::GenerateResponse message;
  ASSERT_TRUE(holder->Read(&message));
  EXPECT_EQ(service_->InFlightForTest(), 1);
  grpc::ClientContext context;
  auto refused = client_->Generate(&context, Request("hello", 3));
  while (refused->Read(&message)) {
  }
  const grpc::Status status = refused->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(), "router is at capacity (1 requests in flight); retry later");
  holder_context.TryCancel();
  while (holder->Read(&message)) {
  }
  holder->Finish();
}

TEST_F(RouterServiceTest, RefusesAModeNoVerifierServes) {
  StartRouter(8);
  grpc::ClientContext context;
  v1::GenerateRequest request = Request("hello", 3);
  request.set_mode("diffusion");
  auto reader = client_->Generate(&context, request);
  v1::GenerateResponse message;
  EXPECT_FALSE(reader->Read(&message));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "unknown mode 'diffusion' for model 'm'; it serves: auto, ar, spec");
}

TEST_F(RouterServiceTest, AVerifierThatIsGoneIsUnavailableAndMarkedDown) {
  StartRouter(8);
  verifier_server_->Shutdown(std::chrono::system_clock::now());
  verifier_server_.reset();
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    auto reader = client_->Generate(&context, Request("hello", 3));
    v1::GenerateResponse message;
    EXPECT_FALSE(reader->Read(&message));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE) << attempt;
  }
  EXPECT_FALSE(pool_->Healthy(0));
  EXPECT_EQ(pool_->InFlight(0), 0);
}

// A verifier whose engine reports itself stalled (its watchdog) gets no work until it moves.
TEST_F(RouterServiceTest, AStalledVerifierIsMarkedDownUntilItStepsAgain) {
  StartRouter(8);
  verifier_.stalled = true;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (pool_->Healthy(0) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(pool_->Healthy(0));
  {
    grpc::ClientContext context;
    auto reader = client_->Generate(&context, Request("hello", 3));
    v1::GenerateResponse message;
    EXPECT_FALSE(reader->Read(&message));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  verifier_.stalled = false;
  while (!pool_->Healthy(0) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(pool_->Healthy(0));
}

// Finishes one Generate call of `request` through `client` and returns its status.
grpc::Status Finish(v1::Generation::Stub& client, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  auto reader = client.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  return reader->Finish();
}

TEST_F(RouterServiceTest, AutoRequestsGoInThePolicysModeAndPinnedOnesInTheirs) {
  verifier_.report_costs = true;
  router::ModePolicy policy;
  ServiceMetrics metrics(MetricsRole::kRouter);
  StartRouter(8, &policy, &metrics);
  v1::GenerateRequest request = Request("hello", 2);
  ASSERT_TRUE(Finish(*client_, request).ok());
  EXPECT_EQ(verifier_.last_request().request().mode(), "spec");
  request.set_mode("ar");
  ASSERT_TRUE(Finish(*client_, request).ok());
  EXPECT_EQ(verifier_.last_request().request().mode(), "ar");
  const std::string text = metrics.TextFormat();
  EXPECT_NE(
      text.find(R"(tandem_mode_decisions_total{service="router",mode="spec",reason="policy"} 1)"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(R"(tandem_mode_decisions_total{service="router",mode="ar",reason="pinned"} 1)"),
      std::string::npos)
      << text;
  // The estimates: spec 3 tokens per 15 ms step, ar 1 per 11 ms.
  EXPECT_NE(text.find(R"(tandem_mode_goodput_tokens_per_second{service="router",mode="spec"} 200)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(tandem_mode_goodput_tokens_per_second{service="router",mode="ar"} 90.9)"),
            std::string::npos)
      << text;
}

TEST_F(RouterServiceTest, AutoRequestsPayEachModesStartOverTheirOwnLength) {
  verifier_.report_costs = true;
  verifier_.report_starts = true;
  router::ModePolicy policy;
  ServiceMetrics metrics(MetricsRole::kRouter);
  StartRouter(8, &policy, &metrics);
  // 2 tokens (the request's max_tokens, under the verifier's mean of 64): spec's 100 ms start
  // outweighs its faster steps; ar makes 2 tokens in 1 + 2 × 11 ms.
  ASSERT_TRUE(Finish(*client_, Request("hello", 2)).ok());
  EXPECT_EQ(verifier_.last_request().request().mode(), "ar");
  const std::string text = metrics.TextFormat();
  EXPECT_NE(text.find(R"(tandem_mode_goodput_tokens_per_second{service="router",mode="ar"} 86.9)"),
            std::string::npos)
      << text;
}

TEST_F(RouterServiceTest, AutoRequestsWithoutMeasurementsGoInTheVerifiersDefault) {
  router::ModePolicy policy;
  ServiceMetrics metrics(MetricsRole::kRouter);
  StartRouter(8, &policy, &metrics);
  ASSERT_TRUE(Finish(*client_, Request("hello", 2)).ok());
  EXPECT_EQ(verifier_.last_request().request().mode(), "ar");
  EXPECT_NE(metrics.TextFormat().find(
                R"(tandem_mode_decisions_total{service="router",mode="ar",reason="no_data"} 1)"),
            std::string::npos)
      << metrics.TextFormat();
}

TEST_F(RouterServiceTest, WithoutAPolicyAutoRequestsStayAuto) {
  verifier_.report_costs = true;
  ServiceMetrics metrics(MetricsRole::kRouter);
  StartRouter(8, nullptr, &metrics);
  ASSERT_TRUE(Finish(*client_, Request("hello", 2)).ok());
  EXPECT_EQ(verifier_.last_request().request().mode(), "");
  EXPECT_NE(metrics.TextFormat().find(
                R"(tandem_mode_decisions_total{service="router",mode="auto",reason="default"} 1)"),
            std::string::npos)
      << metrics.TextFormat();
}

}  // namespace
}  // namespace tandem
