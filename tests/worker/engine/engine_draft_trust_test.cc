// Drafts are not trusted: a drafter whose chains carry tokens outside the target's vocabulary (a
// drafter for another model registered in the same registry, or a faulty one) must not reach the
// forward, where an embedding lookup would read outside its table (each mode also drops such a
// draft itself), nor keep its sequences waiting for more: the first such chain ends drafting
// for the sequence, with the reason. On the bundled target, `spec` over such a drafter decodes
// without drafts, without an error, and still equals `ar`.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/bundled_model_test.h"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::InProcessDraftChannel;

constexpr char kDrafter[] = "foreign";
constexpr int kTokens = 24;

class EngineDraftTrustTest : public testing::BundledModelTest {
 protected:
  std::unique_ptr<Engine> MakeEngine(int32_t shift) {
    EngineOptions options;
    options.default_drafter = kDrafter;
    options.draft_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(
        model_, options,
        [this, shift](const std::string& address, DraftChannel::ChainCallback on_chain)
            -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
          if (address != kDrafter) return absl::NotFoundError("no such drafter");
          auto channel = std::make_unique<InProcessDraftChannel>(model_->model.get(), 512,
                                                                 std::move(on_chain));
          channel->set_token_shift(shift);
          channel_ = channel.get();
          return channel;
        });
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  std::shared_ptr<CollectingSink> Generate(Engine& engine, const std::string& mode, int prompt) {
    SequenceRequest r;
    r.prompt_ids = (*prompts_)[prompt];
    r.mode = mode;
    r.mode_options.spec_gamma = 3;
    r.max_tokens = kTokens;
    r.ignore_eos = true;
    auto sink = std::make_shared<CollectingSink>();
    EXPECT_TRUE(engine.Submit(std::move(r), sink).ok());
    EXPECT_TRUE(sink->Wait());
    return sink;
  }

  InProcessDraftChannel* channel_ = nullptr;  // the engine's, while it lives
};

TEST_F(EngineDraftTrustTest, TokensOutsideTheVocabularyAreNeverVerified) {
  const int vocab = model_->model->config().vocab_size;
  // Past the end (a larger vocabulary), and negative.
  for (const int32_t shift : {vocab, -vocab - 7}) {
    auto engine = MakeEngine(shift);
    ASSERT_NE(engine, nullptr);
    for (int prompt = 0; prompt < 2; ++prompt) {
      const auto ar = Generate(*engine, "ar", prompt);
      const auto spec = Generate(*engine, "spec", prompt);
      EXPECT_TRUE(spec->error().ok()) << spec->error();
      EXPECT_EQ(spec->tokens(), ar->tokens()) << "shift " << shift << ", prompt " << prompt;
      EXPECT_EQ(spec->usage().drafted, 0) << "shift " << shift;
    }
    // Drafting stops at the first such chain: the sequence asks the drafter for nothing more
    // (before: a chain for each of its steps, every one refused).
    EXPECT_LE(channel_->chains_sent(), 2 * 2) << "shift " << shift;
  }
  // The same drafter without the shift drafts (the check above is not vacuous).
  auto engine = MakeEngine(0);
  ASSERT_NE(engine, nullptr);
  const auto spec = Generate(*engine, "spec", 0);
  EXPECT_TRUE(spec->error().ok()) << spec->error();
  EXPECT_GT(spec->usage().drafted, 0);
}

}  // namespace
}  // namespace tandem
