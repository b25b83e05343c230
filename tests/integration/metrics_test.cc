// Every service of a running cluster serves the metrics that docs/METRICS.md promises: the test
// reads the table from the doc (so the doc and the code cannot drift), sends requests in `ar`,
// `spec` and `auto` through the router, scrapes each service's /metrics over HTTP and checks
// names, types, labels, that the request metrics moved and that the auto request got a policy
// decision.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/cost_model.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/integration/cluster.h"

namespace tandem::testing {
namespace {

struct DocMetric {
  std::string type;
  std::set<std::string> labels;  // besides `service`
};

// The table of docs/METRICS.md: rows "| `name` | type | `label`, `label` | meaning |".
std::map<std::string, DocMetric> ReadContract() {
  std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/docs/METRICS.md");
  std::map<std::string, DocMetric> metrics;
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "| `tandem_")) continue;
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() < 5) continue;
    auto unquote = [](absl::string_view cell) {
      cell = absl::StripAsciiWhitespace(cell);
      return std::string(absl::StripSuffix(absl::StripPrefix(cell, "`"), "`"));
    };
    DocMetric metric;
    metric.type = std::string(absl::StripAsciiWhitespace(cells[2]));
    for (absl::string_view label : absl::StrSplit(cells[3], ',', absl::SkipWhitespace())) {
      if (!unquote(label).empty()) metric.labels.insert(unquote(label));
    }
    metrics[unquote(cells[1])] = metric;
  }
  return metrics;
}

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Scrape {
  std::map<std::string, std::string> types;  // from the # TYPE lines
  std::vector<Sample> samples;
};

// Parses the Prometheus text format (label values here hold no quotes or escapes).
Scrape Parse(const std::string& text) {
  Scrape scrape;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() == 2) scrape.types[parts[0]] = parts[1];
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    Sample sample;
    const size_t space = line.rfind(' ');
    absl::string_view series = line.substr(0, space);
    if (!absl::SimpleAtod(line.substr(space + 1), &sample.value)) continue;
    const size_t brace = series.find('{');
    sample.name = std::string(series.substr(0, brace));
    if (brace != absl::string_view::npos) {
      absl::string_view labels = series.substr(brace + 1, series.size() - brace - 2);
      for (absl::string_view pair : absl::StrSplit(labels, "\",", absl::SkipEmpty())) {
        const size_t eq = pair.find("=\"");
        std::string value(pair.substr(eq + 2));
        if (absl::EndsWith(value, "\"")) value.pop_back();
        sample.labels[std::string(pair.substr(0, eq))] = value;
      }
    }
    scrape.samples.push_back(std::move(sample));
  }
  return scrape;
}

absl::StatusOr<std::string> Get(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad metrics address '", address, "'"));
  }
  httplib::Client client(address.substr(0, colon), port);
  httplib::Result result = client.Get("/metrics");
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("GET http://", address, "/metrics: ", httplib::to_string(result.error())));
  }
  if (result->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET http://", address, "/metrics: HTTP ", result->status));
  }
  return result->body;
}

// The family a sample belongs to (histograms export _bucket, _sum and _count).
std::string Family(const Scrape& scrape, const std::string& sample) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(sample, suffix)) {
      std::string base = sample.substr(0, sample.size() - strlen(suffix));
      auto it = scrape.types.find(base);
      if (it != scrape.types.end() && it->second == "histogram") return base;
    }
  }
  return sample;
}

// The sum of the samples named `name` whose labels include `match`.
double Sum(const Scrape& scrape, const std::string& name,
           const std::map<std::string, std::string>& match) {
  double sum = 0;
  for (const Sample& sample : scrape.samples) {
    if (sample.name != name) continue;
    bool matches = true;
    for (const auto& [key, value] : match) {
      auto it = sample.labels.find(key);
      matches = matches && it != sample.labels.end() && it->second == value;
    }
    if (matches) sum += sample.value;
  }
  return sum;
}

TEST(MetricsTest, EveryServiceExportsTheDocumentedMetrics) {
  const std::map<std::string, DocMetric> contract = ReadContract();
  ASSERT_GE(contract.size(), 20u) << "docs/METRICS.md has no metrics table";

  // The spec request must verify drafts for the draft metrics to exist: its steps wait for them
  // (on a loaded machine late drafts would otherwise make every step an AR step).
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(
      {.metrics = true,
       .router_flags = {"--http-listen", "127.0.0.1:0", "--http-request-timeout", "1"},
       .verifier_flags = {"--draft-timeout-ms", "5000"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::map<std::string, std::string> endpoints;  // service label -> metrics address
  for (auto [service, child] :
       {std::pair{"router", (*cluster)->router()}, std::pair{"verifier", (*cluster)->verifier()},
        std::pair{"drafter", (*cluster)->drafter()}}) {
    std::optional<std::string> address = child->MetricsAddress();
    ASSERT_TRUE(address.has_value()) << service << " announced no metrics address";
    endpoints[service] = *address;
  }

  for (const char* mode : {"ar", "spec"}) {
    for (const char* prompt : {"def fibonacci(n):", "import os\n"}) {
      StreamResult result = Generate((*cluster)->generation(), Greedy(prompt, mode, 12));
      ASSERT_TRUE(result.status.ok()) << mode << ": " << result.status.error_message();
      ASSERT_FALSE(result.tokens.empty());
    }
  }
  // A prompt of several KV blocks, twice: the second request takes the first's blocks from the
  // verifier's prefix cache, and says so in its usage.
  std::string long_prompt;
  for (int i = 0; i < 8; ++i)
    long_prompt += "    total = total + values[" + std::to_string(i) + "]\n";
  int cached_tokens = 0;
  for (int i = 0; i < 2; ++i) {
    StreamResult result = Generate((*cluster)->generation(), Greedy(long_prompt, "ar", 12));
    ASSERT_TRUE(result.status.ok()) << result.status.error_message();
    cached_tokens = result.last.usage().cached_tokens();
  }
  EXPECT_GE(cached_tokens, 32);
  // "auto": the router's mode policy picks the mode from the verifier's calibrated cost model.
  StreamResult automatic = Generate((*cluster)->generation(), Greedy("def main():", "auto", 12));
  ASSERT_TRUE(automatic.status.ok()) << automatic.status.error_message();
  StreamResult rejected = Generate((*cluster)->generation(), Greedy("x", "no-such-mode", 12));
  ASSERT_EQ(rejected.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // An HTTP client that sends half a request and then a byte every 200 ms: the router closes it
  // after its 1 s request timeout, and counts it.
  {
    std::optional<std::string> http = (*cluster)->router()->HttpAddress();
    ASSERT_TRUE(http.has_value());
    const size_t colon = http->rfind(':');
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(http->substr(colon + 1), &port));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)), 0);
    const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    bool closed = send(fd, head.data(), head.size(), MSG_NOSIGNAL) < 0;
    for (int i = 0; i < 50 && !closed; ++i) {
      pollfd poll_fd{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
      closed = poll(&poll_fd, 1, 200) > 0 || send(fd, "a", 1, MSG_NOSIGNAL) != 1;
    }
    close(fd);
    EXPECT_TRUE(closed) << "the router kept a trickling HTTP client past its request timeout";
  }

  std::map<std::string, Scrape> scrapes;
  std::map<std::string, std::string> exported;  // name -> type, all services together
  for (const auto& [service, address] : endpoints) {
    absl::StatusOr<std::string> text = Get(address);
    ASSERT_TRUE(text.ok()) << service << ": " << text.status();
    Scrape scrape = Parse(*text);
    for (const auto& [name, type] : scrape.types) {
      auto [it, inserted] = exported.emplace(name, type);
      EXPECT_EQ(it->second, type) << name << " has two types";
      EXPECT_TRUE(contract.count(name))
          << service << " exports " << name << ", which docs/METRICS.md does not list";
    }
    for (const Sample& sample : scrape.samples) {
      const std::string family = Family(scrape, sample.name);
      auto it = sample.labels.find("service");
      ASSERT_NE(it, sample.labels.end()) << sample.name << " has no service label";
      EXPECT_EQ(it->second, service) << sample.name;
      auto doc = contract.find(family);
      if (doc == contract.end()) continue;
      std::set<std::string> labels;
      for (const auto& [key, value] : sample.labels) {
        if (key != "service" && !(key == "le" && doc->second.type == "histogram")) {
          labels.insert(key);
        }
      }
      EXPECT_EQ(labels, doc->second.labels)
          << service << " " << sample.name << " has labels {" << absl::StrJoin(labels, ", ")
          << "}, docs/METRICS.md says {" << absl::StrJoin(doc->second.labels, ", ") << "}";
    }
    scrapes[service] = std::move(scrape);
  }
  for (const auto& [name, metric] : contract) {
    auto it = exported.find(name);
    if (it == exported.end()) {
      ADD_FAILURE() << name << " is in docs/METRICS.md but no service exports it";
      continue;
    }
    EXPECT_EQ(it->second, metric.type) << name;
  }

  // The auto request got a policy decision (the verifier calibrated before it served, so the
  // router had its cost model from the first poll) for a lossless mode, with estimates.
  const Scrape& router = scrapes["router"];
  std::string chosen;
  for (const Sample& sample : router.samples) {
    if (sample.name == "tandem_mode_decisions_total" && sample.labels.at("reason") == "policy" &&
        sample.value > 0) {
      EXPECT_TRUE(chosen.empty()) << "two policy decisions: " << chosen << ", "
                                  << sample.labels.at("mode");
      chosen = sample.labels.at("mode");
    }
  }
  const std::vector<std::string>& lossless = AutoModes();
  EXPECT_NE(std::find(lossless.begin(), lossless.end(), chosen), lossless.end())
      << "the auto request's mode: '" << chosen << "'";
  EXPECT_GT(Sum(router, "tandem_mode_goodput_tokens_per_second", {{"mode", chosen}}), 0);
  EXPECT_GT(Sum(router, "tandem_mode_goodput_tokens_per_second", {{"mode", "ar"}}), 0);

  // The requests moved the request metrics on the router and on the verifier.
  for (const std::string service : {"router", "verifier"}) {
    const Scrape& scrape = scrapes[service];
    for (const std::string mode : {"ar", "spec"}) {
      // The auto request counts under the mode that served it; two more ar ones shared a prefix.
      const int requests = (mode == chosen ? 3 : 2) + (mode == "ar" ? 2 : 0);
      EXPECT_EQ(Sum(scrape, "tandem_requests_total", {{"mode", mode}, {"status", "OK"}}), requests)
          << service << " " << mode;
      EXPECT_EQ(Sum(scrape, "tandem_time_to_first_token_seconds_count", {{"mode", mode}}), requests)
          << service << " " << mode;
      EXPECT_GE(Sum(scrape, "tandem_generated_tokens_total", {{"mode", mode}}), 2)
          << service << " " << mode;
      EXPECT_EQ(Sum(scrape, "tandem_request_duration_seconds_count", {{"mode", mode}}), requests)
          << service << " " << mode;
    }
  }
  // The router refuses an unknown mode itself: counted, under no client-chosen label value.
  EXPECT_EQ(
      Sum(router, "tandem_requests_total", {{"mode", "unknown"}, {"status", "INVALID_ARGUMENT"}}),
      1);
  EXPECT_EQ(Sum(router, "tandem_mode_decisions_total", {{"mode", "spec"}, {"reason", "pinned"}}),
            2);
  EXPECT_EQ(Sum(router, "tandem_http_connections_closed_total", {{"reason", "request_timeout"}}),
            1);
  EXPECT_EQ(Sum(router, "tandem_worker_up",
                {{"worker", (*cluster)->verifier_address()}, {"role", "verifier"}}),
            1);
  const Scrape& verifier = scrapes["verifier"];
  EXPECT_EQ(Sum(verifier, "tandem_tokens_per_forward_count", {{"mode", "spec"}}),
            chosen == "spec" ? 3 : 2);
  EXPECT_GT(Sum(verifier, "tandem_step_duration_seconds_count", {}), 0);
  EXPECT_GE(Sum(verifier, "tandem_prefix_cache_hit_tokens_total", {}), cached_tokens);
  EXPECT_GE(Sum(verifier, "tandem_prefix_cache_lookup_tokens_total", {}),
            Sum(verifier, "tandem_prefix_cache_hit_tokens_total", {}));
  EXPECT_GT(Sum(verifier, "tandem_prefix_cache_blocks", {}), 0);
  // Each spec step either verified drafts or fell back to AR.
  EXPECT_GT(Sum(verifier, "tandem_drafts_total", {{"mode", "spec"}}) +
                Sum(verifier, "tandem_drafter_fallbacks_total", {}),
            0);
  EXPECT_GE(Sum(verifier, "tandem_draft_tokens_total", {{"mode", "spec"}}),
            Sum(verifier, "tandem_accepted_tokens_total", {{"mode", "spec"}}));
  const Scrape& drafter = scrapes["drafter"];
  EXPECT_GT(Sum(drafter, "tandem_drafter_forwards_total", {}), 0);
  EXPECT_GT(Sum(drafter, "tandem_batch_tokens_count", {}), 0);
}

}  // namespace
}  // namespace tandem::testing
