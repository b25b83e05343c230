// Hidden states at real sizes through the draft stream: SplitHiddenRows' pieces, and a verifier
// engine whose target is 4096 wide speculating with a random-weight DFlash drafter of that width
// (three tapped layers, a 256-token prefill chunk: 6 MiB of bf16 rows in one step, past gRPC's
// default 4 MiB message limit) behind a drafter service on loopback gRPC, over in-stream bytes.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tests/services/drafter/loopback_spec.h"
#include "worker/engine/draft_engine.h"
#include "worker/engine/engine.h"
#include "worker/engine/local_generator.h"
#include "worker/model/dflash.h"

namespace tandem {
namespace {

// Rows [offset, offset + tokens) whose values name their layer, token and column.
HiddenRows Rows(int layers, int offset, int tokens, int hidden_size) {
  HiddenRows rows{.layers = layers, .tokens = tokens, .hidden_size = hidden_size, .offset = offset};
  for (int l = 0; l < layers; ++l) {
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < hidden_size; ++h) {
        rows.bf16.push_back(static_cast<uint16_t>(l * 10000 + (offset + t) * 10 + h));
      }
    }
  }
  return rows;
}

TEST(SplitHiddenRows, RowsFitInOnePieceOrSplitWithTheTokensTheyNeed) {
  // 2 layers x 4 values x 2 bytes = 16 bytes a token.
  const HiddenRows small = Rows(2, 3, 4, 4);
  std::vector<HiddenPiece> one = SplitHiddenRows(5, 2, small, 64);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].append_begin, 0);
  EXPECT_EQ(one[0].append_end, 2);
  EXPECT_EQ(one[0].rows.bf16, small.bf16);

  // Rows of tokens 3..9 for a drafter with 6 tokens, 4 appended (tokens 6..9), 32 bytes a
  // piece: rows 3-4, 5-6 (needs token 6), 7-8 (tokens 7, 8), 9 (token 9).
  const HiddenRows rows = Rows(2, 3, 7, 4);
  std::vector<HiddenPiece> pieces = SplitHiddenRows(6, 4, rows, 32);
  ASSERT_EQ(pieces.size(), 4u);
  const std::vector<std::pair<int, int>> appends = {{0, 0}, {0, 1}, {1, 3}, {3, 4}};
  HiddenRows joined{.layers = 2, .tokens = 0, .hidden_size = 4, .offset = 3};
  std::vector<std::vector<uint16_t>> per_layer(2);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const HiddenPiece& p = pieces[i];
    EXPECT_EQ(std::pair(p.append_begin, p.append_end), appends[i]) << "piece " << i;
    EXPECT_EQ(p.rows.offset, 3 + 2 * static_cast<int>(i)) << "piece " << i;
    EXPECT_EQ(p.rows.layers, 2);
    ASSERT_EQ(p.rows.bf16.size(), static_cast<size_t>(2 * p.rows.tokens * 4));
    // No row before its token: the drafter then has 6 + append_end tokens.
    EXPECT_LE(p.rows.offset + p.rows.tokens, 6 + p.append_end) << "piece " << i;
    for (int l = 0; l < 2; ++l) {
      const auto begin = p.rows.bf16.begin() + l * p.rows.tokens * 4;
      per_layer[l].insert(per_layer[l].end(), begin, begin + p.rows.tokens * 4);
    }
  }
  per_layer[0].insert(per_layer[0].end(), per_layer[1].begin(), per_layer[1].end());
  EXPECT_EQ(per_layer[0], rows.bf16);  // the pieces are the rows, in order

  // A budget below one token's rows still sends one token a piece.
  EXPECT_EQ(SplitHiddenRows(10, 0, rows, 1).size(), 7u);
}

// A target 4096 wide (Qwen3-8B's hidden size) on the bundled tokenizer, kept narrow elsewhere
// so that the CPU runs it in seconds, and a one-layer DFlash drafter of the same width tapping
// three of its layers.
struct RealWidth {
  LoadedModel target;
  std::unique_ptr<DFlashModel> dflash;
};

std::unique_ptr<RealWidth> MakeRealWidth() {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) return nullptr;
  absl::StatusOr<LoadedModel> loaded = LoadModelDir(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return nullptr;
  auto made = std::make_unique<RealWidth>();
  made->target = std::move(*loaded);
  ModelConfig c = made->target.model->config();
  c.hidden_size = 4096;
  c.intermediate_size = 256;
  made->target.model = Transformer::FromWeights(c, BenchmarkWeights(c, 7, 0.02f));
  DFlashConfig d;
  d.model = c;
  d.model.num_layers = 1;
  d.block_size = 4;
  d.mask_token_id = c.vocab_size - 1;
  d.target_layer_ids = {1, 2, c.num_layers};
  d.max_anchor = 2;
  DFlashWeights w = RandomDFlashWeights(d, 11, 0.02f);
  absl::StatusOr<std::unique_ptr<DFlashModel>> dflash =
      DFlashModel::Create(std::move(d), std::move(w), made->target.model.get());
  EXPECT_TRUE(dflash.ok()) << dflash.status();
  if (!dflash.ok()) return nullptr;
  made->dflash = std::move(*dflash);
  return made;
}

// Before: the first prefill chunk's rows went as one 6 MiB message, the drafter's server refused
// it, the stream broke and the sequence decoded by AR without a word.
TEST(RealSizeHiddenStates, SpecThroughADrafterServiceAt4096WideEqualsAr) {
  std::unique_ptr<RealWidth> models = MakeRealWidth();
  if (models == nullptr) GTEST_SKIP() << "no bundled model";
  DraftEngineOptions draft_options;
  draft_options.dflash = models->dflash.get();
  auto draft_engine = DraftEngine::Create(models->target.model.get(), draft_options);
  ASSERT_TRUE(draft_engine.ok()) << draft_engine.status();
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(300);
  for (int32_t& t : prompt) t = static_cast<int32_t>(10 + rng() % 4000);
  {
    // The drafter's server keeps gRPC's default receive limit, as tandem-drafter does.
    auto loopback =
        testing::LoopbackSpec::Create(&models->target, draft_engine->get(), "real-width-dflash",
                                      {.prefill_chunk = 256, .draft_timeout = absl::Seconds(30)});
    ASSERT_TRUE(loopback.ok()) << loopback.status();
    auto run = [&](const std::string& mode, int max_tokens = 6) {
      SequenceRequest r;
      r.prompt_ids = prompt;
      r.mode = mode;
      r.mode_options.spec_gamma = 3;
      r.max_tokens = max_tokens;
      r.ignore_eos = true;
      return (*loopback)->Run(std::move(r));
    };
    // The first request makes the channel; its GetInfo answer (the layers) may come after the
    // session opened, which then gets no rows and no drafts: one token, which waits for none.
    // The second request gets rows for sure.
    run("spec", 1);
    const auto spec = run("spec");
    const auto ar = run("ar");
    EXPECT_EQ(spec->tokens(), ar->tokens());
    const DraftEngineStats stats = (*draft_engine)->Stats();
    std::printf(
        "[ real-size ] drafter got %lld rows of 3 x 4096 bf16, drafted %lld tokens; "
        "spec verified %d drafts\n",
        static_cast<long long>(stats.hidden_rows), static_cast<long long>(stats.drafted_tokens),
        spec->usage().drafted);
    // Every final token's rows arrived: the prompt's and the generated ones'.
    EXPECT_GE(stats.hidden_rows, static_cast<int64_t>(prompt.size()));
    EXPECT_GT(spec->usage().drafted, 0);
  }
}

}  // namespace
}  // namespace tandem
