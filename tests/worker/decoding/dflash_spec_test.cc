// spec with a DFlash drafter: greedy output equals AR token for token, the drafter drafts from
// the target's hidden states, and the hidden rows a drafter receives are exactly those of the
// final sequence (never a rejected draft's, never one computed from non-final KV); and the
// bundled drafter is exact and accepted.
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/dflash_drafter.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/spec.h"

namespace tandem {
namespace {

using testing::TinyArch;

RunOptions Greedy(int max_tokens) {
  RunOptions run;
  run.max_tokens = max_tokens;
  return run;
}

TEST(DFlashSpecTest, GreedyOutputEqualsArAndDraftsFromHiddenStates) {
  for (TinyArch arch : {TinyArch::kQwen2, TinyArch::kQwen3}) {
    std::unique_ptr<Transformer> target = testing::TinyModel(arch, 7);
    for (int block : {2, 5, 8}) {
      std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target.get(), 40 + block, block);
      ASSERT_NE(dflash, nullptr);
      int64_t drafted = 0, accepted = 0, forwards = 0;
      for (const std::vector<int32_t>& prompt :
           testing::TestPrompts(target->config().vocab_size, 12, 3)) {
        ArMode ar(target->config().vocab_size);
        auto want = testing::RunOnce(*target, ar, prompt, Greedy(40));
        ASSERT_TRUE(want.ok()) << want.status();
        ModeOptions options;
        options.spec_gamma = block - 1;
        options.spec_dflash = dflash.get();
        auto mode = CreateMode("spec", options, target->config(), SamplingParams{});
        ASSERT_TRUE(mode.ok()) << mode.status();
        auto got = testing::RunOnce(*target, **mode, prompt, Greedy(40));
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->tokens, want->tokens) << "block " << block;
        const auto& spec = dynamic_cast<const SpecMode&>(**mode);
        EXPECT_EQ(spec.stats().drafter_failures, 0) << spec.stats().last_drafter_error;
        const auto& drafter = dynamic_cast<const DFlashDrafter&>(spec.drafter());
        // Every token but the last has its row: the prompt's from the prefill step, the rest
        // from the verify steps.
        EXPECT_EQ(drafter.context_length(),
                  static_cast<int>(prompt.size() + got->tokens.size()) - 1);
        drafted += got->drafted;
        accepted += got->accepted;
        forwards += drafter.stats().forwards;
      }
      // The prefill step cannot draft (no rows yet); every later step drafts block - 1 tokens
      // (fewer at the budget's end).
      EXPECT_GT(forwards, 0);
      EXPECT_GT(drafted, 0);
      std::printf("[ dflash   ] block %d: %lld of %lld drafts accepted (random weights)\n", block,
                  static_cast<long long>(accepted), static_cast<long long>(drafted));
    }
  }
}

// Forwards drafting to an AR drafter that agrees with the target only sometimes (so drafts are
// rejected), and records the hidden rows spec hands over.
class RecordingDrafter : public Drafter {
 public:
  RecordingDrafter(Transformer* drafter, std::vector<int32_t> layers)
      : inner_(drafter, 1024), layers_(std::move(layers)) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override {
    return inner_.Draft(tokens, gamma);
  }
  const DrafterStats& stats() const override { return inner_.stats(); }
  std::vector<int32_t> HiddenLayers() const override { return layers_; }
  absl::Status AddHidden(int start, std::span<const int32_t> tokens,
                         std::span<const float> hidden) override {
    calls.push_back({start, {tokens.begin(), tokens.end()}, {hidden.begin(), hidden.end()}});
    return absl::OkStatus();
  }

  struct Call {
    int start;
    std::vector<int32_t> tokens;
    std::vector<float> hidden;  // [layers, tokens, H]
  };
  std::vector<Call> calls;

 private:
  InProcessArDrafter inner_;
  std::vector<int32_t> layers_;
};

TEST(DFlashSpecTest, HiddenRowsHandedOverAreThoseOfTheFinalSequence) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 8);
  std::unique_ptr<Transformer> perturbed = testing::PerturbedModel(*target, 21, 0.05f);
  const std::vector<int32_t> layers = {2, 0, 1};
  const int h = target->config().hidden_size;
  int64_t rejected = 0;
  for (const std::vector<int32_t>& prompt : testing::TestPrompts(97, 6, 5)) {
    auto recording = std::make_unique<RecordingDrafter>(perturbed.get(), layers);
    RecordingDrafter* rec = recording.get();
    SpecMode mode(4, std::move(recording), target->config().vocab_size,
                  target->config().max_position_embeddings);
    auto got = testing::RunOnce(*target, mode, prompt, Greedy(40));
    ASSERT_TRUE(got.ok()) << got.status();
    rejected += got->drafted - got->accepted;
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), got->tokens.begin(), got->tokens.end());

    // The rows of one causal forward over the final sequence.
    KvCache kv(target->KvOptions(static_cast<int64_t>(all.size()) + 16, 16));
    ASSERT_TRUE(kv.AddSequence(1).ok());
    ASSERT_TRUE(kv.Reserve(1, static_cast<int>(all.size())).has_value());
    std::vector<int32_t> positions(all.size());
    for (size_t i = 0; i < all.size(); ++i) positions[i] = static_cast<int32_t>(i);
    Extend extend{.seq = 1, .tokens = all, .positions = positions, .hidden_layers = layers};
    auto ref = target->Forward({&extend, 1}, kv);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const size_t n = all.size();

    int next = 0;
    for (const RecordingDrafter::Call& call : rec->calls) {
      ASSERT_EQ(call.start, next) << "rows must arrive in order, without gaps or repeats";
      const size_t m = call.tokens.size();
      ASSERT_EQ(call.hidden.size(), layers.size() * m * h);
      for (size_t t = 0; t < m; ++t) {
        ASSERT_EQ(call.tokens[t], all[call.start + t]) << "row of a token that is not final";
        for (size_t l = 0; l < layers.size(); ++l) {
          for (int i = 0; i < h; ++i) {
            const float want = (*ref)[0].hidden[(l * n + call.start + t) * h + i];
            ASSERT_NEAR(call.hidden[(l * m + t) * h + i], want,
                        1e-4 * std::max(1.0f, std::abs(want)))
                << "token " << call.start + t << " layer " << layers[l];
          }
        }
      }
      next += static_cast<int>(m);
    }
    EXPECT_EQ(next, static_cast<int>(n) - 1) << "every token but the newest has its row";
  }
  EXPECT_GT(rejected, 0) << "no draft was rejected; the test would not see a rejected row";
}

TEST(DFlashSpecTest, TooManyTokensWithoutRowsGiveNoDrafts) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 8);
  std::unique_ptr<DFlashModel> dflash = testing::TinyDFlash(target.get(), 3, 4);
  DFlashDrafter drafter(dflash.get());
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  auto none = drafter.Draft(tokens, 3);  // 5 tokens without rows > max_anchor 2
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  const int h = target->config().hidden_size;
  std::vector<float> rows(2 * 3 * h, 0.5f);
  ASSERT_TRUE(drafter.AddHidden(0, std::span(tokens).first(3), rows).ok());
  auto two = drafter.Draft(tokens, 3);  // a = 2: slots 2, 3 of a 4-slot block
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), 2u);
  // A gap is refused; a changed prefix drops the rows past it.
  EXPECT_FALSE(drafter.AddHidden(4, std::span(tokens).subspan(4), std::vector<float>(2 * h)).ok());
  const std::vector<int32_t> other = {1, 9, 3};
  auto redo = drafter.Draft(other, 3);
  ASSERT_TRUE(redo.ok());
  EXPECT_EQ(drafter.context_length(), 1);
  EXPECT_EQ(redo->size(), 2u);
}

// The bundled target with the bundled DFlash drafter: greedy spec reproduces ar on the
// fixture prompts, and the trained drafter's blocks do get accepted.
TEST(DFlashSpecTest, BundledDrafterIsExactAndAccepted) {
  const std::string root = std::string(TANDEM_SOURCE_DIR) + "/models/";
  auto target = Transformer::Load(root + "tandem-target");
  ASSERT_TRUE(target.ok()) << target.status();
  auto dflash = DFlashModel::Load(root + "tandem-dflash", target->get());
  ASSERT_TRUE(dflash.ok()) << dflash.status();
  std::ifstream in(root + "tandem-dflash/fixtures/drafts.json");
  ASSERT_TRUE(in.good()) << "missing fixtures/drafts.json";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const int gamma = (*dflash)->config().block_size - 1;
  int64_t drafted = 0, accepted = 0;
  for (const nlohmann::json& p : fixture["prompts"]) {
    const auto tokens = p["tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + p["prompt_len"].get<int>());
    ArMode ar((*target)->config().vocab_size);
    auto want = testing::RunOnce(**target, ar, prompt, Greedy(48));
    ASSERT_TRUE(want.ok()) << want.status();
    ModeOptions options;
    options.spec_gamma = gamma;
    options.spec_dflash = dflash->get();
    auto mode = CreateMode("spec", options, (*target)->config(), SamplingParams{});
    ASSERT_TRUE(mode.ok()) << mode.status();
    auto got = testing::RunOnce(**target, **mode, prompt, Greedy(48));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->tokens, want->tokens);
    drafted += got->drafted;
    accepted += got->accepted;
  }
  std::printf("[ dflash   ] bundled: %lld of %lld drafts accepted\n",
              static_cast<long long>(accepted), static_cast<long long>(drafted));
  EXPECT_GT(accepted * 10, drafted) << "fewer than 10% of the trained drafter's drafts accepted";
}

}  // namespace
}  // namespace tandem
