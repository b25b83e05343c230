// DraftEngine: chains are the draft model's greedy continuation whatever the batching, the
// eviction or the order of advances; agreeing advances reuse the drafted KV.
#include "worker/engine/draft_engine.h"

#include <atomic>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/drafter.h"
#include "worker/sampling/grammar.h"

namespace tandem {
namespace {

using ::tandem::testing::ChainCollector;
using ::tandem::testing::TestPrompts;
using ::tandem::testing::TinyArch;
using ::tandem::testing::TinyModel;

// The model's greedy continuation of `tokens`, `n` tokens long (fewer at the context's end).
std::vector<int32_t> Greedy(Transformer& model, const std::vector<int32_t>& tokens, int n) {
  InProcessArDrafter drafter(&model, static_cast<int>(tokens.size()) + n + 16);
  absl::StatusOr<std::vector<int32_t>> drafts = drafter.Draft(tokens, n);
  EXPECT_TRUE(drafts.ok()) << drafts.status();
  return drafts.ok() ? *drafts : std::vector<int32_t>();
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class DraftEngineTest : public ::testing::Test {
 protected:
  void Start(DraftEngineOptions options, int max_positions = 128) {
    model_ = TinyModel(TinyArch::kQwen2, 7, max_positions);
    auto engine = DraftEngine::Create(model_.get(), options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    stream_ = engine_->AddStream(chains_.Callback());
  }

  std::unique_ptr<Transformer> model_;
  ChainCollector chains_;
  std::unique_ptr<DraftEngine> engine_;
  uint64_t stream_ = 0;
};

TEST_F(DraftEngineTest, ChainIsTheGreedyContinuationUpToTheLookahead) {
  Start({.kv_tokens = 4096});
  const int gamma = 3;
  const auto prompts = TestPrompts(64, 4, 11);
  for (size_t i = 0; i < prompts.size(); ++i) engine_->Open(stream_, i, prompts[i], gamma);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int len = static_cast<int>(prompts[i].size());
    auto chain = chains_.WaitCovered(i, len, 2 * gamma + 1);
    ASSERT_TRUE(chain.has_value()) << "session " << i;
    EXPECT_EQ(*chain, Greedy(*model_, prompts[i], 2 * gamma + 1)) << "session " << i;
    const ChainCollector::View view = chains_.Get(i);
    // The first chain starts at the final tokens' end and waits for gamma tokens.
    ASSERT_FALSE(view.log.empty());
    EXPECT_EQ(view.log[0].from, len);
    EXPECT_GE(static_cast<int>(view.log[0].tokens.size()), gamma);
  }
  const DraftEngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.sessions, 4);
  EXPECT_EQ(stats.drafted_tokens, 4 * (2 * gamma + 1));
}

// A session opened with a grammar drafts its chain under it: every draft keeps the generated
// text inside the grammar, where the same model drafts text outside it unconstrained.
TEST_F(DraftEngineTest, AGrammarSessionDraftsInsideTheGrammar) {
  Start({.kv_tokens = 4096});
  GrammarCompiler compiler(testing::TinyByteVocab(), 64, {63});
  absl::StatusOr<std::shared_ptr<const Grammar>> grammar =
      compiler.Compile({.kind = GrammarSpec::Kind::kJsonObject});
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  const int gamma = 4;
  const std::vector<int32_t> prompt = TestPrompts(63, 1, 17)[0];
  const int len = static_cast<int>(prompt.size());
  engine_->Open(stream_, 1, prompt, gamma, {}, 0,
                DraftSessionGrammar{.grammar = *grammar, .prompt_len = len, .stop_tokens = {63}});
  engine_->Open(stream_, 2, prompt, gamma);
  auto constrained = chains_.WaitCovered(1, len, 2 * gamma + 1);
  auto free = chains_.WaitCovered(2, len, 2 * gamma + 1);
  ASSERT_TRUE(constrained.has_value() && free.has_value());
  GrammarCursor cursor(*grammar, {63});
  EXPECT_TRUE(cursor.MoveTo({}, *constrained));
  EXPECT_FALSE(cursor.MoveTo({}, *free));
  EXPECT_EQ((*constrained)[0], 1) << "an object starts with '{'";

  // After an advance the chain continues inside the grammar from the new final tokens.
  const std::vector<int32_t> append(constrained->begin(), constrained->begin() + 2);
  engine_->Advance(stream_, 1, len, append, 0);
  auto next = chains_.WaitCovered(1, len + 2, 2 * gamma + 1);
  ASSERT_TRUE(next.has_value());
  EXPECT_TRUE(cursor.MoveTo(append, *next));

  // A prompt length past the tokens ends the session.
  engine_->Open(stream_, 3, prompt, gamma, {}, 0,
                DraftSessionGrammar{.grammar = *grammar, .prompt_len = len + 1});
  ASSERT_FALSE(chains_.WaitCovered(3, len, 1).has_value() && chains_.Get(3).error.ok());
  EXPECT_EQ(chains_.Get(3).error.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DraftEngineTest, AgreeingAdvanceShiftsTheChainWithoutRecompute) {
  Start({.kv_tokens = 4096});
  const int gamma = 4;
  const std::vector<int32_t> prompt = TestPrompts(64, 1, 3)[0];
  const int len = static_cast<int>(prompt.size());
  engine_->Open(stream_, 1, prompt, gamma);
  auto chain = chains_.WaitCovered(1, len, 2 * gamma + 1);
  ASSERT_TRUE(chain.has_value());
  const DraftEngineStats before = engine_->Stats();
  EXPECT_EQ(before.fed_tokens, len + 2 * gamma);

  // All gamma drafts accepted plus a bonus token that agrees too.
  const std::vector<int32_t> accepted(chain->begin(), chain->begin() + gamma + 1);
  const int messages_before = chains_.Get(1).messages;
  engine_->Advance(stream_, 1, len, accepted, 0);
  const std::vector<int32_t> now = Concat(prompt, accepted);
  const int now_len = static_cast<int>(now.size());
  auto next = chains_.WaitCovered(1, now_len, 2 * gamma + 1);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, Greedy(*model_, now, 2 * gamma + 1));
  // The answer to the advance came at once from the chain drafted ahead: gamma tokens.
  const ChainCollector::View view = chains_.Get(1);
  const DraftChain& first = view.log[messages_before];
  EXPECT_EQ(first.from, now_len);
  EXPECT_EQ(static_cast<int>(first.tokens.size()), gamma);

  const DraftEngineStats after = engine_->Stats();
  EXPECT_EQ(after.reused_tokens - before.reused_tokens, gamma + 1);
  // Only the new drafts' predecessors were fed: one token per new draft, nothing recomputed.
  EXPECT_EQ(after.fed_tokens - before.fed_tokens, gamma + 1);
  EXPECT_EQ(after.drafted_tokens - before.drafted_tokens, gamma + 1);
}

TEST_F(DraftEngineTest, DisagreeingAdvanceRedraftsFromTheAgreeingPrefix) {
  Start({.kv_tokens = 4096});
  const int gamma = 3;
  const std::vector<int32_t> prompt = TestPrompts(64, 2, 5)[1];
  const int len = static_cast<int>(prompt.size());
  engine_->Open(stream_, 9, prompt, gamma);
  auto chain = chains_.WaitCovered(9, len, 2 * gamma + 1);
  ASSERT_TRUE(chain.has_value());
  // The first draft accepted, the second rejected and resampled as something else.
  const std::vector<int32_t> append = {(*chain)[0], ((*chain)[1] + 1) % 64};
  engine_->Advance(stream_, 9, len, append, 0);
  const std::vector<int32_t> now = Concat(prompt, append);
  auto next = chains_.WaitCovered(9, static_cast<int>(now.size()), 2 * gamma + 1);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(*next, Greedy(*model_, now, 2 * gamma + 1));

  // A disagreement at the last appended token, where the verifier's chain ends: the new chain
  // must read as a replacement (it starts one final token earlier).
  auto full = chains_.WaitCovered(9, static_cast<int>(now.size()), 2 * gamma + 1);
  std::vector<int32_t> append2(full->begin(), full->begin() + 2 * gamma);
  append2.push_back(((*full)[2 * gamma] + 1) % 64);
  engine_->Advance(stream_, 9, static_cast<int>(now.size()), append2, 0);
  const std::vector<int32_t> now2 = Concat(now, append2);
  auto next2 = chains_.WaitCovered(9, static_cast<int>(now2.size()), 2 * gamma + 1);
  ASSERT_TRUE(next2.has_value());
  EXPECT_EQ(*next2, Greedy(*model_, now2, 2 * gamma + 1));
  const ChainCollector::View view = chains_.Get(9);
  bool anchored = false;
  for (const DraftChain& c : view.log) anchored |= c.from == static_cast<int>(now2.size()) - 1;
  EXPECT_TRUE(anchored);
}

TEST_F(DraftEngineTest, SessionsShareBatchedForwards) {
  Start({.kv_tokens = 8192});
  const int gamma = 3;
  const auto prompts = TestPrompts(64, 8, 21);
  // The engine thread waits in the first chain's callback until every session is open, so that
  // a descheduled test thread cannot let the first sessions draft alone (flaky under load).
  auto all_open = std::make_shared<absl::Notification>();
  const uint64_t gated =
      engine_->AddStream([all_open, forward = chains_.Callback()](DraftChain chain) {
        all_open->WaitForNotification();
        forward(std::move(chain));
      });
  for (size_t i = 0; i < prompts.size(); ++i) engine_->Open(gated, 100 + i, prompts[i], gamma);
  all_open->Notify();
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto chain = chains_.WaitCovered(100 + i, static_cast<int>(prompts[i].size()), 2 * gamma + 1);
    ASSERT_TRUE(chain.has_value());
    EXPECT_EQ(*chain, Greedy(*model_, prompts[i], 2 * gamma + 1)) << "session " << i;
  }
  const DraftEngineStats stats = engine_->Stats();
  // One at a time would take a forward per drafted token.
  EXPECT_LT(stats.forwards, stats.drafted_tokens / 2) << stats.forwards;
}

TEST_F(DraftEngineTest, EvictionUnderATinyCacheKeepsChainsExact) {
  // Room for one full-context session; six sessions of ~30 tokens each do not fit together.
  Start({.kv_tokens = 64, .kv_block_size = 16}, /*max_positions=*/64);
  const int gamma = 3;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : TestPrompts(64, 12, 31)) {
    if (p.size() >= 10) prompts.push_back(p);
  }
  ASSERT_GE(prompts.size(), 4u);
  for (size_t i = 0; i < prompts.size(); ++i) engine_->Open(stream_, i, prompts[i], gamma);
  std::vector<std::vector<int32_t>> now = prompts;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int len = static_cast<int>(now[i].size());
      if (len + 2 * gamma + 1 > 64) continue;
      auto chain = chains_.WaitCovered(i, len, 2 * gamma + 1);
      ASSERT_TRUE(chain.has_value()) << "session " << i << " round " << round;
      ASSERT_EQ(*chain, Greedy(*model_, now[i], 2 * gamma + 1))
          << "session " << i << " round " << round;
      // Accept two drafts and correct the third.
      std::vector<int32_t> append = {(*chain)[0], (*chain)[1], ((*chain)[2] + 5) % 64};
      engine_->Advance(stream_, i, len, append, 0);
      now[i] = Concat(now[i], append);
    }
  }
  EXPECT_GT(engine_->Stats().evictions, 0);
  EXPECT_GT(engine_->Stats().recomputed_tokens, 0);
}

TEST_F(DraftEngineTest, SessionsThatBeginAlikeShareTheirKvAndRollBackExactly) {
  Start({.kv_tokens = 4096, .kv_block_size = 16});
  const int gamma = 4;
  const std::vector<int32_t> prompt = TestPrompts(64, 1, 41)[0];
  ASSERT_GE(prompt.size(), 8u);
  std::vector<int32_t> a;
  while (a.size() < 40) a.insert(a.end(), prompt.begin(), prompt.end());
  a.resize(40);
  engine_->Open(stream_, 1, a, gamma);
  auto chain_a = chains_.WaitCovered(1, 40, 2 * gamma + 1);
  ASSERT_TRUE(chain_a.has_value());
  // The first session's KV now covers its 40 tokens and 8 drafts: three whole blocks.
  // A second session that begins with those 48 tokens takes them from the cache.
  const DraftEngineStats before = engine_->Stats();
  std::vector<int32_t> b = Concat(a, {chain_a->begin(), chain_a->begin() + 8});
  b.insert(b.end(), {3, 1, 4, 1, 5});
  engine_->Open(stream_, 2, b, gamma);
  auto chain_b = chains_.WaitCovered(2, static_cast<int>(b.size()), 2 * gamma + 1);
  ASSERT_TRUE(chain_b.has_value());
  EXPECT_EQ(*chain_b, Greedy(*model_, b, 2 * gamma + 1));
  const DraftEngineStats after = engine_->Stats();
  EXPECT_EQ(after.prefix_cache.hit_tokens - before.prefix_cache.hit_tokens, 48);
  EXPECT_EQ(after.fed_tokens - before.fed_tokens, static_cast<int64_t>(b.size()) - 48 + 2 * gamma);
  // The first session rejects its second draft: its KV rolls back into the block the second
  // session shares, which it must copy, not write; both go on exactly.
  const std::vector<int32_t> append = {(*chain_a)[0], ((*chain_a)[1] + 1) % 64};
  engine_->Advance(stream_, 1, 40, append, 0);
  const std::vector<int32_t> now = Concat(a, append);
  auto next_a = chains_.WaitCovered(1, static_cast<int>(now.size()), 2 * gamma + 1);
  ASSERT_TRUE(next_a.has_value());
  EXPECT_EQ(*next_a, Greedy(*model_, now, 2 * gamma + 1));
  const std::vector<int32_t> more = {(*chain_b)[0], ((*chain_b)[1] + 1) % 64};
  engine_->Advance(stream_, 2, static_cast<int>(b.size()), more, 0);
  const std::vector<int32_t> now_b = Concat(b, more);
  auto next_b = chains_.WaitCovered(2, static_cast<int>(now_b.size()), 2 * gamma + 1);
  ASSERT_TRUE(next_b.has_value());
  EXPECT_EQ(*next_b, Greedy(*model_, now_b, 2 * gamma + 1));
}

TEST_F(DraftEngineTest, ContextEndStopsTheChain) {
  Start({.kv_tokens = 32}, /*max_positions=*/32);
  std::vector<int32_t> prompt(30);
  for (int i = 0; i < 30; ++i) prompt[i] = (i * 7) % 64;
  engine_->Open(stream_, 1, prompt, 4);
  // Indices 30 and 31 are all the context has left: a short chain, sent because it cannot grow.
  auto chain = chains_.WaitCovered(1, 30, 2);
  ASSERT_TRUE(chain.has_value());
  EXPECT_EQ(*chain, Greedy(*model_, prompt, 2));
  std::vector<int32_t> full(32, 3);
  engine_->Open(stream_, 2, full, 4);
  auto empty = chains_.WaitCovered(2, 32, 0);
  ASSERT_TRUE(empty.has_value());
  const ChainCollector::View view = chains_.Get(2);
  ASSERT_EQ(view.messages, 1);
  EXPECT_TRUE(view.tokens.empty());
  EXPECT_TRUE(view.error.ok());
}

TEST_F(DraftEngineTest, ProtocolErrorsEndOnlyTheirSession) {
  Start({.kv_tokens = 4096, .max_sessions = 3});
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  engine_->Open(stream_, 1, prompt, 2);
  engine_->Advance(stream_, 2, 0, {1}, 0);  // never opened
  EXPECT_EQ(chains_.WaitError(2).code(), absl::StatusCode::kNotFound);
  engine_->Open(stream_, 3, {}, 2);  // empty
  EXPECT_EQ(chains_.WaitError(3).code(), absl::StatusCode::kInvalidArgument);
  engine_->Open(stream_, 4, {1, 64}, 2);  // outside the vocabulary of 64
  EXPECT_EQ(chains_.WaitError(4).code(), absl::StatusCode::kInvalidArgument);
  engine_->Open(stream_, 5, prompt, 0);  // gamma 0
  EXPECT_EQ(chains_.WaitError(5).code(), absl::StatusCode::kInvalidArgument);
  engine_->Open(stream_, 6, prompt, 2);
  engine_->Advance(stream_, 6, 4, {1}, 0);  // offset mismatch
  EXPECT_EQ(chains_.WaitError(6).code(), absl::StatusCode::kInvalidArgument);
  engine_->Open(stream_, 7, prompt, 2);
  engine_->Open(stream_, 8, prompt, 2);
  engine_->Open(stream_, 9, prompt, 2);  // the fourth open session
  EXPECT_EQ(chains_.WaitError(9).code(), absl::StatusCode::kResourceExhausted);
  engine_->Open(stream_, 7, prompt, 2);  // opened twice
  EXPECT_EQ(chains_.WaitError(7).code(), absl::StatusCode::kInvalidArgument);
  engine_->Advance(stream_, 1, 5, {7}, 0);
  engine_->Advance(stream_, 8, 5, {7}, 0);
  for (uint64_t s : {1, 8}) {
    auto chain = chains_.WaitCovered(s, 6, 5);
    ASSERT_TRUE(chain.has_value()) << "session " << s;
    EXPECT_EQ(*chain, Greedy(*model_, {1, 2, 3, 4, 5, 7}, 5));
    EXPECT_TRUE(chains_.Get(s).error.ok());
  }
}

// Stands in for rows a GPU-to-GPU transport left in device memory; counts its reads.
class FakeDevicePayload final : public DeviceHiddenPayload {
 public:
  int device() const override { return 0; }
  absl::Status Read(const Reader& read) const override {
    ++reads_;
    return read(nullptr, nullptr);
  }
  int reads() const { return reads_; }

 private:
  mutable std::atomic<int> reads_{0};
};

TEST_F(DraftEngineTest, RowsInGpuMemoryEndOnlyTheirSessionOfAnArDrafter) {
  Start({.kv_tokens = 4096, .hidden_layers = {1, 3}});
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  const int h = 16;
  auto payload = std::make_shared<FakeDevicePayload>();
  engine_->Open(stream_, 1, prompt, 2,
                HiddenRows{.layers = 2, .tokens = 5, .hidden_size = h, .device = payload});
  const absl::Status ended = chains_.WaitError(1);
  EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition) << ended;
  EXPECT_NE(ended.message().find("AR draft model"), std::string::npos) << ended;
  HiddenRows host{.layers = 2, .tokens = 5, .hidden_size = h};
  host.bf16.assign(2 * 5 * h, FloatToBf16(0.5f));
  engine_->Open(stream_, 2, prompt, 2, host);
  auto chain = chains_.WaitCovered(2, 5, 5);
  ASSERT_TRUE(chain.has_value());
  EXPECT_EQ(*chain, Greedy(*model_, prompt, 5));
  EXPECT_TRUE(chains_.Get(2).error.ok()) << chains_.Get(2).error;
  EXPECT_EQ(payload->reads(), 0);
  EXPECT_EQ(payload.use_count(), 1);
  EXPECT_EQ(engine_->Stats().hidden_rows, 5);
}

TEST_F(DraftEngineTest, RemovingTheStreamClosesItsSessions) {
  Start({.kv_tokens = 4096});
  const uint64_t other = engine_->AddStream([](DraftChain) {});
  engine_->Open(stream_, 1, {1, 2, 3}, 2);
  engine_->Open(other, 1, {1, 2, 3}, 2);
  engine_->Open(other, 2, {4, 5, 6}, 2);
  ASSERT_TRUE(chains_.WaitCovered(1, 3, 5).has_value());
  engine_->RemoveStream(other);
  engine_->Close(stream_, 1);
  // Messages are handled in order: once this session's chain arrives, the above are done.
  engine_->Open(stream_, 2, {7, 7, 7}, 2);
  ASSERT_TRUE(chains_.WaitCovered(2, 3, 2).has_value());
  const DraftEngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.sessions, 1);
  EXPECT_EQ(stats.streams, 1);
  EXPECT_EQ(stats.sessions_opened, 4);
}

TEST(DraftEngineCreate, RejectsACacheSmallerThanTheContext) {
  auto model = TinyModel(TinyArch::kQwen2, 1, 128);
  EXPECT_EQ(DraftEngine::Create(model.get(), {.kv_tokens = 100}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftEngine::Create(model.get(), {.kv_tokens = 128, .max_sessions = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DraftEngineBundled, ChainsMatchTheGreedyDecodeOfTheBundledModel) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no model at " << dir;
  auto model = Transformer::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = DraftEngine::Create(model->get(), {.kv_tokens = 4096});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ChainCollector chains;
  const uint64_t stream = (*engine)->AddStream(chains.Callback());
  const int gamma = 4;
  const std::vector<std::vector<int32_t>> prompts = {{100, 200, 300, 400}, {7, 8, 9}, {42}};
  for (size_t i = 0; i < prompts.size(); ++i) (*engine)->Open(stream, i, prompts[i], gamma);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto chain = chains.WaitCovered(i, static_cast<int>(prompts[i].size()), 2 * gamma + 1);
    ASSERT_TRUE(chain.has_value());
    EXPECT_EQ(*chain, Greedy(**model, prompts[i], 2 * gamma + 1)) << "session " << i;
  }
}

}  // namespace
}  // namespace tandem
