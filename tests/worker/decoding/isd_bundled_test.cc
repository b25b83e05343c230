// `isd` on the bundled I-DLM (models/tandem-idlm): greedy output equals `ar` token for token on
// the held-out prompts of fixtures/greedy.json at strides 2 and 4, also when a stop token lands
// inside a step's run of accepted drafts and at max_tokens boundaries around the stride. Prints
// the tokens per forward and the per-draft acceptance.
// Skipped when the model folder is absent.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/decoding/bundled_target.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/runner.h"

namespace tandem {
namespace {

const std::string kIdlmDir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-idlm";

// Keeps the tokens each step appended and the (drafted, accepted) of each step with drafts.
class StepRecorder : public DecodingMode {
 public:
  explicit StepRecorder(std::unique_ptr<DecodingMode> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  StepPlan Plan(const DecodeState& state) override { return inner_->Plan(state); }
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    absl::StatusOr<StepResult> r = inner_->Consume(state, plan, out);
    if (r.ok()) {
      steps.push_back(static_cast<int>(r->append.size()));
      if (r->drafted > 0) verified.push_back({r->drafted, r->accepted});
    }
    return r;
  }
  std::vector<int> steps;
  std::vector<std::pair<int, int>> verified;

 private:
  std::unique_ptr<DecodingMode> inner_;
};

class IsdBundledTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kIdlmDir + "/config.json")) {
      GTEST_SKIP() << "no bundled model at " << kIdlmDir;
    }
    absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Load(kIdlmDir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    ASSERT_TRUE(model_->config().diffusion.mask_token_id.has_value());
    const nlohmann::json greedy = testing::ReadJson(kIdlmDir + "/fixtures/greedy.json");
    ASSERT_FALSE(greedy.is_discarded());
    new_tokens_ = greedy["new_tokens"].get<int>();
    for (const nlohmann::json& c : greedy["cases"]) {
      prompts_.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
      expected_.push_back(c["continuation_ids"].get<std::vector<int32_t>>());
    }
    ASSERT_FALSE(prompts_.empty());
  }

  absl::StatusOr<RunStats> Decode(DecodingMode& mode, std::span<const int32_t> prompt,
                                  int max_tokens, std::optional<int32_t> stop = {}) {
    RunOptions options;
    options.max_tokens = max_tokens;
    if (stop) options.on_token = [t = *stop](int32_t token) { return token == t; };
    KvCache kv(model_->KvOptions(static_cast<int64_t>(prompt.size()) + max_tokens + 64));
    return RunSequence(*model_, kv, 1, mode, prompt, options);
  }

  StepRecorder Isd(int stride) {
    ModeOptions options;
    options.isd_stride = stride;
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode("isd", options, model_->config(), SamplingParams{});
    EXPECT_TRUE(mode.ok()) << mode.status();
    return StepRecorder(std::move(*mode));
  }

  std::unique_ptr<Transformer> model_;
  int new_tokens_ = 0;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::vector<int32_t>> expected_;  // transformers' greedy continuations
};

TEST_F(IsdBundledTest, GreedyEqualsArAndTheFixture) {
  for (size_t p = 0; p < prompts_.size(); ++p) {
    ArMode ar_mode(model_->config().vocab_size);
    absl::StatusOr<RunStats> ar = Decode(ar_mode, prompts_[p], new_tokens_);
    ASSERT_TRUE(ar.ok()) << ar.status();
    EXPECT_EQ(ar->tokens, expected_[p]) << "ar vs the fixture, prompt " << p;
  }
  // Strides 3 and 5 run in exactness_test; the engine bench measures all four.
  for (int stride : {2, 4}) {
    int64_t tokens = 0, forwards = 0;
    std::vector<int64_t> reached(stride - 1, 0), accepted(stride - 1, 0);
    for (size_t p = 0; p < prompts_.size(); ++p) {
      StepRecorder isd = Isd(stride);
      absl::StatusOr<RunStats> got = Decode(isd, prompts_[p], new_tokens_);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->tokens, expected_[p]) << "stride " << stride << ", prompt " << p;
      tokens += static_cast<int64_t>(got->tokens.size());
      forwards += got->forwards;
      for (const auto& [drafted, acc] : isd.verified) {
        for (int k = 0; k < drafted && k <= acc; ++k) {
          ++reached[k];
          if (k < acc) ++accepted[k];
        }
      }
    }
    std::printf(
        "[ isd      ] N=%d: %.3f tokens/forward (%lld tokens, %lld forwards); draft "
        "acceptance by position:",
        stride, static_cast<double>(tokens) / forwards, static_cast<long long>(tokens),
        static_cast<long long>(forwards));
    for (int k = 0; k < stride - 1; ++k) {
      std::printf(" %.3f", reached[k] > 0 ? static_cast<double>(accepted[k]) / reached[k] : 0.0);
    }
    std::printf("\n");
    // The trained mask pathway is not vacuous: its first drafts are often accepted.
    EXPECT_GT(accepted[0], reached[0] / 5) << "stride " << stride;
  }
}

TEST_F(IsdBundledTest, StopTokensAndMaxTokensInsideAcceptedRuns) {
  constexpr int kStride = 4;
  int stops_inside_steps = 0;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    // Stop tokens (EOS stand-ins) that first occur before the last token of a multi-token
    // step of the unstopped decode, at most two per prompt.
    StepRecorder probe = Isd(kStride);
    absl::StatusOr<RunStats> full = Decode(probe, prompts_[p], new_tokens_);
    ASSERT_TRUE(full.ok()) << full.status();
    std::vector<int32_t> stops;
    size_t start = 0;
    for (int n : probe.steps) {
      for (size_t i = start; i + 1 < start + n && stops.size() < 2; ++i) {
        const int32_t t = full->tokens[i];
        if (std::find(full->tokens.begin(), full->tokens.end(), t) - full->tokens.begin() ==
            static_cast<ptrdiff_t>(i)) {
          stops.push_back(t);
        }
      }
      start += n;
    }
    for (int32_t stop : stops) {
      ArMode ar_stop(model_->config().vocab_size);
      absl::StatusOr<RunStats> want = Decode(ar_stop, prompts_[p], new_tokens_, stop);
      StepRecorder isd = Isd(kStride);
      absl::StatusOr<RunStats> got = Decode(isd, prompts_[p], new_tokens_, stop);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(got->tokens, want->tokens) << "prompt " << p << ", stop " << stop;
      EXPECT_EQ(got->finish, want->finish) << "prompt " << p << ", stop " << stop;
      size_t seen = 0;
      for (int n : isd.steps) {
        seen += n;
        if (seen >= got->tokens.size()) {
          stops_inside_steps += seen > got->tokens.size();
          break;
        }
      }
    }
    for (int limit : {1, kStride, kStride + 1, 2 * kStride + 1}) {
      if (p >= 4) break;
      ArMode ar_limit(model_->config().vocab_size);
      StepRecorder isd = Isd(kStride);
      absl::StatusOr<RunStats> want = Decode(ar_limit, prompts_[p], limit);
      absl::StatusOr<RunStats> got = Decode(isd, prompts_[p], limit);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(got->tokens, want->tokens) << "prompt " << p << ", max_tokens " << limit;
    }
  }
  std::printf("[ isd      ] %d stop tokens fell inside a multi-token step\n", stops_inside_steps);
  EXPECT_GT(stops_inside_steps, 0);
}

}  // namespace
}  // namespace tandem
