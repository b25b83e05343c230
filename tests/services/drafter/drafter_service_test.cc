// DrafterService and GrpcDraftChannel end to end over loopback gRPC (port chosen by the OS).
#include "services/drafter/drafter_service.h"

#include <chrono>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/server.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tandem/v1/drafter.grpc.pb.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/drafter.h"

namespace tandem {
namespace {

using ::tandem::testing::ChainCollector;
using ::tandem::testing::TestPrompts;
using ::tandem::testing::TinyArch;
using ::tandem::testing::TinyModel;

std::vector<int32_t> Greedy(Transformer& model, const std::vector<int32_t>& tokens, int n) {
  InProcessArDrafter drafter(&model, static_cast<int>(tokens.size()) + n + 16);
  absl::StatusOr<std::vector<int32_t>> drafts = drafter.Draft(tokens, n);
  EXPECT_TRUE(drafts.ok()) << drafts.status();
  return drafts.ok() ? *drafts : std::vector<int32_t>();
}

class DrafterServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyModel(TinyArch::kQwen2, 7, 128);
    auto engine = DraftEngine::Create(model_.get(), {.kv_tokens = 4096, .max_sessions = 16});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    service_ = std::make_unique<DrafterService>(
        engine_.get(),
        DrafterServiceOptions{
            .model_id = "tiny", .worker_id = "drafter-test", .grammars = &grammars_});
    auto server = StartServer({.listen = "127.0.0.1:0"}, {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = MakeChannel(server_.address, {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    channel_ = std::move(*channel);
  }

  void TearDown() override { StopServer(); }

  void StopServer() {
    if (server_.server) {
      server_.server->Shutdown(std::chrono::system_clock::now());
      server_.server->Wait();
      server_.server.reset();
    }
  }

  GrammarCompiler grammars_{testing::TinyByteVocab(), 64, {63}};
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<DraftEngine> engine_;
  std::unique_ptr<DrafterService> service_;
  RunningServer server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(DrafterServiceTest, ChainsArriveAndAreTheGreedyContinuation) {
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(channel_, server_.address, chains.Callback());
  const int gamma = 3;
  const auto prompts = TestPrompts(64, 4, 17);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(drafter->Open(10 + i, prompts[i], gamma).ok());
  }
  std::vector<std::vector<int32_t>> now = prompts;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int len = static_cast<int>(now[i].size());
      auto chain = chains.WaitCovered(10 + i, len, 2 * gamma + 1);
      ASSERT_TRUE(chain.has_value()) << "session " << i << " round " << round;
      ASSERT_EQ(*chain, Greedy(*model_, now[i], 2 * gamma + 1)) << "session " << i;
      // Round 0 accepts everything and a bonus; later rounds reject the second draft.
      std::vector<int32_t> append(chain->begin(), chain->begin() + gamma + 1);
      if (round > 0) append = {(*chain)[0], ((*chain)[1] + 1) % 64};
      ASSERT_TRUE(drafter->Advance(10 + i, len, append, 0).ok());
      now[i].insert(now[i].end(), append.begin(), append.end());
    }
  }
  EXPECT_TRUE(drafter->healthy());
  for (size_t i = 0; i < prompts.size(); ++i) drafter->Close(10 + i);
}

// A verifier's structured output reaches the drafter with the open, which drafts under it; a
// grammar it cannot compile ends just that session.
TEST_F(DrafterServiceTest, SessionsDraftUnderTheirGrammar) {
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(channel_, server_.address, chains.Callback());
  const std::vector<int32_t> prompt = TestPrompts(63, 1, 23)[0];
  const int len = static_cast<int>(prompt.size());
  const DraftGrammar object{
      .spec = {.kind = GrammarSpec::Kind::kJsonObject}, .prompt_len = len, .stop_tokens = {63}};
  ASSERT_TRUE(drafter->Open(1, prompt, 3, HiddenRows{}, 0, object).ok());
  DraftGrammar bad = object;
  bad.spec = {.kind = GrammarSpec::Kind::kJsonSchema, .text = R"({"type": 5})"};
  ASSERT_TRUE(drafter->Open(2, prompt, 3, HiddenRows{}, 0, bad).ok());
  auto chain = chains.WaitCovered(1, len, 7);
  ASSERT_TRUE(chain.has_value()) << chains.Get(1).error;
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar = grammars_.Compile(object.spec);
  ASSERT_TRUE(grammar.ok());
  GrammarCursor cursor(*grammar, {63});
  EXPECT_TRUE(cursor.MoveTo({}, *chain));
  EXPECT_FALSE(chains.WaitCovered(2, len, 1).has_value() && chains.Get(2).error.ok());
  // The channel reports a session's error chain as UNAVAILABLE with the drafter's message.
  EXPECT_THAT(std::string(chains.Get(2).error.message()),
              ::testing::HasSubstr("JSON schema refused"));
}

TEST_F(DrafterServiceTest, ProtocolErrorsAnswerTheSessionAndTheStreamGoesOn) {
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(channel_, server_.address, chains.Callback());
  ASSERT_TRUE(drafter->Open(1, std::vector<int32_t>{1, 2, 3}, 2).ok());
  ASSERT_TRUE(drafter->Open(2, std::vector<int32_t>{1, 99}, 2).ok());  // outside the vocabulary
  ASSERT_TRUE(drafter->Open(3, std::vector<int32_t>{}, 2).ok());
  ASSERT_TRUE(drafter->Open(4, std::vector<int32_t>{5, 6}, 2).ok());
  ASSERT_TRUE(drafter->Advance(4, 7, std::vector<int32_t>{1}, 0).ok());  // offset mismatch
  const absl::Status vocab = chains.WaitError(2);
  EXPECT_FALSE(vocab.ok());
  EXPECT_NE(vocab.message().find("vocabulary"), std::string::npos) << vocab;
  EXPECT_FALSE(chains.WaitError(3).ok());
  const absl::Status offset = chains.WaitError(4);
  EXPECT_NE(offset.message().find("says it has 7 tokens"), std::string::npos) << offset;
  // Session 1 is untouched and keeps drafting.
  auto chain = chains.WaitCovered(1, 3, 5);
  ASSERT_TRUE(chain.has_value());
  EXPECT_EQ(*chain, Greedy(*model_, {1, 2, 3}, 5));
  ASSERT_TRUE(drafter->Advance(1, 3, std::vector<int32_t>{4}, 0).ok());
  auto next = chains.WaitCovered(1, 4, 5);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, Greedy(*model_, {1, 2, 3, 4}, 5));
  EXPECT_TRUE(drafter->healthy());
  EXPECT_TRUE(chains.Get(1).error.ok());
}

// Messages a GrpcDraftChannel never sends, over a raw stream.
TEST_F(DrafterServiceTest, RawStreamErrorsForUnknownSessionsAndEmptyMessages) {
  auto stub = tandem::v1::Drafter::NewStub(channel_);
  grpc::ClientContext context;
  auto stream = stub->Draft(&context);
  tandem::v1::DraftClientMessage m;
  m.set_session(5);
  m.mutable_advance()->set_offset(3);
  m.mutable_advance()->add_append(1);
  ASSERT_TRUE(stream->Write(m));
  tandem::v1::DraftChain reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.session(), 5u);
  EXPECT_NE(reply.error().find("not open"), std::string::npos) << reply.error();

  tandem::v1::DraftClientMessage empty;
  empty.set_session(6);
  ASSERT_TRUE(stream->Write(empty));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.session(), 6u);
  EXPECT_FALSE(reply.error().empty());

  tandem::v1::DraftClientMessage open;
  open.set_session(7);
  open.mutable_open()->add_tokens(3);
  open.mutable_open()->set_gamma(2);
  ASSERT_TRUE(stream->Write(open));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.session(), 7u);
  EXPECT_TRUE(reply.error().empty());
  EXPECT_EQ(reply.from(), 1);
  EXPECT_GE(reply.tokens_size(), 2);
  ASSERT_TRUE(stream->WritesDone());
  // The half-close ends the session; the stream finishes cleanly.
  while (stream->Read(&reply)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(DrafterServiceTest, InfoAndLoad) {
  auto stub = tandem::v1::Drafter::NewStub(channel_);
  grpc::ClientContext info_context;
  tandem::v1::WorkerInfo info;
  ASSERT_TRUE(stub->GetInfo(&info_context, {}, &info).ok());
  EXPECT_EQ(info.role(), "drafter");
  EXPECT_EQ(info.model(), "tiny");
  ASSERT_EQ(info.modes_size(), 1);
  EXPECT_EQ(info.modes(0), "ar");
  EXPECT_EQ(info.max_context(), 128);
  EXPECT_EQ(info.vocab_size(), 64);
  EXPECT_EQ(info.worker_id(), "drafter-test");
  EXPECT_FALSE(info.version().empty());

  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(channel_, server_.address, chains.Callback());
  ASSERT_TRUE(drafter->Open(1, std::vector<int32_t>{1, 2, 3}, 2).ok());
  ASSERT_TRUE(chains.WaitCovered(1, 3, 5).has_value());
  grpc::ClientContext load_context;
  tandem::v1::WorkerLoad load;
  ASSERT_TRUE(stub->GetLoad(&load_context, {}, &load).ok());
  EXPECT_EQ(load.worker_id(), "drafter-test");
  EXPECT_EQ(load.sessions(), 1);
  EXPECT_GE(load.steps(), 1);
  EXPECT_GT(load.kv_usage_ratio(), 0);
  EXPECT_FALSE(load.draining());
}

TEST_F(DrafterServiceTest, ClosingTheChannelClosesItsSessions) {
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(channel_, server_.address, chains.Callback());
  ASSERT_TRUE(drafter->Open(1, std::vector<int32_t>{1, 2, 3}, 2).ok());
  ASSERT_TRUE(drafter->Open(2, std::vector<int32_t>{4, 5, 6}, 2).ok());
  ASSERT_TRUE(chains.WaitCovered(2, 3, 5).has_value());
  drafter.reset();
  // A second stream's chain arrives after the engine handled the first stream's removal only
  // if the removal was posted first; poll the load through fresh sessions instead of sleeping.
  ChainCollector probe_chains;
  auto probe = GrpcDraftChannel::Create(channel_, server_.address, probe_chains.Callback());
  for (uint64_t s = 1;; ++s) {
    ASSERT_TRUE(probe->Open(s, std::vector<int32_t>{1}, 1).ok());
    ASSERT_TRUE(probe_chains.WaitCovered(s, 1, 1).has_value());
    probe->Close(s);
    if (engine_->Stats().sessions <= 1) break;
    ASSERT_LT(s, 10000u) << "the closed channel's sessions stay open";
  }
  EXPECT_EQ(chains.Get(1).errors, 0);  // closing on purpose reports nothing
}

TEST_F(DrafterServiceTest, ServerShutdownMakesTheChannelUnhealthyWithErrors) {
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(channel_, server_.address, chains.Callback());
  ASSERT_TRUE(drafter->Open(1, std::vector<int32_t>{1, 2, 3}, 2).ok());
  ASSERT_TRUE(drafter->Open(2, std::vector<int32_t>{4, 5}, 2).ok());
  ASSERT_TRUE(chains.WaitCovered(1, 3, 5).has_value());
  ASSERT_TRUE(chains.WaitCovered(2, 2, 5).has_value());
  StopServer();
  const absl::Status e1 = chains.WaitError(1);
  const absl::Status e2 = chains.WaitError(2);
  EXPECT_EQ(e1.code(), absl::StatusCode::kUnavailable) << e1;
  EXPECT_EQ(e2.code(), absl::StatusCode::kUnavailable) << e2;
  EXPECT_FALSE(drafter->healthy());
  EXPECT_FALSE(drafter->Open(3, std::vector<int32_t>{1}, 1).ok());
  EXPECT_FALSE(drafter->Advance(1, 3, std::vector<int32_t>{1}, 0).ok());
  EXPECT_EQ(chains.Get(1).errors, 1);
}

TEST(GrpcDraftChannel, UnreachableDrafterReportsErrors) {
  // A port nothing listens on: bind one, then let it go.
  auto engine_model = TinyModel(TinyArch::kQwen2, 1, 64);
  std::string address;
  {
    auto engine = DraftEngine::Create(engine_model.get(), {.kv_tokens = 64});
    ASSERT_TRUE(engine.ok());
    DrafterService service(engine->get(), {});
    auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
    ASSERT_TRUE(server.ok()) << server.status();
    address = server->address;
    server->server->Shutdown(std::chrono::system_clock::now());
    server->server->Wait();
  }
  ChainCollector chains;
  auto factory = MakeGrpcDraftChannelFactory({});
  auto drafter = factory(address, chains.Callback());
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  // Open succeeds and the failure follows as an error chain, or the failure was already seen
  // and Open says the channel is broken.
  if ((*drafter)->Open(1, std::vector<int32_t>{1, 2}, 2).ok()) {
    EXPECT_EQ(chains.WaitError(1).code(), absl::StatusCode::kUnavailable);
  }
  EXPECT_FALSE((*drafter)->healthy());
}

}  // namespace
}  // namespace tandem
