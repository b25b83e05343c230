// Migration in the router's relay, against in-process scripted verifiers whose streams break on
// cue: the client's stream continues on the next verifier from the committed tokens with no gap
// and no duplicate, the seed carries over, moves are bounded, other errors pass through.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/common/server.h"
#include "services/router/router_service.h"

namespace tandem {
namespace {

// Streams token i with text "t<i> " for i from the number of committed tokens to max_tokens,
// one per message; after `fail_after` messages of one stream it ends with `fail_code` instead.
class BreakingVerifier final : public v1::Verifier::CallbackService {
 public:
  BreakingVerifier(int fail_after, grpc::StatusCode fail_code)
      : fail_after_(fail_after), fail_code_(fail_code) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* /*context*/, const v1::VerifyRequest* request) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
    }
    return new Stream(*request, fail_after_, fail_code_);
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::WorkerInfoRequest*, v1::WorkerInfo*) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::WorkerLoadRequest*, v1::WorkerLoad*) override {
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::vector<v1::VerifyRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  class Stream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
   public:
    Stream(const v1::VerifyRequest& request, int fail_after, grpc::StatusCode fail_code)
        : next_(request.committed_token_ids_size()),
          end_(request.request().max_tokens()),
          fail_after_(fail_after),
          fail_code_(fail_code) {
      Next();
    }
    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
        return;
      }
      Next();
    }
    void OnDone() override { delete this; }

   private:
    void Next() {
      if (fail_after_ >= 0 && sent_ == fail_after_) {
        Finish(grpc::Status(fail_code_, "scripted failure"));
        return;
      }
      if (next_ == end_) {
        Finish(grpc::Status::OK);
        return;
      }
      response_.Clear();
      response_.add_token_ids(next_);
      response_.set_text("t" + std::to_string(next_) + " ");
      ++next_;
      ++sent_;
      if (next_ == end_) {
        response_.set_finish_reason("length");
        response_.mutable_usage()->set_completion_tokens(sent_);
      }
      StartWrite(&response_);
    }
    int next_;
    const int end_;
    const int fail_after_;
    const grpc::StatusCode fail_code_;
    int sent_ = 0;
    v1::GenerateResponse response_;
  };

  const int fail_after_;
  const grpc::StatusCode fail_code_;
  absl::Mutex mu_;
  std::vector<v1::VerifyRequest> requests_ ABSL_GUARDED_BY(mu_);
};

struct Collected {
  grpc::Status status;
  std::vector<int> tokens;
  std::string text;
  v1::GenerateResponse last;
};

class RelayMigrationTest : public ::testing::Test {
 protected:
  // Verifier i of the pool breaks after fail_after[i] messages with `code` (-1: never).
  void Start(std::vector<int> fail_after, grpc::StatusCode code, int max_migrations) {
    std::vector<std::string> addresses;
    for (int n : fail_after) {
      verifiers_.push_back(std::make_unique<BreakingVerifier>(n, code));
      auto server = StartServer(ServerFlags{}, {verifiers_.back().get()});
      ASSERT_TRUE(server.ok()) << server.status();
      addresses.push_back(server->address);
      servers_.push_back(std::move(server->server));
      stubs_.push_back(v1::Verifier::NewStub(
          grpc::CreateChannel(server->address, grpc::InsecureChannelCredentials())));
    }
    pool_ = std::make_unique<router::VerifierPool>(addresses);
    std::vector<v1::Verifier::Stub*> stubs;
    for (size_t i = 0; i < addresses.size(); ++i) {
      pool_->SetInfo(i, router::VerifierInfo{.model = "m", .modes = {"ar"}, .max_context = 512});
      pool_->SetHealthy(i, true);
      stubs.push_back(stubs_[i].get());
    }
    service_ = std::make_unique<RouterService>(pool_.get(), stubs,
                                               RouterOptions{.max_migrations = max_migrations});
    auto router = StartServer(ServerFlags{}, {service_.get()});
    ASSERT_TRUE(router.ok()) << router.status();
    router_server_ = std::move(router->server);
    client_ = v1::Generation::NewStub(
        grpc::CreateChannel(router->address, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (router_server_) router_server_->Shutdown(std::chrono::system_clock::now());
    for (auto& server : servers_) server->Shutdown(std::chrono::system_clock::now());
  }

  Collected Run(int max_tokens, std::optional<uint64_t> seed = std::nullopt) {
    v1::GenerateRequest request;
    request.set_prompt("p");
    request.set_max_tokens(max_tokens);
    request.mutable_sampling()->set_temperature(0.8f);
    if (seed) request.mutable_sampling()->set_seed(*seed);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = client_->Generate(&context, request);
    Collected out;
    v1::GenerateResponse message;
    while (reader->Read(&message)) {
      out.tokens.insert(out.tokens.end(), message.token_ids().begin(), message.token_ids().end());
      out.text += message.text();
      out.last = message;
    }
    out.status = reader->Finish();
    return out;
  }

  static std::vector<int> Iota(int n) {
    std::vector<int> out;
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  static std::string Text(int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += "t" + std::to_string(i) + " ";
    return out;
  }

  std::vector<std::unique_ptr<BreakingVerifier>> verifiers_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
  std::vector<std::unique_ptr<v1::Verifier::Stub>> stubs_;
  std::unique_ptr<router::VerifierPool> pool_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<grpc::Server> router_server_;
  std::unique_ptr<v1::Generation::Stub> client_;
};

TEST_F(RelayMigrationTest, BrokenStreamContinuesOnAnotherVerifierWithoutGapOrDuplicate) {
  Start({3, -1}, grpc::StatusCode::UNAVAILABLE, 3);
  const Collected result = Run(10);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens, Iota(10));
  EXPECT_EQ(result.text, Text(10));
  EXPECT_EQ(result.last.finish_reason(), "length");
  EXPECT_EQ(result.last.usage().completion_tokens(), 10);  // 3 before the move, 7 after
  EXPECT_EQ(service_->migrations(), 1u);
  const std::vector<v1::VerifyRequest> first = verifiers_[0]->requests();
  const std::vector<v1::VerifyRequest> second = verifiers_[1]->requests();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(first[0].committed_token_ids_size(), 0);
  EXPECT_EQ(std::vector<int>(second[0].committed_token_ids().begin(),
                             second[0].committed_token_ids().end()),
            Iota(3));
  // The client gave no seed: the router chose one, and the second verifier got the same.
  ASSERT_TRUE(first[0].request().sampling().has_seed());
  EXPECT_EQ(second[0].request().sampling().seed(), first[0].request().sampling().seed());
  EXPECT_FALSE(pool_->Healthy(0));  // UNAVAILABLE: down until a poll finds it
  EXPECT_EQ(pool_->InFlight(0), 0);
  EXPECT_EQ(pool_->InFlight(1), 0);
}

TEST_F(RelayMigrationTest, ClientSeedIsKept) {
  Start({2, -1}, grpc::StatusCode::INTERNAL, 3);
  const Collected result = Run(5, 77);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens, Iota(5));
  EXPECT_EQ(verifiers_[1]->requests().at(0).request().sampling().seed(), 77u);
}

TEST_F(RelayMigrationTest, MovesAreBoundedThenTheErrorReachesTheClient) {
  Start({1, 1, 1}, grpc::StatusCode::UNAVAILABLE, 1);
  const Collected result = Run(10);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(result.tokens, Iota(2));  // one token from each of two verifiers, none repeated
  EXPECT_EQ(service_->migrations(), 1u);
  EXPECT_EQ(verifiers_[2]->requests().size() + verifiers_[1]->requests().size(), 1u);
}

TEST_F(RelayMigrationTest, NoHealthyVerifierLeftEndsWithTheError) {
  Start({2}, grpc::StatusCode::UNAVAILABLE, 3);
  const Collected result = Run(10);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(result.tokens, Iota(2));
  EXPECT_EQ(service_->migrations(), 0u);
}

TEST_F(RelayMigrationTest, RequestErrorsAreNotMigrated) {
  Start({2, -1}, grpc::StatusCode::INVALID_ARGUMENT, 3);
  const Collected result = Run(10);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(result.tokens, Iota(2));
  EXPECT_EQ(service_->migrations(), 0u);
  EXPECT_TRUE(verifiers_[1]->requests().empty());
  EXPECT_TRUE(pool_->Healthy(0));
}

TEST_F(RelayMigrationTest, DrainingRefusalBeforeAnyTokenMoves) {
  Start({0, -1}, grpc::StatusCode::FAILED_PRECONDITION, 3);
  const Collected result = Run(4);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.tokens, Iota(4));
  EXPECT_EQ(verifiers_[1]->requests().at(0).committed_token_ids_size(), 0);
}

}  // namespace
}  // namespace tandem
