#include "services/common/metrics.h"

#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The value of the sample line that starts with `series` (name and labels as exported), or -1.
double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.substr(0, series.size()) != series || line.size() <= series.size() ||
        line[series.size()] != ' ') {
      continue;
    }
    double value = 0;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

std::string Type(const std::string& name, const std::string& type) {
  return absl::StrCat("# TYPE ", name, " ", type, "\n");
}

TEST(ServiceMetricsTest, VerifierExportsItsFamiliesWithTheirTypes) {
  ServiceMetrics metrics(MetricsRole::kVerifier);
  RequestRecorder request(&metrics, "spec");
  request.OnChunk(2);
  request.OnChunk(3);
  request.Finish(absl::StatusCode::kOk, /*forwards=*/2);
  metrics.ObserveStep(0.01, 12);
  metrics.ObserveDraftVerified("spec", 4, 2);
  metrics.AddPreemptions(1);
  const std::string text = metrics.TextFormat();
  EXPECT_THAT(text, HasSubstr(Type("tandem_build_info", "gauge")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_requests_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_generated_tokens_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_time_to_first_token_seconds", "histogram")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_inter_token_latency_seconds", "histogram")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_request_duration_seconds", "histogram")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_queue_depth", "gauge")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_running_sequences", "gauge")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_kv_usage_ratio", "gauge")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_preemptions_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_step_duration_seconds", "histogram")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_batch_tokens", "histogram")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_tokens_per_forward", "histogram")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_drafts_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_draft_tokens_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_accepted_tokens_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_accepted_position_total", "counter")));
  EXPECT_THAT(text, HasSubstr(Type("tandem_drafter_fallbacks_total", "counter")));
  // Router- and drafter-only families stay out.
  EXPECT_THAT(text, Not(HasSubstr("tandem_worker_up")));
  EXPECT_THAT(text, Not(HasSubstr("tandem_drafter_sessions")));

  EXPECT_EQ(Sample(text, R"(tandem_requests_total{service="verifier",mode="spec",status="OK"})"),
            1);
  EXPECT_EQ(Sample(text, R"(tandem_generated_tokens_total{service="verifier",mode="spec"})"), 5);
  EXPECT_EQ(
      Sample(text, R"(tandem_time_to_first_token_seconds_count{service="verifier",mode="spec"})"),
      1);
  // The second chunk's gap is observed once per token.
  EXPECT_EQ(
      Sample(text, R"(tandem_inter_token_latency_seconds_count{service="verifier",mode="spec"})"),
      3);
  EXPECT_EQ(Sample(text, R"(tandem_tokens_per_forward_sum{service="verifier",mode="spec"})"), 2.5);
  EXPECT_EQ(Sample(text, R"(tandem_draft_tokens_total{service="verifier",mode="spec"})"), 4);
  EXPECT_EQ(Sample(text, R"(tandem_accepted_tokens_total{service="verifier",mode="spec"})"), 2);
  EXPECT_EQ(
      Sample(text,
             R"(tandem_accepted_position_total{service="verifier",mode="spec",position="1"})"),
      1);
  EXPECT_EQ(
      Sample(text,
             R"(tandem_accepted_position_total{service="verifier",mode="spec",position="2"})"),
      -1);
  EXPECT_EQ(Sample(text, R"(tandem_batch_tokens_sum{service="verifier"})"), 12);
  EXPECT_EQ(Sample(text, R"(tandem_drafter_fallbacks_total{service="verifier",reason="late"})"), 0);
}

TEST(ServiceMetricsTest, CountersIncreaseAndFailuresCarryTheirCode) {
  ServiceMetrics metrics(MetricsRole::kRouter);
  const std::string ok = R"(tandem_requests_total{service="router",mode="ar",status="OK"})";
  for (int i = 1; i <= 3; ++i) {
    RequestRecorder request(&metrics, "ar");
    request.OnChunk(1);
    request.Finish(absl::StatusCode::kOk);
    request.Finish(absl::StatusCode::kInternal);  // only the first outcome counts
    EXPECT_EQ(Sample(metrics.TextFormat(), ok), i);
  }
  RequestRecorder rejected(&metrics, "unknown");
  rejected.Finish(absl::StatusCode::kInvalidArgument);
  const std::string text = metrics.TextFormat();
  EXPECT_EQ(
      Sample(text,
             R"(tandem_requests_total{service="router",mode="unknown",status="INVALID_ARGUMENT"})"),
      1);
  EXPECT_EQ(Sample(text, R"(tandem_requests_total{service="router",mode="ar",status="INTERNAL"})"),
            -1);
  // Only requests that ended OK have a duration.
  EXPECT_EQ(Sample(text, R"(tandem_request_duration_seconds_count{service="router",mode="ar"})"),
            3);
  EXPECT_EQ(
      Sample(text, R"(tandem_request_duration_seconds_count{service="router",mode="unknown"})"),
      -1);
  EXPECT_EQ(Sample(text, R"(tandem_migrations_total{service="router",reason="verifier_failed"})"),
            0);
}

TEST(ServiceMetricsTest, HiddenTransportStreamsStartAtZeroOnVerifierAndDrafter) {
  ServiceMetrics drafter(MetricsRole::kDrafter);
  drafter.AddHiddenTransportStream("nccl");
  std::string text = drafter.TextFormat();
  EXPECT_THAT(text, HasSubstr(Type("tandem_hidden_transport_streams_total", "counter")));
  EXPECT_EQ(
      Sample(text, R"(tandem_hidden_transport_streams_total{service="drafter",transport="nccl"})"),
      1);
  EXPECT_EQ(
      Sample(text, R"(tandem_hidden_transport_streams_total{service="drafter",transport="bytes"})"),
      0);
  ServiceMetrics verifier(MetricsRole::kVerifier);
  text = verifier.TextFormat();
  EXPECT_EQ(
      Sample(text,
             R"(tandem_hidden_transport_streams_total{service="verifier",transport="failed"})"),
      0);
  ServiceMetrics router(MetricsRole::kRouter);
  router.AddHiddenTransportStream("bytes");  // not a router family: ignored
  EXPECT_THAT(router.TextFormat(), Not(HasSubstr("tandem_hidden_transport_streams_total")));
}

TEST(ServiceMetricsTest, DraftPositionsAreCapped) {
  ServiceMetrics metrics(MetricsRole::kVerifier);
  metrics.ObserveDraftVerified("spec", 20, 20);
  const std::string text = metrics.TextFormat();
  EXPECT_EQ(
      Sample(text,
             R"(tandem_accepted_position_total{service="verifier",mode="spec",position="15"})"),
      5);
  EXPECT_EQ(
      Sample(text,
             R"(tandem_accepted_position_total{service="verifier",mode="spec",position="16"})"),
      -1);
}

TEST(ServiceMetricsTest, ScrapeHookRunsBeforeEachScrape) {
  ServiceMetrics metrics(MetricsRole::kRouter);
  int scrapes = 0;
  metrics.SetScrapeHook([&scrapes](ServiceMetrics& m) {
    ++scrapes;
    m.SetRunningSequences(scrapes);
    m.SetWorkerUp("10.0.0.1:7000", "verifier", scrapes % 2 == 1);
  });
  std::string text = metrics.TextFormat();
  EXPECT_EQ(Sample(text, R"(tandem_running_sequences{service="router"})"), 1);
  EXPECT_EQ(
      Sample(text, R"(tandem_worker_up{service="router",role="verifier",worker="10.0.0.1:7000"})"),
      1);
  text = metrics.TextFormat();
  EXPECT_EQ(Sample(text, R"(tandem_running_sequences{service="router"})"), 2);
  EXPECT_EQ(
      Sample(text, R"(tandem_worker_up{service="router",role="verifier",worker="10.0.0.1:7000"})"),
      0);
}

TEST(ServiceMetricsTest, ServesOnAPortChosenByTheOs) {
  ServiceMetrics metrics(MetricsRole::kDrafter);
  metrics.SetScrapeHook([](ServiceMetrics& m) { m.SetDrafterSessions(7); });
  absl::StatusOr<std::string> address = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  const size_t colon = address->rfind(':');
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(address->substr(colon + 1), &port)) << *address;
  EXPECT_GT(port, 0);
  EXPECT_EQ(address->substr(0, colon), "127.0.0.1");

  httplib::Client client("127.0.0.1", port);
  httplib::Result result = client.Get("/metrics");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(Sample(result->body, R"(tandem_drafter_sessions{service="drafter"})"), 7);
  EXPECT_THAT(result->body, HasSubstr(Type("tandem_drafter_forwards_total", "counter")));
  EXPECT_THAT(result->body, HasSubstr(R"(tandem_build_info{service="drafter",version=")"));

  EXPECT_FALSE(metrics.Serve("127.0.0.1:0").ok());  // once per process
}

TEST(ServiceMetricsTest, BadAddressesAreRefused) {
  ServiceMetrics metrics(MetricsRole::kDrafter);
  absl::StatusOr<std::string> served = metrics.Serve("no-port");
  EXPECT_EQ(served.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(served.status().message(), HasSubstr("no-port"));
}

TEST(ServiceMetricsTest, NullMetricsRecordNothing) {
  RequestRecorder request(nullptr, "ar");
  request.OnChunk(3);
  request.Finish(absl::StatusCode::kOk);
  EXPECT_TRUE(request.finished());
}

}  // namespace
}  // namespace tandem
