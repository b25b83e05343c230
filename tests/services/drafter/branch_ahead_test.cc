// Branch-ahead drafting: the outcome scores (branch_ahead.h), the verifier's chain buffer drafting
// from a branch once its tokens take the branch's path, a DraftEngine's branches (the accepted
// drafts, the runner-up at the refused one, then the draft model's greedy continuation) and
// their hits, and through a drafter service a verifier's `spec` that stays exact with them.
#include "worker/engine/branch_ahead.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/services/drafter/loopback_spec.h"
#include "tests/worker/decoding/tiny_models.h"
#include "tests/worker/engine/bundled_model_test.h"
#include "worker/decoding/drafter.h"
#include "worker/engine/chain_drafter.h"
#include "worker/engine/draft_engine.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using testing::ChainCollector;

TEST(BranchAhead, TopTwoIsTheSoftmaxOfTheTwoLargest) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -inf};
  const DraftAlternative alt = TopTwo(logits);
  const double sum = std::exp(1.0) + std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(alt.p1, std::exp(3.0) / sum, 1e-6);
  EXPECT_EQ(alt.second, 2);
  EXPECT_NEAR(alt.p2, std::exp(2.0) / sum, 1e-6);
  EXPECT_EQ(TopTwo(std::vector<float>{0.5f, -inf}).second, -1);  // a masked runner-up
}

TEST(BranchAhead, LikelyRejectionsAreScoredByReachTimesRunnerUp) {
  const std::vector<DraftAlternative> alts = {{.p1 = 0.9f, .second = 5, .p2 = 0.05f},
                                              {.p1 = 0.5f, .second = 6, .p2 = 0.4f},
                                              {.p1 = 0.8f, .second = 7, .p2 = 0.1f}};
  // Scores: j0 0.05, j1 0.9 x 0.4 = 0.36, j2 0.9 x 0.5 x 0.1 = 0.045.
  EXPECT_EQ(LikelyRejections(alts, 3, 2), (std::vector<int>{1, 0}));
  EXPECT_EQ(LikelyRejections(alts, 3, 8), (std::vector<int>{1, 0, 2}));
  EXPECT_EQ(LikelyRejections(alts, 1, 2), (std::vector<int>{0}));  // only the first γ
  std::vector<DraftAlternative> unknown = alts;
  unknown[1].second = -1;
  EXPECT_EQ(LikelyRejections(unknown, 3, 1), (std::vector<int>{0}));
}

TEST(BranchAhead, TheBufferDraftsFromABranchOnceTheSequenceTakesItsPath) {
  DraftChainBuffer buffer;
  std::vector<int32_t> seq(10, 1);
  buffer.Merge(DraftChain{.session = 1, .from = 10, .tokens = {20, 21, 22, 23}}, seq);
  buffer.Merge(DraftChain{.session = 1, .from = 10, .tokens = {20, 30, 31, 32}, .branch = true},
               seq);
  EXPECT_EQ(buffer.tokens, (std::vector<int32_t>{20, 21, 22, 23}));  // the chain is kept
  std::vector<int32_t> main_path = seq;
  main_path.insert(main_path.end(), {20, 21});
  EXPECT_EQ(std::vector<int32_t>(buffer.Usable(main_path).begin(), buffer.Usable(main_path).end()),
            (std::vector<int32_t>{22, 23}));
  EXPECT_FALSE(buffer.UsableFromBranch(main_path));
  std::vector<int32_t> branch_path = seq;
  branch_path.insert(branch_path.end(), {20, 30});
  EXPECT_EQ(
      std::vector<int32_t>(buffer.Usable(branch_path).begin(), buffer.Usable(branch_path).end()),
      (std::vector<int32_t>{31, 32}));
  EXPECT_TRUE(buffer.UsableFromBranch(branch_path));
  std::vector<int32_t> neither = seq;
  neither.insert(neither.end(), {20, 40});
  EXPECT_TRUE(buffer.Usable(neither).empty());
  // A sequence past the branch's end drops it.
  std::vector<int32_t> past = branch_path;
  past.insert(past.end(), {31, 32});
  buffer.Merge(DraftChain{.session = 1, .from = 14, .tokens = {50}}, past);
  EXPECT_TRUE(buffer.branches.empty());
}

TEST(BranchAheadEngine, BranchesAreTheRunnerUpThenTheGreedyContinuationAndHitsAreCounted) {
  std::unique_ptr<Transformer> model = testing::TinyModel(testing::TinyArch::kQwen2, 7);
  auto engine = DraftEngine::Create(model.get(), {.kv_tokens = 4096, .branches = 2});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ChainCollector chains;
  const uint64_t stream = (*engine)->AddStream(chains.Callback());
  const int gamma = 3;
  const std::vector<int32_t> prompt = testing::TestPrompts(64, 1, 5)[0];
  const int len = static_cast<int>(prompt.size());
  (*engine)->Open(stream, 1, prompt, gamma);
  std::optional<std::vector<int32_t>> chain = chains.WaitCovered(1, len, 2 * gamma + 1);
  ASSERT_TRUE(chain.has_value());
  // Two branches, each sent whole.
  ASSERT_TRUE(chains.WaitBranches(1, 2));
  std::vector<int32_t> hit_path;
  int whole = 0;
  for (const DraftChain& c : chains.Get(1).log) {
    if (!c.branch) continue;
    EXPECT_EQ(c.from, len);
    // The accepted drafts, the runner-up where the chain's draft is refused, then (up to) γ
    // tokens of the model's greedy continuation of that path.
    size_t j = 0;
    while (j < c.tokens.size() && c.tokens[j] == (*chain)[j]) ++j;
    ASSERT_LT(j, static_cast<size_t>(gamma)) << "a branch departs within the first γ drafts";
    ASSERT_EQ(c.tokens.size(), j + 1 + gamma);
    std::vector<int32_t> path = prompt;
    path.insert(path.end(), c.tokens.begin(), c.tokens.begin() + j + 1);
    InProcessArDrafter greedy(model.get(), 256);
    absl::StatusOr<std::vector<int32_t>> continuation = greedy.Draft(path, gamma);
    ASSERT_TRUE(continuation.ok());
    EXPECT_EQ(std::vector<int32_t>(c.tokens.begin() + j + 1, c.tokens.end()), *continuation);
    ++whole;
    hit_path.assign(c.tokens.begin(), c.tokens.begin() + j + 1);
  }
  EXPECT_EQ(whole, 2);
  // The verifier's tokens take the last branch's path: a hit.
  (*engine)->Advance(stream, 1, len, hit_path, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while ((*engine)->Stats().branch_hits < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const DraftEngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.branch_hits, 1);
  EXPECT_GE(stats.branches, 2);
  EXPECT_GE(stats.branch_tokens, 2 * gamma);
}

TEST(BranchAheadEngine, BadOptionsAreRefused) {
  std::unique_ptr<Transformer> model = testing::TinyModel(testing::TinyArch::kQwen2, 7);
  EXPECT_EQ(DraftEngine::Create(model.get(), {.branches = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftEngine::Create(model.get(), {.branches = kMaxBranches + 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class BranchAheadServiceTest : public testing::BundledModelTest {};

// The bundled drafter with branch-ahead behind a drafter service: `spec` equals AR while the
// drafter drafts branches (and the verifier drafts from those that come in time).
TEST_F(BranchAheadServiceTest, SpecWithBranchesEqualsArAndDraftsFromThem) {
  const std::string drafter_dir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-drafter";
  if (!std::filesystem::exists(drafter_dir + "/config.json")) GTEST_SKIP() << "no drafter";
  absl::StatusOr<LoadedModel> drafter = LoadModelDir(drafter_dir);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  auto draft_engine = DraftEngine::Create(drafter->model.get(), {.branches = 2});
  ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
  {
    auto loopback = testing::LoopbackSpec::Create(model_, draft_engine->get(), "tandem-drafter",
                                                  {.draft_timeout = absl::Seconds(10)});
    ASSERT_TRUE(loopback.ok()) << loopback.status();
    auto run = [&](int prompt, const std::string& mode) {
      SequenceRequest r;
      r.prompt_ids = (*prompts_)[prompt];
      r.mode = mode;
      r.mode_options.spec_gamma = 4;
      r.max_tokens = 48;
      return (*loopback)->Run(std::move(r));
    };
    int from_branch = 0, steps = 0;
    for (int p = 0; p < 6; ++p) {
      const auto spec = run(p, "spec");
      EXPECT_EQ(spec->tokens(), run(p, "ar")->tokens()) << "prompt " << p;
      from_branch += spec->usage().drafts_from_branch;
      steps += spec->usage().draft_steps;
    }
    const DraftEngineStats stats = (*draft_engine)->Stats();
    std::printf(
        "[ branches ] %d of %d spec steps drafted from a branch; drafter: %lld branches "
        "sent, %lld hits, %lld of %lld drafted tokens in branches\n",
        from_branch, steps, static_cast<long long>(stats.branches),
        static_cast<long long>(stats.branch_hits), static_cast<long long>(stats.branch_tokens),
        static_cast<long long>(stats.drafted_tokens));
    // How many branches finish before the verifier's next advance (which drops them) is a
    // matter of timing; that they are drafted is not.
    EXPECT_GT(stats.branch_tokens, 0);
  }
}

}  // namespace
}  // namespace tandem
