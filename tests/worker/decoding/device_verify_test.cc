// Draft verification on the model (PlanDeviceVerify: sample requests with drafts, no logits)
// against the host's VerifyDraft over downloaded logits, for every mode that verifies draft runs
// that way (spec, self_spec, nsp with verification): the same tokens and the same acceptance,
// greedy and under seeded sampling.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/drafter.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/nsp.h"
#include "worker/decoding/self_spec.h"
#include "worker/decoding/spec.h"

namespace tandem {
namespace {

using testing::TinyArch;

constexpr int kContext = 128;

// Runs `inner` either as planned (the model verifies the drafts) or with every plan's sample
// requests dropped and the logits asked for (the host verifies them), and checks that the
// planned device steps really came back without logits.
class Verified : public DecodingMode {
 public:
  Verified(std::unique_ptr<DecodingMode> inner, bool on_host)
      : inner_(std::move(inner)), on_host_(on_host) {}

  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  const DrafterStats* drafter_stats() const override { return inner_->drafter_stats(); }
  bool last_plan_wanted_drafts() const override { return inner_->last_plan_wanted_drafts(); }

  StepPlan Plan(const DecodeState& state) override {
    StepPlan plan = inner_->Plan(state);
    if (on_host_) {
      plan.samples.clear();
      plan.return_logits = true;
    }
    for (const SampleRequest& r : plan.samples) device_drafts_ += r.draft >= 0 ? 1 : 0;
    return plan;
  }

  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    if (!plan.samples.empty() && !plan.return_logits) {
      EXPECT_TRUE(out.logits.empty());
      EXPECT_EQ(out.tokens.size(), plan.samples.size());
      EXPECT_EQ(out.accepted.size(), plan.samples.size());
    }
    if (on_host_) {
      EXPECT_TRUE(out.tokens.empty());
    }
    return inner_->Consume(state, plan, out);
  }

  int device_drafts() const { return device_drafts_; }

 private:
  std::unique_ptr<DecodingMode> inner_;
  bool on_host_;
  int device_drafts_ = 0;
};

enum class Mode { kSpec, kSelfSpec, kNsp };

std::string ModeName(Mode m) {
  switch (m) {
    case Mode::kSpec:
      return "Spec";
    case Mode::kSelfSpec:
      return "SelfSpec";
    case Mode::kNsp:
      return "Nsp";
  }
  return "";
}

class DeviceVerifyTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    target_ = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
    // A drafter that agrees with the target often but not always.
    drafter_ = testing::PerturbedModel(*target_, 3, 0.05f);
  }

  std::unique_ptr<DecodingMode> Make() {
    const int vocab = target_->config().vocab_size;
    switch (GetParam()) {
      case Mode::kSpec:
        return std::make_unique<SpecMode>(
            3, std::make_unique<InProcessArDrafter>(drafter_.get(), kContext), vocab, kContext);
      case Mode::kSelfSpec:
        return std::make_unique<SelfSpecMode>(
            SelfSpecOptions{.draft_len = 4, .mask_token = vocab - 1}, vocab, kContext);
      case Mode::kNsp:
        return std::make_unique<NspMode>(
            NspOptions{.block_size = 4, .mask_token = vocab - 1, .tau = 0.5f, .verify = true},
            vocab, kContext);
    }
    return nullptr;
  }

  struct Outcome {
    RunStats stats;
    int device_drafts = 0;
  };

  Outcome Run(std::span<const int32_t> prompt, const SamplingParams& sampling, bool on_host) {
    Verified mode(Make(), on_host);
    RunOptions run{.max_tokens = 40, .sampling = sampling};
    absl::StatusOr<RunStats> stats = testing::RunOnce(*target_, mode, prompt, run);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return {stats.ok() ? *stats : RunStats{}, mode.device_drafts()};
  }

  std::unique_ptr<Transformer> target_, drafter_;
};

TEST_P(DeviceVerifyTest, SameOutputAsHostVerification) {
  const std::vector<SamplingParams> settings = {
      {},
      {.temperature = 0.8f, .seed = 1},
      {.temperature = 1.2f, .seed = 99},
      {.temperature = 0.9f, .top_k = 8, .top_p = 0.9f, .seed = 12345},
  };
  int drafted = 0, accepted = 0, device_drafts = 0;
  const auto prompts = testing::TestPrompts(target_->config().vocab_size, 4, 17);
  for (size_t s = 0; s < settings.size(); ++s) {
    for (size_t p = 0; p < prompts.size(); ++p) {
      SCOPED_TRACE(::testing::Message() << "setting " << s << ", prompt " << p);
      const Outcome device = Run(prompts[p], settings[s], false);
      const Outcome host = Run(prompts[p], settings[s], true);
      EXPECT_EQ(device.stats.tokens, host.stats.tokens);
      EXPECT_EQ(device.stats.forwards, host.stats.forwards);
      EXPECT_EQ(device.stats.drafted, host.stats.drafted);
      EXPECT_EQ(device.stats.accepted, host.stats.accepted);
      EXPECT_EQ(host.device_drafts, 0);
      drafted += device.stats.drafted;
      accepted += device.stats.accepted;
      device_drafts += device.device_drafts;
    }
  }
  // The comparison means something: drafts were verified on the model, and both verdicts
  // occurred.
  EXPECT_GT(device_drafts, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

INSTANTIATE_TEST_SUITE_P(Modes, DeviceVerifyTest,
                         ::testing::Values(Mode::kSpec, Mode::kSelfSpec, Mode::kNsp),
                         [](const auto& info) { return ModeName(info.param); });

}  // namespace
}  // namespace tandem
