// The verifier's request conversion: every field lands where the engine expects it, and bad
// input is refused with InvalidArgument naming the field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "services/verifier/verifier_service.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ToSequenceRequestTest : public ::testing::Test {
 protected:
  ToSequenceRequestTest() {
    config_.max_position_embeddings = 512;
    config_.vocab_size = 4096;
    defaults_.spec_gamma = 4;
    defaults_.jacobi_block_size = 16;
    request_.mutable_request()->set_prompt("def f(");
    request_.mutable_request()->set_max_tokens(8);
  }

  absl::StatusOr<SequenceRequest> Convert() {
    return ToSequenceRequest(request_, identity_, config_, defaults_);
  }
  void ExpectInvalid(std::string_view message) {
    absl::StatusOr<SequenceRequest> out = Convert();
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(out.status().message(), HasSubstr(message));
  }

  VerifierIdentity identity_{.model_id = "tandem-target", .worker_id = "w"};
  ModelConfig config_;
  ModeOptions defaults_;
  v1::VerifyRequest request_;
};

TEST_F(ToSequenceRequestTest, CopiesEveryField) {
  v1::GenerateRequest& r = *request_.mutable_request();
  r.set_model("tandem-target");
  r.set_request_id("req-1");
  r.set_mode("spec");
  r.mutable_sampling()->set_temperature(0.7f);
  r.mutable_sampling()->set_top_k(20);
  r.mutable_sampling()->set_top_p(0.9f);
  r.mutable_sampling()->set_seed(42);
  r.add_stop("\n\n");
  r.add_stop_token_ids(7);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_presence_penalty(0.5f);
  r.mutable_sampling()->set_frequency_penalty(0.25f);
  (*r.mutable_sampling()->mutable_logit_bias())[9] = -4.0f;
  (*r.mutable_sampling()->mutable_logit_bias())[3] = 1.0f;
  r.set_min_tokens(2);
  request_.add_committed_token_ids(11);
  request_.add_committed_token_ids(12);
  request_.set_drafter("127.0.0.1:9");
  request_.mutable_mode_options()->set_spec_gamma(6);
  absl::StatusOr<SequenceRequest> out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->request_id, "req-1");
  EXPECT_EQ(out->prompt, "def f(");
  EXPECT_EQ(out->mode, "spec");
  EXPECT_EQ(out->max_tokens, 8);
  EXPECT_FLOAT_EQ(out->sampling.temperature, 0.7f);
  EXPECT_EQ(out->sampling.top_k, 20);
  EXPECT_FLOAT_EQ(out->sampling.top_p, 0.9f);
  EXPECT_EQ(out->sampling.seed, 42u);
  EXPECT_THAT(out->stop_strings, ElementsAre("\n\n"));
  EXPECT_THAT(out->stop_token_ids, ElementsAre(7));
  EXPECT_TRUE(out->ignore_eos);
  EXPECT_FLOAT_EQ(out->adjust.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(out->adjust.frequency_penalty, 0.25f);
  EXPECT_FLOAT_EQ(out->adjust.repetition_penalty, 1.0f);  // 0 on the wire: off
  EXPECT_THAT(out->adjust.logit_bias,
              ElementsAre(std::pair<int32_t, float>{3, 1.0f}, std::pair<int32_t, float>{9, -4.0f}));
  EXPECT_EQ(out->adjust.min_tokens, 2);
  EXPECT_THAT(out->committed, ElementsAre(11, 12));
  EXPECT_EQ(out->drafter, "127.0.0.1:9");
  EXPECT_EQ(out->mode_options.spec_gamma, 6);
  EXPECT_TRUE(out->spec_gamma_pinned);  // named by the request: the engine does not choose
  EXPECT_EQ(out->mode_options.jacobi_block_size, 16);  // the default, untouched
}

TEST_F(ToSequenceRequestTest, GammaLeftToTheVerifierIsNotPinned) {
  absl::StatusOr<SequenceRequest> out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->mode_options.spec_gamma, 4);  // the verifier's default, its most per step
  EXPECT_FALSE(out->spec_gamma_pinned);
}

TEST_F(ToSequenceRequestTest, GammaMinusOneMeansArSteps) {
  request_.mutable_mode_options()->set_spec_gamma(-1);
  absl::StatusOr<SequenceRequest> out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->mode_options.spec_gamma, 0);
  request_.mutable_mode_options()->set_spec_gamma(-2);
  ExpectInvalid("spec_gamma");
}

TEST_F(ToSequenceRequestTest, NspIsdJacobiAndSimsdOptionsLandInModeOptions) {
  v1::ModeOptions& given = *request_.mutable_mode_options();
  given.set_nsp_block(4);
  given.set_nsp_tau(0.0f);  // optional: an explicit 0 is a value, not "the default"
  given.set_nsp_confidence("entropy");
  given.set_nsp_verify(true);
  given.set_nsp_quadratic(true);
  given.set_isd_stride(3);
  given.set_isd_tau(0.0f);
  given.set_isd_argmax_proposals(false);
  given.set_jacobi_spawn_ratio(0.25f);
  given.set_jacobi_pool_size(0);
  given.set_jacobi_candidates(3);
  given.set_jacobi_prompt_lookup(true);
  given.set_simsd_gamma(5);
  defaults_.nsp_tau = 0.9f;
  defaults_.isd_tau = 0.5f;
  absl::StatusOr<SequenceRequest> out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  const ModeOptions& o = out->mode_options;
  EXPECT_EQ(o.nsp_block, 4);
  EXPECT_FLOAT_EQ(o.nsp_tau, 0.0f);
  EXPECT_EQ(o.nsp_confidence, "entropy");
  EXPECT_TRUE(o.nsp_verify);
  EXPECT_TRUE(o.nsp_quadratic);
  EXPECT_EQ(o.isd_stride, 3);
  EXPECT_FLOAT_EQ(o.isd_tau, 0.0f);
  EXPECT_FALSE(o.isd_argmax_proposals);
  EXPECT_FLOAT_EQ(o.jacobi_spawn_ratio, 0.25f);
  EXPECT_EQ(o.jacobi_pool_size, 0);
  EXPECT_EQ(o.jacobi_candidates, 3);
  EXPECT_TRUE(o.jacobi_prompt_lookup);
  EXPECT_EQ(o.simsd_gamma, 5);

  // Unset fields keep the verifier's defaults.
  request_.clear_mode_options();
  out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FLOAT_EQ(out->mode_options.nsp_tau, 0.9f);
  EXPECT_FLOAT_EQ(out->mode_options.isd_tau, 0.5f);
  EXPECT_EQ(out->mode_options.nsp_confidence, "logit");
  EXPECT_TRUE(out->mode_options.isd_argmax_proposals);
  EXPECT_EQ(out->mode_options.simsd_gamma, 0);
}

TEST_F(ToSequenceRequestTest, RefusesBadModeOptionsNamingTheField) {
  v1::ModeOptions& given = *request_.mutable_mode_options();
  given.set_nsp_tau(1.5f);
  ExpectInvalid("nsp_tau");
  given.clear_nsp_tau();
  given.set_nsp_block(-1);
  ExpectInvalid("nsp_block");
  given.clear_nsp_block();
  given.set_nsp_confidence("vibes");
  ExpectInvalid("nsp_confidence");
  given.clear_nsp_confidence();
  given.set_isd_stride(1);
  ExpectInvalid("isd_stride");
  given.clear_isd_stride();
  given.set_isd_tau(-0.1f);
  ExpectInvalid("isd_tau");
  given.clear_isd_tau();
  given.set_jacobi_spawn_ratio(2.0f);
  ExpectInvalid("jacobi_spawn_ratio");
  given.clear_jacobi_spawn_ratio();
  given.set_jacobi_pool_size(-1);
  ExpectInvalid("jacobi_pool_size");
  given.clear_jacobi_pool_size();
  given.set_jacobi_candidates(-1);
  ExpectInvalid("jacobi_candidates");
  given.clear_jacobi_candidates();
  given.set_simsd_gamma(-3);
  ExpectInvalid("simsd_gamma");
  given.clear_simsd_gamma();
  // Values that were taken for "the model's" or passed as numbers before.
  given.set_isd_tau(std::numeric_limits<float>::infinity());
  ExpectInvalid("isd_tau must be a finite number");
  given.clear_isd_tau();
  given.set_self_spec_draft_len(-1);
  ExpectInvalid("self_spec_draft_len must be positive");
  given.set_self_spec_draft_len(0);
  given.set_diffusion_block_size(-1);
  ExpectInvalid("diffusion_block_size must be positive");
  given.set_diffusion_block_size(0);
  EXPECT_TRUE(Convert().ok());
}

TEST_F(ToSequenceRequestTest, ChatAndTokenInputs) {
  v1::ChatMessage* message = request_.mutable_request()->mutable_chat()->add_messages();
  message->set_role("user");
  message->set_content("hi");
  absl::StatusOr<SequenceRequest> out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->chat.size(), 1u);
  EXPECT_EQ(out->chat[0].content, "hi");
  EXPECT_TRUE(out->prompt.empty());

  request_.mutable_request()->mutable_token_ids()->add_ids(5);
  out = Convert();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->prompt_ids, ElementsAre(5));
}

TEST_F(ToSequenceRequestTest, UnseededSamplingGetsASeed) {
  request_.mutable_request()->mutable_sampling()->set_temperature(1.0f);
  absl::StatusOr<SequenceRequest> out = Convert();
  ASSERT_TRUE(out.ok());
  EXPECT_NE(out->sampling.seed, 0u);
  EXPECT_FLOAT_EQ(out->sampling.top_p, 1.0f);  // 0 on the wire = off
}

TEST_F(ToSequenceRequestTest, RefusesBadInput) {
  request_.mutable_request()->set_prompt("");
  ExpectInvalid("prompt is empty");
  request_.mutable_request()->clear_prompt();
  ExpectInvalid("no input");
  request_.mutable_request()->mutable_chat();
  ExpectInvalid("chat has no messages");
  v1::ChatMessage* message = request_.mutable_request()->mutable_chat()->add_messages();
  message->set_role("robot");
  ExpectInvalid("role");
  request_.mutable_request()->mutable_token_ids();
  ExpectInvalid("token_ids is empty");
  request_.mutable_request()->set_prompt("x");

  request_.mutable_request()->set_model("llama-70b");
  ExpectInvalid("unknown model 'llama-70b'");
  request_.mutable_request()->set_model("");

  request_.mutable_request()->set_max_tokens(0);
  ExpectInvalid("max_tokens must be positive");
  request_.mutable_request()->set_max_tokens(513);
  ExpectInvalid("exceeds the model's context of 512");
  request_.mutable_request()->set_max_tokens(8);

  v1::SamplingParams* sampling = request_.mutable_request()->mutable_sampling();
  sampling->set_temperature(-1);
  ExpectInvalid("temperature");
  sampling->set_temperature(std::numeric_limits<float>::infinity());
  ExpectInvalid("temperature must be a finite number");
  sampling->set_temperature(std::numeric_limits<float>::quiet_NaN());
  ExpectInvalid("temperature must be a finite number");
  sampling->set_temperature(1);
  sampling->set_top_k(-3);
  ExpectInvalid("top_k");
  sampling->set_top_k(-1);  // off, as over HTTP
  absl::StatusOr<SequenceRequest> off = Convert();
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->sampling.top_k, 0);
  sampling->set_top_k(0);
  sampling->set_top_p(1.5f);
  ExpectInvalid("top_p");
  sampling->set_top_p(1);
  sampling->set_min_p(-0.1f);
  ExpectInvalid("min_p");
  sampling->set_min_p(0);
  request_.mutable_request()->add_stop("");
  ExpectInvalid("stop strings");
}

TEST(ToGrpcStatusTest, KeepsCodeAndMessage) {
  const grpc::Status status = ToGrpcStatus(absl::InvalidArgumentError("bad"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "bad");
}

}  // namespace
}  // namespace tandem
