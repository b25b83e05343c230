// Self-speculation split across two services: a DraftEngine with mask drafts on the bundled
// tri-mode target drafts k tokens a forward in `self_spec`'s layout (the last token's AR row,
// then masks 2..k), keeps drafting ahead on its own drafts, and through a drafter service a
// verifier's `spec` over it reproduces AR exactly, at a TPF set beside in-process `self_spec`.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/services/drafter/chain_collector.h"
#include "tests/services/drafter/loopback_spec.h"
#include "tests/worker/engine/bundled_model_test.h"
#include "worker/decoding/self_spec.h"
#include "worker/engine/draft_engine.h"
#include "worker/engine/engine.h"
#include "worker/sampling/sampling.h"

namespace tandem {
namespace {

using testing::ChainCollector;

constexpr int kMasks = 4;

class MaskDraftsTest : public testing::BundledModelTest {
 protected:
  Transformer& target() const { return *model_->model; }
  int32_t mask() const { return *target().config().diffusion.mask_token_id; }

  // The drafts of one forward in `self_spec`'s draft layout over `tokens` (fresh KV): the AR
  // row's argmax, then masks 2..k's (mask 1 predicts the AR row's position).
  std::vector<int32_t> Reference(const std::vector<int32_t>& tokens) {
    SelfSpecMode mode({.draft_len = kMasks, .mask_token = mask()}, target().config().vocab_size,
                      target().config().max_position_embeddings);
    const SamplingParams greedy;
    const DecodeState state{.tokens = tokens,
                            .prompt_len = static_cast<int>(tokens.size()),
                            .budget = 64,
                            .sampling = &greedy};
    const StepPlan plan = mode.Plan(state);
    KvCache kv(target().KvOptions(static_cast<int64_t>(plan.tokens.size()) + 16, 16));
    EXPECT_TRUE(kv.AddSequence(1).ok());
    EXPECT_TRUE(kv.Reserve(1, static_cast<int>(plan.tokens.size())).has_value());
    const Extend extend{.seq = 1,
                        .tokens = plan.tokens,
                        .positions = plan.positions,
                        .visible = plan.visible,
                        .outputs = plan.outputs};
    absl::StatusOr<std::vector<ExtendOutput>> out = target().Forward({&extend, 1}, kv);
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) return {};
    const int vocab = target().config().vocab_size;
    const std::vector<float>& logits = (*out)[0].logits;
    EXPECT_EQ(logits.size(), static_cast<size_t>(kMasks + 1) * vocab);
    auto row = [&](int r) {
      return Argmax(std::span<const float>(logits).subspan(static_cast<size_t>(r) * vocab, vocab));
    };
    std::vector<int32_t> drafts = {row(0)};
    for (int r = 2; r <= kMasks; ++r) drafts.push_back(row(r));
    return drafts;
  }
};

// Each forward drafts k tokens in self_spec's draft layout after the session's tokens, and the
// chain grows block after block on its own drafts up to the lookahead (2γ + 1).
TEST_F(MaskDraftsTest, ChainsAreSelfSpecDraftBlocksEachOnTheLast) {
  auto engine = DraftEngine::Create(&target(), {.mask_drafts = kMasks});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_STREQ((*engine)->drafting(), "mask_drafts");  // WorkerInfo.modes and the registry
  ChainCollector chains;
  const uint64_t stream = (*engine)->AddStream(chains.Callback());
  const int gamma = 3;  // lookahead 2γ + 1 = 7 tokens: two forwards of 4
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<int32_t>& prompt = (*prompts_)[i];
    (*engine)->Open(stream, i, prompt, gamma);
    const int len = static_cast<int>(prompt.size());
    std::optional<std::vector<int32_t>> chain = chains.WaitCovered(i, len, 2 * kMasks);
    ASSERT_TRUE(chain.has_value()) << "session " << i;
    const std::vector<int32_t> first = Reference(prompt);
    std::vector<int32_t> ahead = prompt;
    ahead.insert(ahead.end(), first.begin(), first.end());
    std::vector<int32_t> expected = first;
    const std::vector<int32_t> second = Reference(ahead);
    expected.insert(expected.end(), second.begin(), second.end());
    EXPECT_EQ(*chain, expected) << "session " << i;
  }
  const DraftEngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.drafted_tokens, 3 * 2 * kMasks);
  EXPECT_EQ(stats.forwards, 2 * 3) << "k tokens a forward";
}

TEST_F(MaskDraftsTest, BadOptionsAreRefused) {
  EXPECT_EQ(DraftEngine::Create(&target(), {.mask_drafts = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftEngine::Create(&target(), {.mask_drafts = kMaxMaskDrafts + 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The verifier's `spec` against a drafter service hosting its own target with mask drafts:
// greedy output equal to AR, and tokens per target forward beside in-process `self_spec`'s.
TEST_F(MaskDraftsTest, SpecOverASelfSpecDrafterServiceEqualsArThroughGrpc) {
  auto draft_engine = DraftEngine::Create(&target(), {.mask_drafts = kMasks});
  ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
  {
    auto loopback = testing::LoopbackSpec::Create(model_, draft_engine->get(), "tandem-target",
                                                  {.draft_timeout = absl::Seconds(10)});
    ASSERT_TRUE(loopback.ok()) << loopback.status();
    auto run = [&](int prompt, const std::string& mode) {
      SequenceRequest r;
      r.prompt_ids = (*prompts_)[prompt];
      r.mode = mode;
      r.mode_options.spec_gamma = kMasks;
      r.mode_options.self_spec_draft_len = kMasks;
      r.max_tokens = 48;
      return (*loopback)->Run(std::move(r));
    };
    int split_tokens = 0, split_forwards = 0, local_tokens = 0, local_forwards = 0;
    for (int p = 0; p < 4; ++p) {
      const auto split = run(p, "spec");
      const auto local = run(p, "self_spec");
      const auto ar = run(p, "ar");
      EXPECT_EQ(split->tokens(), ar->tokens()) << "prompt " << p;
      EXPECT_EQ(local->tokens(), ar->tokens()) << "prompt " << p;
      EXPECT_GT(split->usage().accepted, 0) << "prompt " << p;
      split_tokens += static_cast<int>(split->tokens().size());
      split_forwards += split->usage().forwards;
      local_tokens += static_cast<int>(local->tokens().size());
      local_forwards += local->usage().forwards;
    }
    std::printf(
        "[ split    ] tokens per target forward: split self-spec %.2f, in-process "
        "self_spec %.2f (k = %d)\n",
        static_cast<double>(split_tokens) / split_forwards,
        static_cast<double>(local_tokens) / local_forwards, kMasks);
    // The verifier's forwards only verify: more tokens per target forward than in-process
    // self_spec, whose cycles pay a draft forward too.
    EXPECT_GT(split_tokens * local_forwards, local_tokens * split_forwards);
  }
}

}  // namespace
}  // namespace tandem
