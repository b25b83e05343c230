// LoRA-gated drafting (ModeOptions::lora_drafts): `isd` (R-ISD, I-DLM Appendix G),
// `self_spec` and `self_spec_quadratic` (NLD §3.3's LoRA drafter) run the model's adapter on
// their <|mask|> rows only, so their greedy output must still equal AR greedy of the base model
// token for token:
//   - on random-weight models with a strong random adapter (which must change the drafts, or
//     the check would be vacuous);
//   - on the bundled models with their trained adapters (skipped when absent), printing the
//     tokens per forward with and without the adapter;
// and gating every row, verify rows included, must break that equality (the check can fail).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/decoding/bundled_target.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/model/checkpoint/lora.h"

namespace tandem {
namespace {

using testing::TinyArch;

constexpr int kContext = 128;
constexpr int kPrompts = 20;
constexpr int kMaxTokens = 40;

// Sets the LoRA gate on every row of every plan, verify rows included: what the modes must
// never do.
class GateEveryRow : public DecodingMode {
 public:
  explicit GateEveryRow(std::unique_ptr<DecodingMode> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return false; }
  StepPlan Plan(const DecodeState& state) override {
    StepPlan plan = inner_->Plan(state);
    plan.lora_gate.assign(plan.tokens.size(), 1);
    return plan;
  }
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    return inner_->Consume(state, plan, out);
  }

 private:
  std::unique_ptr<DecodingMode> inner_;
};

struct Totals {
  int64_t tokens = 0;
  int64_t forwards = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int differing = 0;  // prompts whose output differs from AR

  double Tpf() const { return forwards > 0 ? static_cast<double>(tokens) / forwards : 0.0; }
};

// Decodes every prompt with AR and with `mode_name` (a fresh mode per prompt); counts the
// prompts whose tokens differ from AR's.
Totals Compare(Transformer& model, const ModelConfig& config, const std::string& mode_name,
               const ModeOptions& options, const std::vector<std::vector<int32_t>>& prompts,
               int max_tokens) {
  Totals t;
  for (const std::vector<int32_t>& prompt : prompts) {
    RunOptions run;
    run.max_tokens = max_tokens;
    ArMode ar(config.vocab_size);
    absl::StatusOr<RunStats> want = testing::RunOnce(model, ar, prompt, run);
    EXPECT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode(mode_name, options, config, SamplingParams{});
    EXPECT_TRUE(mode.ok()) << mode.status();
    if (!want.ok() || !mode.ok()) return t;
    std::unique_ptr<DecodingMode> run_mode = std::move(*mode);
    absl::StatusOr<RunStats> got = testing::RunOnce(model, *run_mode, prompt, run);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return t;
    t.tokens += static_cast<int64_t>(got->tokens.size());
    t.forwards += got->forwards;
    t.drafted += got->drafted;
    t.accepted += got->accepted;
    if (got->tokens != want->tokens) ++t.differing;
  }
  return t;
}

struct ModeCase {
  std::string label;
  std::string mode;
  ModeOptions options;
  int block = 4;  // the random models' <|mask|> block size
};

std::vector<ModeCase> Cases() {
  ModeOptions isd;
  isd.isd_stride = 4;
  ModeOptions self_spec;
  self_spec.self_spec_draft_len = 4;
  return {{"isd N=4", "isd", isd},
          {"self_spec k=4", "self_spec", self_spec},
          {"self_spec_quadratic k=4", "self_spec_quadratic", self_spec}};
}

class RandomModelTest : public ::testing::TestWithParam<TinyArch> {
 protected:
  void SetUp() override {
    const bool qwen3 = GetParam() == TinyArch::kQwen3;
    model_ = testing::TinyModel(GetParam(), qwen3 ? 8 : 7, kContext);
    model_->SetLoraAdapter(testing::RandomLoraAdapter(model_->config(), qwen3 ? 41 : 43, 0.5f));
    prompts_ = testing::TestPrompts(model_->config().vocab_size, kPrompts, qwen3 ? 12 : 11);
  }
  ModelConfig WithMask(int block) const {
    ModelConfig c = model_->config();
    c.diffusion.mask_token_id = c.vocab_size - 1;
    c.diffusion.block_size = block;
    return c;
  }
  std::unique_ptr<Transformer> model_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(RandomModelTest, GatedDraftsStayExactAndChangeTheDrafts) {
  for (const ModeCase& c : Cases()) {
    const ModelConfig config = WithMask(c.block);
    ModeOptions with = c.options;
    with.lora_drafts = true;
    const Totals base = Compare(*model_, config, c.mode, c.options, prompts_, kMaxTokens);
    const Totals lora = Compare(*model_, config, c.mode, with, prompts_, kMaxTokens);
    std::printf(
        "[ lora     ] %s: TPF %.3f without the adapter, %.3f with (%lld / %lld drafts "
        "accepted without, %lld / %lld with)\n",
        c.label.c_str(), base.Tpf(), lora.Tpf(), static_cast<long long>(base.accepted),
        static_cast<long long>(base.drafted), static_cast<long long>(lora.accepted),
        static_cast<long long>(lora.drafted));
    EXPECT_EQ(base.differing, 0) << c.label;
    EXPECT_EQ(lora.differing, 0) << c.label << " with the adapter on its draft rows";
    // The adapter reached the drafts (otherwise exactness would be vacuous).
    EXPECT_NE(std::make_pair(base.drafted, base.accepted),
              std::make_pair(lora.drafted, lora.accepted))
        << c.label;
  }
}

// Rows whose KV is kept (the pending tokens, accepted drafts) computed with the adapter on would
// change the output and the KV the prefix cache shares: the step contract refuses them.
TEST_P(RandomModelTest, GatingKeptRowsIsRefusedByTheStepContract) {
  for (const ModeCase& c : Cases()) {
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode(c.mode, c.options, WithMask(c.block), SamplingParams{});
    ASSERT_TRUE(mode.ok()) << mode.status();
    GateEveryRow gated(std::move(*mode));
    RunOptions run;
    run.max_tokens = kMaxTokens;
    absl::StatusOr<RunStats> got = testing::RunOnce(*model_, gated, prompts_[0], run);
    ASSERT_FALSE(got.ok()) << c.label;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << c.label;
    EXPECT_NE(got.status().message().find("adapter off"), std::string_view::npos) << got.status();
  }
}

TEST_P(RandomModelTest, GateWithoutAnAdapterIsAnError) {
  std::unique_ptr<Transformer> plain = testing::TinyModel(GetParam(), 5, kContext);
  ModelConfig config = plain->config();
  config.diffusion.mask_token_id = config.vocab_size - 1;
  config.diffusion.block_size = 4;
  for (const ModeCase& c : Cases()) {
    ModeOptions options = c.options;
    options.lora_drafts = true;
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode(c.mode, options, config, SamplingParams{});
    ASSERT_TRUE(mode.ok()) << mode.status();
    RunOptions run;
    run.max_tokens = 8;
    absl::StatusOr<RunStats> got = testing::RunOnce(*plain, **mode, prompts_[0], run);
    ASSERT_FALSE(got.ok()) << c.label;
    EXPECT_NE(got.status().message().find("no adapter"), std::string_view::npos) << got.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, RandomModelTest,
                         ::testing::Values(TinyArch::kQwen2, TinyArch::kQwen3),
                         [](const ::testing::TestParamInfo<TinyArch>& info) {
                           return info.param == TinyArch::kQwen3 ? "qwen3" : "qwen2";
                         });

// ---------------------------------------------------------------------------------------------
// The bundled models with their trained adapters.

struct BundledCase {
  std::string model;    // folder under models/
  std::string adapter;  // adapter folder inside it
  ModeCase mode;
};

class BundledTest : public ::testing::TestWithParam<BundledCase> {};

TEST_P(BundledTest, TrainedAdapterStaysExact) {
  const BundledCase& c = GetParam();
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/models/" + c.model;
  const std::string adapter_dir = dir + "/" + c.adapter;
  if (!std::filesystem::exists(adapter_dir + "/adapter_config.json")) {
    GTEST_SKIP() << "no adapter at " << adapter_dir;
  }
  absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<LoraAdapter> adapter = LoadLoraAdapter(adapter_dir, (*model)->config());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  (*model)->SetLoraAdapter(*std::move(adapter));
  const nlohmann::json greedy = testing::ReadJson(dir + "/fixtures/greedy.json");
  ASSERT_FALSE(greedy.is_discarded());
  std::vector<std::vector<int32_t>> prompts;
  for (const nlohmann::json& g : greedy["cases"]) {
    prompts.push_back(g["prompt_ids"].get<std::vector<int32_t>>());
  }
  const int new_tokens = greedy["new_tokens"].get<int>();
  ModeOptions with = c.mode.options;
  with.lora_drafts = true;
  const ModelConfig& config = (*model)->config();
  const Totals base = Compare(**model, config, c.mode.mode, c.mode.options, prompts, new_tokens);
  const Totals lora = Compare(**model, config, c.mode.mode, with, prompts, new_tokens);
  std::printf(
      "[ lora     ] %s on %s: TPF %.3f without %s, %.3f with (%lld / %lld drafts "
      "accepted without, %lld / %lld with; %zu prompts x %d tokens)\n",
      c.mode.label.c_str(), c.model.c_str(), base.Tpf(), c.adapter.c_str(), lora.Tpf(),
      static_cast<long long>(base.accepted), static_cast<long long>(base.drafted),
      static_cast<long long>(lora.accepted), static_cast<long long>(lora.drafted), prompts.size(),
      new_tokens);
  EXPECT_EQ(base.differing, 0);
  EXPECT_EQ(lora.differing, 0) << "with " << c.adapter;
  EXPECT_NE(base.accepted, lora.accepted) << "the adapter did not change the drafts";
}

std::vector<BundledCase> BundledCases() {
  const std::vector<ModeCase> modes = Cases();
  ModeCase self_spec = modes[1];
  self_spec.options.self_spec_draft_len = 0;  // the model's block size
  self_spec.label = "self_spec";
  ModeCase quadratic = modes[2];
  quadratic.options.self_spec_draft_len = 0;
  quadratic.label = "self_spec_quadratic";
  return {{"tandem-idlm", "risd-lora", modes[0]},
          {"tandem-target", "draft-lora", self_spec},
          {"tandem-target", "draft-lora", quadratic}};
}

INSTANTIATE_TEST_SUITE_P(Models, BundledTest, ::testing::ValuesIn(BundledCases()),
                         [](const ::testing::TestParamInfo<BundledCase>& info) {
                           return info.param.mode.mode;
                         });

}  // namespace
}  // namespace tandem
