// What the router refuses before it spends a verifier on a request.
#include "router/request_check.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

const ModelDescription kModel = {.id = "m", .modes = {"ar", "spec"}, .max_context = 512};

RouterRequest Good() {
  RouterRequest r;
  r.input = RouterRequest::Input::kPrompt;
  r.input_size = 5;
  r.model = "m";
  r.max_tokens = 16;
  r.top_p = 1;
  return r;
}

// The error message of `request`, "" when it passes.
std::string Check(const RouterRequest& request) {
  absl::Status status = CheckRequest(request, kModel);
  if (status.ok()) return "";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(RequestCheckTest, AcceptsAGoodRequestInEveryModeSpelling) {
  for (const char* mode : {"", "auto", "ar", "spec"}) {
    RouterRequest r = Good();
    r.mode = mode;
    EXPECT_EQ(Check(r), "") << mode;
  }
  RouterRequest r = Good();
  r.max_tokens = 511;
  r.temperature = 1.5f;
  r.top_k = 40;
  r.top_p = 0;
  r.min_p = 1;
  EXPECT_EQ(Check(r), "");
}

TEST(RequestCheckTest, RefusesMissingOrEmptyInput) {
  RouterRequest r = Good();
  r.input = RouterRequest::Input::kNone;
  EXPECT_EQ(Check(r), "the request has no input: set prompt, chat or token_ids");
  r = Good();
  r.input_size = 0;
  EXPECT_EQ(Check(r), "prompt is empty");
  r.input = RouterRequest::Input::kChat;
  EXPECT_EQ(Check(r), "chat has no messages");
  r.input = RouterRequest::Input::kTokenIds;
  EXPECT_EQ(Check(r), "token_ids is empty");
}

TEST(RequestCheckTest, RefusesAModeTheModelDoesNotServe) {
  RouterRequest r = Good();
  r.mode = "diffusion";
  EXPECT_EQ(Check(r), "unknown mode 'diffusion' for model 'm'; it serves: auto, ar, spec");
}

TEST(RequestCheckTest, RefusesMaxTokensOutsideTheContext) {
  RouterRequest r = Good();
  r.max_tokens = 0;
  EXPECT_EQ(Check(r), "max_tokens must be at least 1 (0 only with echo), got 0");
  r.echo = true;  // scoring a prompt
  EXPECT_EQ(Check(r), "");
  r.max_tokens = -4;
  EXPECT_EQ(Check(r), "max_tokens must be at least 1 (0 only with echo), got -4");
  r.echo = false;
  r.max_tokens = 512;
  EXPECT_NE(Check(r).find("max_tokens 512 does not fit the context of model 'm' (512 tokens"),
            std::string::npos);
}

TEST(RequestCheckTest, RefusesSamplingOutOfRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float t : {-0.1f, nan, inf}) {
    RouterRequest r = Good();
    r.temperature = t;
    EXPECT_NE(Check(r).find("sampling.temperature"), std::string::npos) << t;
  }
  RouterRequest r = Good();
  r.top_k = -2;
  EXPECT_EQ(Check(r), "sampling.top_k must be >= 0 (0 or -1 = off), got -2");
  r.top_k = -1;  // off, as over HTTP (vLLM's convention)
  EXPECT_EQ(Check(r), "");
  for (float p : {-0.5f, 1.5f, nan}) {
    r = Good();
    r.top_p = p;
    EXPECT_NE(Check(r).find("sampling.top_p must be within [0, 1]"), std::string::npos) << p;
    r = Good();
    r.min_p = p;
    EXPECT_NE(Check(r).find("sampling.min_p must be within [0, 1]"), std::string::npos) << p;
  }
}

TEST(RequestCheckTest, RefusesNegativeStopTokenIds) {
  RouterRequest r = Good();
  r.stop_token_ids = {2, 0};
  EXPECT_EQ(Check(r), "");
  r.stop_token_ids = {2, -1, 1 << 30};  // ids past the vocabulary are the verifier's to refuse
  EXPECT_EQ(Check(r), "stop_token_ids must hold token ids (>= 0), got -1");
}

TEST(RequestCheckTest, RefusesLogitAdjustmentsPastTheirBounds) {
  RouterRequest r = Good();
  r.adjust = {.presence_penalty = -2, .frequency_penalty = 2, .repetition_penalty = 10};
  r.adjust.logit_bias = {{1 << 30, 100}};  // ids past the vocabulary are the verifier's to refuse
  r.adjust.min_tokens = 16;
  EXPECT_EQ(Check(r), "");
  r.adjust.min_tokens = 17;
  EXPECT_EQ(Check(r), "min_tokens 17 exceeds max_tokens 16");
  r = Good();
  r.adjust.presence_penalty = 2.5f;
  EXPECT_NE(Check(r).find("presence_penalty must be within"), std::string::npos);
  r = Good();
  r.adjust.logit_bias = {{-1, 1}};
  EXPECT_NE(Check(r).find("logit_bias names token -1"), std::string::npos);
}

}  // namespace
}  // namespace tandem::router
