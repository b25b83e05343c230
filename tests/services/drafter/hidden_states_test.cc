// Target hidden states in the draft stream over loopback gRPC: the drafter's GetInfo tells a
// GrpcDraftChannel which layers it wants, the rows' bytes reach the server as sent, and the
// drafter service checks their shape and order per session (errors end only that session);
// and end to end, a verifier engine sends a drafter asking for layers the rows of every final
// token while its outputs stay exact.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tandem/v1/drafter.grpc.pb.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/drafter.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

namespace v1 = ::tandem::v1;
using ::tandem::testing::ChainCollector;
using ::tandem::testing::TinyArch;
using ::tandem::testing::TinyModel;

// Rows [offset, offset + tokens) of `layers` layers whose values are distinct and exactly
// representable in bf16.
HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int l = 0; l < layers; ++l) {
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < hidden_size; ++h) {
        rows.bf16.push_back(FloatToBf16(static_cast<float>(l * 64 + (offset + t) * 4 + h) / 8));
      }
    }
  }
  return rows;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  auto bits = [](uint32_t b) { return std::bit_cast<float>(b); };
  EXPECT_EQ(FloatToBf16(bits(0x3f808000)), 0x3f80);  // halfway, even stays
  EXPECT_EQ(FloatToBf16(bits(0x3f818000)), 0x3f82);  // halfway, odd rounds up
  EXPECT_EQ(FloatToBf16(bits(0x3f808001)), 0x3f81);  // above halfway
  EXPECT_EQ(FloatToBf16(bits(0x3f807fff)), 0x3f80);  // below halfway
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(bits(0x7f800001)))));  // not rounded to inf
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(3.140625f)), 3.140625f);
}

// A Drafter that records every message it reads and advertises layer 2.
class CapturingDrafter final : public v1::Drafter::CallbackService {
 public:
  grpc::ServerBidiReactor<v1::DraftClientMessage, v1::DraftChain>* Draft(
      grpc::CallbackServerContext* /*context*/) override {
    return new Reader(this);
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::WorkerInfoRequest* /*request*/,
                                    v1::WorkerInfo* info) override {
    info->set_role("drafter");
    info->add_hidden_layers(2);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::vector<v1::DraftClientMessage> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return messages_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return messages_;
  }

 private:
  class Reader final : public grpc::ServerBidiReactor<v1::DraftClientMessage, v1::DraftChain> {
   public:
    explicit Reader(CapturingDrafter* owner) : owner_(owner) { StartRead(&in_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      {
        absl::MutexLock lock(&owner_->mu_);
        owner_->messages_.push_back(in_);
      }
      StartRead(&in_);
    }
    void OnDone() override { delete this; }

   private:
    CapturingDrafter* owner_;
    v1::DraftClientMessage in_;
  };

  absl::Mutex mu_;
  std::vector<v1::DraftClientMessage> messages_ ABSL_GUARDED_BY(mu_);
};

void ExpectWire(const v1::HiddenStates& wire, const HiddenRows& rows) {
  EXPECT_EQ(wire.num_layers(), rows.layers);
  EXPECT_EQ(wire.num_tokens(), rows.tokens);
  EXPECT_EQ(wire.hidden_size(), rows.hidden_size);
  EXPECT_EQ(wire.offset(), rows.offset);
  ASSERT_EQ(wire.bf16().size(), rows.bf16.size() * 2);
  for (size_t i = 0; i < rows.bf16.size(); ++i) {
    const auto lo = static_cast<uint8_t>(wire.bf16()[2 * i]);
    const auto hi = static_cast<uint8_t>(wire.bf16()[2 * i + 1]);
    ASSERT_EQ(static_cast<uint16_t>(lo | (hi << 8)), rows.bf16[i]) << "value " << i;
  }
}

TEST(GrpcDraftChannelHidden, LearnsTheLayersAndSendsTheRowsAsLittleEndianBf16) {
  CapturingDrafter service;
  auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel(server->address, {});
  ASSERT_TRUE(channel.ok()) << channel.status();
  ChainCollector chains;
  auto drafter = GrpcDraftChannel::Create(*channel, server->address, chains.Callback());
  ASSERT_TRUE(drafter->WaitForInfo(absl::Seconds(30)));
  EXPECT_EQ(drafter->hidden_layers(), std::vector<int32_t>{2});

  const HiddenRows first = Rows(1, 0, 2, 3);
  const HiddenRows second = Rows(1, 2, 3, 3);
  ASSERT_TRUE(drafter->Open(1, std::vector<int32_t>{7, 8, 9}, 2, first).ok());
  ASSERT_TRUE(drafter->Advance(1, 3, std::vector<int32_t>{10, 11}, 0, second).ok());
  ASSERT_TRUE(drafter->Advance(1, 5, std::vector<int32_t>{12}, 0).ok());
  const std::vector<v1::DraftClientMessage> got = service.WaitFor(3);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_TRUE(got[0].has_open());
  ASSERT_TRUE(got[0].open().has_hidden());
  ExpectWire(got[0].open().hidden(), first);
  ASSERT_TRUE(got[1].has_advance());
  ASSERT_TRUE(got[1].advance().has_hidden());
  ExpectWire(got[1].advance().hidden(), second);
  ASSERT_TRUE(got[2].has_advance());
  EXPECT_FALSE(got[2].advance().has_hidden());  // nothing extra without rows

  drafter.reset();
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server->Wait();
}

std::vector<int32_t> Greedy(Transformer& model, const std::vector<int32_t>& tokens, int n) {
  InProcessArDrafter drafter(&model, static_cast<int>(tokens.size()) + n + 16);
  absl::StatusOr<std::vector<int32_t>> drafts = drafter.Draft(tokens, n);
  EXPECT_TRUE(drafts.ok()) << drafts.status();
  return drafts.ok() ? *drafts : std::vector<int32_t>();
}

class HiddenDrafterTest : public ::testing::Test {
 protected:
  void Start(std::vector<int32_t> layers) {
    model_ = TinyModel(TinyArch::kQwen2, 7, 128);
    auto engine = DraftEngine::Create(
        model_.get(), {.kv_tokens = 4096, .max_sessions = 16, .hidden_layers = std::move(layers)});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    service_ = std::make_unique<DrafterService>(
        engine_.get(), DrafterServiceOptions{.model_id = "tiny", .worker_id = "drafter-test"});
    auto server = StartServer({.listen = "127.0.0.1:0"}, {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = MakeChannel(server_.address, {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    drafter_ = GrpcDraftChannel::Create(*channel, server_.address, chains_.Callback());
    ASSERT_TRUE(drafter_->WaitForInfo(absl::Seconds(30)));
  }

  void TearDown() override {
    drafter_.reset();
    if (server_.server) {
      server_.server->Shutdown(std::chrono::system_clock::now());
      server_.server->Wait();
    }
  }

  // Waits for the engine to count `rows` hidden rows; false after 30 s.
  bool WaitForRows(int64_t rows) {
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (engine_->Stats().hidden_rows != rows) {
      if (absl::Now() > end) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  std::unique_ptr<Transformer> model_;
  std::unique_ptr<DraftEngine> engine_;
  std::unique_ptr<DrafterService> service_;
  RunningServer server_;
  ChainCollector chains_;
  std::unique_ptr<GrpcDraftChannel> drafter_;
};

TEST_F(HiddenDrafterTest, RowsAreCountedAndShapeErrorsEndOnlyTheirSession) {
  Start({1, 3});
  EXPECT_EQ(drafter_->hidden_layers(), (std::vector<int32_t>{1, 3}));
  const int h = 16;
  // Session 1: the prompt's rows come after the open (prefill), one without tokens, then
  // rows lagging the tokens by one.
  ASSERT_TRUE(drafter_->Open(1, std::vector<int32_t>{1, 2, 3, 4}, 2).ok());
  ASSERT_TRUE(drafter_->Advance(1, 4, std::vector<int32_t>{}, 0, Rows(2, 0, 3, h)).ok());
  ASSERT_TRUE(drafter_->Advance(1, 4, std::vector<int32_t>{5, 6}, 0, Rows(2, 3, 2, h)).ok());
  // Errors, each in its own session.
  ASSERT_TRUE(drafter_->Open(2, std::vector<int32_t>{1, 2}, 2, Rows(1, 0, 1, h)).ok());
  ASSERT_TRUE(drafter_->Open(3, std::vector<int32_t>{1, 2}, 2, Rows(2, 0, 1, h)).ok());
  ASSERT_TRUE(drafter_->Advance(3, 2, std::vector<int32_t>{3}, 0, Rows(2, 2, 1, h)).ok());
  HiddenRows short_rows = Rows(2, 0, 1, h);
  short_rows.bf16.pop_back();
  ASSERT_TRUE(drafter_->Open(4, std::vector<int32_t>{1, 2}, 2, short_rows).ok());
  ASSERT_TRUE(drafter_->Open(5, std::vector<int32_t>{1, 2}, 2, Rows(2, 0, 3, h)).ok());
  ASSERT_TRUE(drafter_->Open(6, std::vector<int32_t>{1, 2}, 2, Rows(2, 0, 1, h)).ok());
  ASSERT_TRUE(drafter_->Advance(6, 2, std::vector<int32_t>{3}, 0, Rows(2, 1, 1, h + 1)).ok());

  const absl::Status layers = chains_.WaitError(2);
  EXPECT_NE(layers.message().find("asks for 2 layers"), std::string::npos) << layers;
  const absl::Status gap = chains_.WaitError(3);
  EXPECT_NE(gap.message().find("without gaps or repeats"), std::string::npos) << gap;
  const absl::Status size = chains_.WaitError(4);
  EXPECT_NE(size.message().find("which need 32"), std::string::npos) << size;
  const absl::Status beyond = chains_.WaitError(5);
  EXPECT_NE(beyond.message().find("has only 2 tokens"), std::string::npos) << beyond;
  const absl::Status width = chains_.WaitError(6);
  EXPECT_NE(width.message().find("changed its hidden size"), std::string::npos) << width;

  // Session 1 is intact: its rows were counted (with those of sessions 3 and 6 before their
  // errors) and it drafts the greedy continuation of all its tokens.
  auto chain = chains_.WaitCovered(1, 6, 5);
  ASSERT_TRUE(chain.has_value());
  EXPECT_EQ(*chain, Greedy(*model_, {1, 2, 3, 4, 5, 6}, 5));
  EXPECT_TRUE(chains_.Get(1).error.ok());
  EXPECT_TRUE(WaitForRows(5 + 1 + 1));
  EXPECT_TRUE(drafter_->healthy());
}

TEST_F(HiddenDrafterTest, RowsNobodyAskedForEndTheSession) {
  Start({});
  EXPECT_TRUE(drafter_->hidden_layers().empty());
  ASSERT_TRUE(drafter_->Open(1, std::vector<int32_t>{1, 2}, 2, Rows(2, 0, 1, 8)).ok());
  const absl::Status error = chains_.WaitError(1);
  EXPECT_NE(error.message().find("asks for none"), std::string::npos) << error;
}

// Odd byte counts never reach the engine as values.
TEST_F(HiddenDrafterTest, RawStreamWithHalfAValueIsRejected) {
  Start({1});
  auto stub = v1::Drafter::NewStub(*MakeChannel(server_.address, {}));
  grpc::ClientContext context;
  auto stream = stub->Draft(&context);
  v1::DraftClientMessage m;
  m.set_session(9);
  m.mutable_open()->add_tokens(3);
  m.mutable_open()->set_gamma(2);
  v1::HiddenStates* hidden = m.mutable_open()->mutable_hidden();
  hidden->set_num_layers(1);
  hidden->set_num_tokens(1);
  hidden->set_hidden_size(1);
  hidden->set_bf16(std::string(3, '\0'));
  ASSERT_TRUE(stream->Write(m));
  v1::DraftChain reply;
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_EQ(reply.session(), 9u);
  EXPECT_NE(reply.error().find("whole bf16"), std::string::npos) << reply.error();
  ASSERT_TRUE(stream->WritesDone());
  while (stream->Read(&reply)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

// Collects one request's tokens until its last event.
class TokenSink : public SequenceSink {
 public:
  void OnEvent(SequenceEvent event) override {
    absl::MutexLock lock(&mu_);
    tokens_.insert(tokens_.end(), event.tokens.begin(), event.tokens.end());
    if (!event.error.ok()) error_ = event.error;
    if (event.finish != FinishReason::kNone || !event.error.ok()) done_ = true;
  }
  bool Wait() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(120));
  }
  std::vector<int32_t> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(HiddenStatesEndToEnd, VerifierSendsTheRowsOfEveryFinalTokenToATandemDrafter) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no bundled model";
  absl::StatusOr<LoadedModel> target = LoadModelDir(dir);
  ASSERT_TRUE(target.ok()) << target.status();
  absl::StatusOr<std::unique_ptr<Transformer>> draft_model = Transformer::Load(dir);
  ASSERT_TRUE(draft_model.ok()) << draft_model.status();
  auto draft_engine =
      DraftEngine::Create(draft_model->get(), {.kv_tokens = 4096, .hidden_layers = {1, 3}});
  ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
  DrafterService service(draft_engine->get(), {.model_id = "tandem-target"});
  auto server = StartServer({.listen = "127.0.0.1:0"}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();

  std::ifstream in(dir + "/fixtures/greedy.json");
  const nlohmann::json greedy = nlohmann::json::parse(in);
  std::vector<std::vector<int32_t>> prompts;
  for (const nlohmann::json& c : greedy["cases"]) {
    prompts.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
    if (prompts.size() == 3) break;
  }
  ASSERT_EQ(prompts.size(), 3u);
  {
    EngineOptions options;
    options.default_drafter = server->address;
    options.draft_timeout = absl::Seconds(5);
    options.prefill_chunk = 16;  // the prompt's rows come in several runs
    auto engine = Engine::Create(&*target, options, MakeGrpcDraftChannelFactory({}));
    ASSERT_TRUE(engine.ok()) << engine.status();
    auto run = [&](const std::vector<int32_t>& prompt, const std::string& mode) {
      SequenceRequest r;
      r.prompt_ids = prompt;
      r.mode = mode;
      r.mode_options.spec_gamma = 3;
      r.max_tokens = 20;
      auto sink = std::make_shared<TokenSink>();
      absl::StatusOr<uint64_t> id = (*engine)->Submit(std::move(r), sink);
      EXPECT_TRUE(id.ok()) << id.status();
      EXPECT_TRUE(sink->Wait());
      EXPECT_TRUE(sink->error().ok()) << sink->error();
      return sink->tokens();
    };
    // The first requests make the channel, whose GetInfo answer (the drafter wants rows) may
    // come after their sessions opened, later still on a loaded machine (a test run with the
    // suite beside it once saw a whole sequence go without rows); sessions opened once rows
    // have arrived get rows for sure.
    const absl::Time rows_by = absl::Now() + absl::Seconds(60);
    do {
      EXPECT_EQ(run(prompts[0], "spec"), run(prompts[0], "ar"));
    } while ((*draft_engine)->Stats().hidden_rows == 0 && absl::Now() < rows_by);
    ASSERT_GT((*draft_engine)->Stats().hidden_rows, 0) << "no rows reached the drafter in 60 s";
    // The last rows of those runs may still be on their way (a loaded machine): the count must
    // have settled before it is the baseline.
    int64_t before = (*draft_engine)->Stats().hidden_rows;
    for (int settled = 0; settled < 20;) {
      absl::SleepFor(absl::Milliseconds(10));
      const int64_t now = (*draft_engine)->Stats().hidden_rows;
      settled = now == before ? settled + 1 : 0;
      before = now;
    }
    int64_t expected = 0;
    for (int p = 1; p < 3; ++p) {
      const std::vector<int32_t> spec = run(prompts[p], "spec");
      EXPECT_EQ(spec, run(prompts[p], "ar")) << "prompt " << p;
      // Every token but the newest, unless the stop token ended it (no Advance then).
      expected += static_cast<int64_t>(prompts[p].size() + spec.size()) - 1;
    }
    // The last step's tokens (and the rows of the step before) never travel: the session
    // closes instead. So the count is within one step of gamma + 1 tokens per sequence.
    const absl::Time end = absl::Now() + absl::Seconds(30);
    int64_t got = 0;
    while ((got = (*draft_engine)->Stats().hidden_rows - before) < expected - 2 * 4 &&
           absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_LE(got, expected);
    EXPECT_GE(got, expected - 2 * 4);
    EXPECT_GE(got, static_cast<int64_t>(prompts[1].size() + prompts[2].size()));
  }
  server->server->Shutdown(std::chrono::system_clock::now());
  server->server->Wait();
}

}  // namespace
}  // namespace tandem
