// nsp on the bundled SDLM model (models/tandem-sdlm, trained by tools/train/sdlm.py) over the
// held-out prompts of its fixtures/greedy.json: the self-speculative variants (linear and
// quadratic) reproduce AR greedy token for token (also when a stop token ends the sequence inside
// a step), the quadratic one in fewer forwards, and longest prefix decoding commits more than one
// token per forward. Skips when the model is absent.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/runner.h"

namespace tandem {
namespace {

const std::string kSdlmDir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-sdlm";

class SdlmBundledTest : public ::testing::Test {
 protected:
  // The model and the AR decodes are loaded once for the suite.
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kSdlmDir + "/config.json")) return;
    absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Load(kSdlmDir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    std::ifstream in(kSdlmDir + "/fixtures/greedy.json");
    const nlohmann::json greedy = nlohmann::json::parse(in, nullptr, false);
    ASSERT_FALSE(greedy.is_discarded());
    new_tokens_ = greedy["new_tokens"].get<int>();
    for (const nlohmann::json& c : greedy["cases"]) {
      prompts_.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
      ArMode ar(model_->config().vocab_size);
      absl::StatusOr<RunStats> r = Decode(ar, prompts_.back());
      ASSERT_TRUE(r.ok()) << r.status();
      ar_.push_back(r->tokens);
    }
  }

  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "no bundled model at " << kSdlmDir;
    ASSERT_EQ(ar_.size(), prompts_.size());
  }

  static absl::StatusOr<RunStats> Decode(DecodingMode& mode, std::span<const int32_t> prompt,
                                         std::optional<int32_t> stop = {}) {
    RunOptions options;
    options.max_tokens = new_tokens_;
    if (stop) options.on_token = [t = *stop](int32_t token) { return token == t; };
    KvCache kv(model_->KvOptions(static_cast<int64_t>(prompt.size()) + new_tokens_ + 64));
    return RunSequence(*model_, kv, 1, mode, prompt, options);
  }

  static std::unique_ptr<DecodingMode> Nsp(const ModeOptions& options) {
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode("nsp", options, model_->config(), SamplingParams{});
    EXPECT_TRUE(mode.ok()) << mode.status();
    return mode.ok() ? std::move(*mode) : nullptr;
  }

  // A stop token from the middle of prompt p's AR output: nsp with `options` gives the same
  // prefix, ended there, as AR does.
  static void ExpectAStopEndsItLikeAr(const ModeOptions& options, size_t p) {
    const int32_t stop = ar_[p][ar_[p].size() / 2];
    std::unique_ptr<DecodingMode> stopped = Nsp(options);
    ASSERT_NE(stopped, nullptr);
    absl::StatusOr<RunStats> got = Decode(*stopped, prompts_[p], stop);
    ArMode ar(model_->config().vocab_size);
    absl::StatusOr<RunStats> want = Decode(ar, prompts_[p], stop);
    ASSERT_TRUE(got.ok() && want.ok());
    EXPECT_EQ(got->tokens, want->tokens) << "prompt " << p << " stop " << stop;
    EXPECT_EQ(got->finish, want->finish);
  }

  static inline Transformer* model_ = nullptr;  // for the whole binary
  static inline int new_tokens_ = 0;
  static inline std::vector<std::vector<int32_t>> prompts_;
  static inline std::vector<std::vector<int32_t>> ar_;
};

TEST_F(SdlmBundledTest, ConfigDescribesTheNspPathway) {
  EXPECT_EQ(model_->config().diffusion.block_size, 4);
  ASSERT_TRUE(model_->config().diffusion.mask_token_id.has_value());
  std::ifstream in(kSdlmDir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["tandem"]["nsp"]["prediction"], "shifted");
  const std::vector<std::string> modes = config["tandem"]["modes"];
  EXPECT_NE(std::find(modes.begin(), modes.end(), "nsp"), modes.end());
}

TEST_F(SdlmBundledTest, VerifiedNspEqualsArGreedy) {
  ModeOptions options;
  options.nsp_verify = true;
  int64_t tokens = 0, forwards = 0, accepted = 0, steps = 0;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    std::unique_ptr<DecodingMode> mode = Nsp(options);
    ASSERT_NE(mode, nullptr);
    EXPECT_TRUE(mode->lossless());
    absl::StatusOr<RunStats> r = Decode(*mode, prompts_[p]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->tokens, ar_[p]) << "prompt " << p;
    tokens += static_cast<int64_t>(r->tokens.size());
    forwards += r->forwards;
    accepted += r->accepted;
    steps += r->steps_with_drafts;
    ExpectAStopEndsItLikeAr(options, p);
  }
  std::printf("[ tpf      ] tandem-sdlm, nsp verify: %.3f tokens/forward, %.2f tokens per cycle\n",
              static_cast<double>(tokens) / forwards,
              steps > 0 ? static_cast<double>(accepted + steps) / steps : 0.0);
  EXPECT_GT(accepted, steps) << "no cycle accepted more than its first draft";
}

// The quadratic variant verifies and drafts in one forward: the same AR output, and more tokens
// per forward than the linear variant's draft-then-verify cycle of two.
TEST_F(SdlmBundledTest, QuadraticNspEqualsArGreedyInFewerForwards) {
  int64_t tokens = 0, linear_forwards = 0, quadratic_forwards = 0;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    ModeOptions linear_options;
    linear_options.nsp_verify = true;
    std::unique_ptr<DecodingMode> linear = Nsp(linear_options);
    ModeOptions quadratic_options;
    quadratic_options.nsp_quadratic = true;
    std::unique_ptr<DecodingMode> quadratic = Nsp(quadratic_options);
    ASSERT_NE(linear, nullptr);
    ASSERT_NE(quadratic, nullptr);
    EXPECT_TRUE(quadratic->lossless());
    absl::StatusOr<RunStats> l = Decode(*linear, prompts_[p]);
    absl::StatusOr<RunStats> q = Decode(*quadratic, prompts_[p]);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(q->tokens, ar_[p]) << "prompt " << p;
    tokens += static_cast<int64_t>(q->tokens.size());
    linear_forwards += l->forwards;
    quadratic_forwards += q->forwards;
    ExpectAStopEndsItLikeAr(quadratic_options, p);
  }
  const double linear_tpf = static_cast<double>(tokens) / linear_forwards;
  const double quadratic_tpf = static_cast<double>(tokens) / quadratic_forwards;
  std::printf("[ tpf      ] tandem-sdlm, nsp verify %.3f, nsp quadratic %.3f tokens/forward\n",
              linear_tpf, quadratic_tpf);
  EXPECT_GT(quadratic_tpf, linear_tpf);
}

TEST_F(SdlmBundledTest, LongestPrefixDecodingCommitsSeveralTokensPerForward) {
  for (float tau : {0.9f, 0.5f}) {
    for (const char* confidence : {"logit", "entropy"}) {
      if (tau > 0.5f && std::string_view(confidence) == "entropy") continue;
      ModeOptions options;
      options.nsp_tau = tau;
      options.nsp_confidence = confidence;
      int64_t tokens = 0, forwards = 0, equal = 0;
      for (size_t p = 0; p < prompts_.size(); ++p) {
        std::unique_ptr<DecodingMode> mode = Nsp(options);
        ASSERT_NE(mode, nullptr);
        EXPECT_FALSE(mode->lossless());
        absl::StatusOr<RunStats> r = Decode(*mode, prompts_[p]);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->tokens.size(), static_cast<size_t>(new_tokens_));
        tokens += static_cast<int64_t>(r->tokens.size());
        forwards += r->forwards;
        for (size_t i = 0; i < r->tokens.size(); ++i) equal += r->tokens[i] == ar_[p][i];
      }
      const double tpf = static_cast<double>(tokens) / forwards;
      std::printf(
          "[ tpf      ] tandem-sdlm, nsp %s tau=%.1f: %.3f tokens/forward, %.0f%% of "
          "tokens equal to AR greedy's\n",
          confidence, tau, tpf, 100.0 * equal / tokens);
      // A 4M-parameter model is seldom 90% sure of a whole run of tokens; at 0.5 it is.
      if (tau <= 0.5f) {
        EXPECT_GT(tpf, 1.0) << confidence << " tau " << tau;
      }
      EXPECT_GE(tpf, 1.0);
    }
  }
}

}  // namespace
}  // namespace tandem
