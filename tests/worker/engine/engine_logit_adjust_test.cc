// Logit bias, penalties and min_tokens through the engine on the bundled target model: AR with
// them equals a hand-written decode loop that adjusts each step's logits from their definitions
// (tests/worker/sampling/logit_adjust_reference.h); every lossless mode reproduces that AR output
// exactly with them on, in one mixed batch; lossy modes run with them; min_tokens holds stop
// tokens back and the adjustments change the output.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/engine/collecting_sink.h"
#include "tests/worker/engine/test_draft_channel.h"
#include "tests/worker/sampling/logit_adjust_reference.h"
#include "worker/engine/engine.h"

namespace tandem {
namespace {

using testing::CollectingSink;
using testing::InProcessDraftChannel;

const std::string kModelDir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-target";
constexpr int kNewTokens = 40;
constexpr int kPrompts = 6;
constexpr char kDrafter[] = "in-process";

class EngineLogitAdjustTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kModelDir + "/config.json")) return;
    absl::StatusOr<LoadedModel> loaded = LoadModelDir(kModelDir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = new LoadedModel(std::move(*loaded));
    std::ifstream in(kModelDir + "/fixtures/greedy.json");
    const nlohmann::json greedy = nlohmann::json::parse(in);
    prompts_ = new std::vector<std::vector<int32_t>>();
    for (const nlohmann::json& c : greedy["cases"]) {
      prompts_->push_back(c["prompt_ids"].get<std::vector<int32_t>>());
      if (static_cast<int>(prompts_->size()) == kPrompts) break;
    }
  }
  static void TearDownTestSuite() {
    delete model_;
    delete prompts_;
    model_ = nullptr;
    prompts_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "no bundled model at " << kModelDir;
  }

  static std::unique_ptr<Engine> MakeEngine() {
    EngineOptions options;
    options.default_drafter = kDrafter;
    options.draft_timeout = absl::Seconds(10);  // chains always arrive: spec really drafts
    options.adaptive_gamma = false;             // and verifies γ drafts every step
    Transformer* target = model_->model.get();
    DraftChannelFactory drafters =
        [target](
            const std::string& address,
            DraftChannel::ChainCallback on_chain) -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
      if (address != kDrafter) return absl::NotFoundError("no such drafter");
      return std::make_unique<InProcessDraftChannel>(target, 512, std::move(on_chain));
    };
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(model_, std::move(options), std::move(drafters));
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  // Every adjustment at once; the model's EOS ignored, so the stop tokens are the request's.
  static SequenceRequest Request(const std::string& mode, int prompt, const LogitAdjust& adjust,
                                 std::vector<int32_t> stop_token_ids = {}) {
    SequenceRequest r;
    r.prompt_ids = (*prompts_)[prompt];
    r.mode = mode;
    r.mode_options.spec_gamma = 3;
    if (mode == "jacobi") r.mode_options.jacobi_block_size = 4;
    r.max_tokens = kNewTokens;
    r.ignore_eos = true;
    r.stop_token_ids = std::move(stop_token_ids);
    r.adjust = adjust;
    return r;
  }

  static LogitAdjust Adjust() {
    LogitAdjust a;
    a.presence_penalty = 0.8f;
    a.frequency_penalty = 1.0f;
    a.repetition_penalty = 1.3f;
    a.logit_bias = {{(*prompts_)[0][3], 2.0f}, {(*prompts_)[1][2], -3.0f}};
    return a;
  }

  // Greedy AR by hand: one forward per token on one KV cache, each step's logits adjusted from
  // the definitions; ends at a stop token (which the engine's token stream includes, as here) or
  // after kNewTokens.
  static std::vector<int32_t> HandDecode(int prompt, LogitAdjust adjust,
                                         const std::vector<int32_t>& stop_token_ids) {
    adjust.min_tokens_ban = stop_token_ids;
    Transformer& model = *model_->model;
    const int vocab = model.config().vocab_size;
    const std::vector<int32_t>& prompt_ids = (*prompts_)[prompt];
    KvCache kv(model.KvOptions(static_cast<int64_t>(prompt_ids.size()) + kNewTokens + 64));
    EXPECT_TRUE(kv.AddSequence(1).ok());
    std::vector<int32_t> pending = prompt_ids;
    std::vector<int32_t> generated;
    int length = 0;
    while (static_cast<int>(generated.size()) < kNewTokens) {
      const int n = static_cast<int>(pending.size());
      std::vector<int32_t> positions(n);
      std::iota(positions.begin(), positions.end(), length);
      const std::vector<int32_t> outputs = {n - 1};
      EXPECT_TRUE(kv.Reserve(1, n));
      const Extend extend{.seq = 1, .tokens = pending, .positions = positions, .outputs = outputs};
      absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&extend, 1}, kv);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) return {};
      std::vector<int32_t> keep(n);
      std::iota(keep.begin(), keep.end(), 0);
      EXPECT_TRUE(kv.Commit(1, keep).ok());
      length += n;
      const std::vector<float> row = testing::ReferenceAdjust(
          adjust, std::vector<float>((*out)[0].logits.begin(), (*out)[0].logits.begin() + vocab),
          prompt_ids, generated);
      const int32_t token = Argmax(row);
      generated.push_back(token);
      if (std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end()) {
        break;
      }
      pending = {token};
    }
    return generated;
  }

  // Submits every request at once; returns each output, every one checked to have no error.
  static std::vector<std::vector<int32_t>> RunAll(Engine& engine,
                                                  const std::vector<SequenceRequest>& requests) {
    std::vector<std::shared_ptr<CollectingSink>> sinks;
    for (const SequenceRequest& r : requests) {
      sinks.push_back(std::make_shared<CollectingSink>());
      absl::StatusOr<uint64_t> id = engine.Submit(r, sinks.back());
      EXPECT_TRUE(id.ok()) << id.status();
    }
    std::vector<std::vector<int32_t>> outputs;
    for (size_t i = 0; i < sinks.size(); ++i) {
      EXPECT_TRUE(sinks[i]->Wait());
      EXPECT_TRUE(sinks[i]->error().ok()) << requests[i].mode << ": " << sinks[i]->error();
      outputs.push_back(sinks[i]->tokens());
    }
    return outputs;
  }

  static LoadedModel* model_;
  static std::vector<std::vector<int32_t>>* prompts_;
};

LoadedModel* EngineLogitAdjustTest::model_ = nullptr;
std::vector<std::vector<int32_t>>* EngineLogitAdjustTest::prompts_ = nullptr;

TEST_F(EngineLogitAdjustTest, ArEqualsTheDefinitionsAndTheAdjustmentsChangeTheOutput) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  std::vector<SequenceRequest> requests;
  for (int p = 0; p < kPrompts; ++p) {
    requests.push_back(Request("ar", p, Adjust()));
    requests.push_back(Request("ar", p, LogitAdjust{}));
  }
  const std::vector<std::vector<int32_t>> outputs = RunAll(*engine, requests);
  int changed = 0;
  for (int p = 0; p < kPrompts; ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    EXPECT_EQ(outputs[2 * p], HandDecode(p, Adjust(), {}));
    EXPECT_EQ(outputs[2 * p + 1], HandDecode(p, LogitAdjust{}, {}));
    changed += outputs[2 * p] != outputs[2 * p + 1];
  }
  EXPECT_EQ(changed, kPrompts);
}

TEST_F(EngineLogitAdjustTest, EveryLosslessModeReproducesAdjustedArInOneBatch) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const ModelConfig& config = model_->model->config();
  std::vector<std::string> lossless;
  std::vector<std::string> lossy;
  for (const std::string& mode : ImplementedModes()) {
    absl::StatusOr<std::unique_ptr<DecodingMode>> created =
        CreateMode(mode, Request(mode, 0, {}).mode_options, config, SamplingParams{});
    // Modes this model cannot run (none today) are not this test's concern.
    if (!created.ok()) continue;
    ((*created)->lossless() ? lossless : lossy).push_back(mode);
  }
  ASSERT_GE(lossless.size(), 5u);
  std::vector<SequenceRequest> requests;
  for (const std::string& mode : ImplementedModes()) {
    for (int p = 0; p < kPrompts; ++p) requests.push_back(Request(mode, p, Adjust()));
  }
  const std::vector<std::vector<int32_t>> outputs = RunAll(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const int p = static_cast<int>(i) % kPrompts;
    const std::string& mode = requests[i].mode;
    SCOPED_TRACE(mode + " prompt " + std::to_string(p));
    if (std::find(lossless.begin(), lossless.end(), mode) != lossless.end()) {
      EXPECT_EQ(outputs[i], outputs[p]);  // the first kPrompts requests are ar's
    } else {
      EXPECT_EQ(outputs[i].size(), static_cast<size_t>(kNewTokens));
    }
  }
}

TEST_F(EngineLogitAdjustTest, MinTokensHoldsStopTokensBackInEveryLosslessMode) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  // A stop token the unadjusted output reaches early: its second token.
  const std::vector<int32_t> plain = HandDecode(2, LogitAdjust{}, {});
  ASSERT_GE(plain.size(), 2u);
  const std::vector<int32_t> stop = {plain[1]};
  LogitAdjust held;
  held.min_tokens = 8;
  const std::vector<int32_t> expected = HandDecode(2, held, stop);
  ASSERT_GT(expected.size(), 8u);
  EXPECT_EQ(HandDecode(2, LogitAdjust{}, stop).size(), 2u);
  std::vector<SequenceRequest> requests;
  for (const char* mode : {"ar", "spec", "jacobi", "self_spec"}) {
    requests.push_back(Request(mode, 2, held, stop));
  }
  const std::vector<std::vector<int32_t>> outputs = RunAll(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(outputs[i], expected) << requests[i].mode;
  }
}

TEST_F(EngineLogitAdjustTest, RefusesAdjustmentsPastTheirBounds) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  const int vocab = model_->model->config().vocab_size;
  std::vector<SequenceRequest> bad;
  bad.push_back(Request("ar", 0, {.presence_penalty = 3}));
  bad.push_back(Request("ar", 0, {.repetition_penalty = -1}));
  LogitAdjust outside;
  outside.logit_bias = {{vocab, 1.0f}};
  bad.push_back(Request("ar", 0, outside));
  bad.push_back(Request("ar", 0, {.min_tokens = kNewTokens + 1}));
  for (const SequenceRequest& r : bad) {
    absl::StatusOr<uint64_t> id = engine->Submit(r, std::make_shared<CollectingSink>());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
  }
}

}  // namespace
}  // namespace tandem
