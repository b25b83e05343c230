// Prometheus metrics of one service process (docs/METRICS.md is the contract): the metric
// families, helpers that record requests, steps and drafts, and an HTTP endpoint serving the
// text format on /metrics at --metrics-listen.
//
// Every series carries the label service="router" | "verifier" | "drafter". Each role registers
// only the families that describe it (a router has no KV cache), so that no empty family is
// exported.
//
// Thread-safety: ServiceMetrics may be used from any thread (prometheus-cpp's metrics are
// atomic and its families lock); the scrape hook runs on the HTTP endpoint's threads, one at a
// time. A RequestRecorder belongs to one request and is driven by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace CLI {
class App;
}

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace tandem {

struct PrefixCacheStats;  // worker/kv/kv_cache.h

struct MetricsFlags {
  std::string listen;  // host:port of /metrics; "" = no metrics endpoint; port 0 = OS's choice
};

// Adds --metrics-listen (env <env_prefix>_METRICS_LISTEN, e.g. TANDEM_VERIFIER_METRICS_LISTEN).
void AddMetricsFlags(CLI::App& app, MetricsFlags* flags, std::string_view env_prefix);

enum class MetricsRole { kRouter, kVerifier, kDrafter };
std::string_view MetricsRoleName(MetricsRole role);  // the `service` label

// Draft positions beyond this one count at the last bucket of tandem_accepted_position_total.
inline constexpr int kMaxAcceptedPosition = 15;

class ServiceMetrics {
 public:
  explicit ServiceMetrics(MetricsRole role);
  ~ServiceMetrics();

  ServiceMetrics(const ServiceMetrics&) = delete;
  ServiceMetrics& operator=(const ServiceMetrics&) = delete;

  MetricsRole role() const { return role_; }

  // Starts serving /metrics on `listen` (host:port, port 0 = chosen by the OS) and returns the
  // bound host:port. Errors name the address. Call at most once.
  absl::StatusOr<std::string> Serve(const std::string& listen);

  // Runs before every scrape (and TextFormat), on the scraping thread: the place to copy
  // polled values (engine load, pool health) into gauges. Set it before Serve.
  void SetScrapeHook(std::function<void(ServiceMetrics&)> hook);

  // The text exposition, as a scrape would return it (runs the hook).
  std::string TextFormat() const;

  // Requests (router, verifier). `mode` is a mode name, "auto" or "unknown" (never a
  // client-chosen string: label values must stay few).
  void AddGeneratedTokens(const std::string& mode, int tokens);
  void ObserveTimeToFirstToken(const std::string& mode, double seconds);
  // A chunk of `tokens` > 0 tokens that came `gap_seconds` after the previous one: `tokens`
  // observations of gap_seconds / tokens.
  void ObserveInterTokenLatency(const std::string& mode, double gap_seconds, int tokens);
  // Counts the request under its gRPC code; its duration when it ended OK; on the verifier its
  // tokens per forward when it took forwards.
  void ObserveRequestFinished(const std::string& mode, absl::StatusCode code,
                              double duration_seconds, int completion_tokens, int forwards);

  void SetQueueDepth(int64_t requests);
  void SetRunningSequences(int64_t sequences);

  // Engines (verifier, drafter).
  void SetKvUsageRatio(double ratio);
  // The KV cache's prefix-cache counters (cumulative: the counters advance by what is new since
  // the last call) and blocks. From the scrape hook only (scrapes run one at a time).
  void SetPrefixCache(const PrefixCacheStats& stats);
  void ObserveStep(double seconds, int batch_tokens);

  // Verifier.
  void AddPreemptions(int64_t count);
  void ObserveDraftVerified(const std::string& mode, int drafted, int accepted);
  void AddDrafterFallback(const std::string& reason);  // "late" | "drafter_down"

  // Router.
  // `reason`: pinned | policy | hysteresis | no_data | default (router/mode_policy.h).
  void AddModeDecision(const std::string& mode, const std::string& reason);
  // The mode policy's goodput estimate of a candidate mode at its last decision.
  void SetModeGoodputEstimate(const std::string& mode, double tokens_per_second);
  void AddMigration(const std::string& reason);  // "verifier_failed"
  // A request long enough for prefix affinity: "followed" (sent to the verifier that served its
  // prefix), "overridden" (that verifier was too loaded) or "unknown" (no verifier known).
  void AddPrefixAffinity(const std::string& result);
  void SetWorkerUp(const std::string& worker, const std::string& role, bool up);
  // HTTP connections the router closed: `reason` request_timeout (no whole request within
  // --http-request-timeout).
  void AddHttpConnectionsClosed(const std::string& reason, int64_t count);

  // Verifier and drafter: a Draft stream's hidden-state transport settled (`transport`: bytes,
  // nccl, or failed when NCCL was required and impossible; a stream that falls back from nccl
  // counts again under bytes or failed).
  void AddHiddenTransportStream(const std::string& transport);
  // Verifier: a Draft stream broke (`reason`: ended, write_failed, backlog, hidden_transport);
  // its sequences decode without drafts.
  void AddDraftStreamBreak(const std::string& reason);
  // Verifier: a spec step verified drafts whose chain was there when the step loop looked
  // (`arrival` ready) or came while it waited (waited).
  void AddDraftChainArrival(const std::string& arrival);

  // Drafter.
  void SetDrafterSessions(int64_t sessions);
  void AddDrafterForwards(int64_t forwards);
  // Drafter: branch-ahead chains sent, tokens drafted in branches, and advances that took a
  // sent branch's path (the increments since the last call).
  void AddDrafterBranches(int64_t sent, int64_t tokens, int64_t hits);

 private:
  class Scrape;    // the collectable a scrape reads: runs the hook, then the registry
  class Endpoint;  // the HTTP server of /metrics and its thread

  const MetricsRole role_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Scrape> scrape_;
  std::unique_ptr<Endpoint> endpoint_;

  // Null where the role does not export the family.
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Family<prometheus::Counter>* generated_tokens_ = nullptr;
  prometheus::Family<prometheus::Histogram>* ttft_ = nullptr;
  prometheus::Family<prometheus::Histogram>* inter_token_ = nullptr;
  prometheus::Family<prometheus::Histogram>* duration_ = nullptr;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  prometheus::Counter* prefix_lookups_ = nullptr;
  prometheus::Counter* prefix_lookup_tokens_ = nullptr;
  prometheus::Counter* prefix_hit_tokens_ = nullptr;
  prometheus::Counter* prefix_evictions_ = nullptr;
  prometheus::Gauge* prefix_blocks_in_use_ = nullptr;
  prometheus::Gauge* prefix_blocks_idle_ = nullptr;
  // What SetPrefixCache has counted so far: lookups, lookup tokens, hit tokens, evictions.
  int64_t prefix_counted_[4] = {0, 0, 0, 0};
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Histogram* batch_tokens_ = nullptr;
  prometheus::Family<prometheus::Histogram>* tokens_per_forward_ = nullptr;
  prometheus::Family<prometheus::Counter>* drafts_ = nullptr;
  prometheus::Family<prometheus::Counter>* draft_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* accepted_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* accepted_position_ = nullptr;
  prometheus::Family<prometheus::Counter>* mode_decisions_ = nullptr;
  prometheus::Family<prometheus::Gauge>* mode_goodput_ = nullptr;
  prometheus::Family<prometheus::Counter>* migrations_ = nullptr;
  prometheus::Family<prometheus::Counter>* prefix_affinity_ = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_up_ = nullptr;
  prometheus::Family<prometheus::Counter>* http_closed_ = nullptr;
  prometheus::Gauge* drafter_sessions_ = nullptr;
  prometheus::Counter* drafter_forwards_ = nullptr;
  prometheus::Counter* drafter_branches_ = nullptr;
  prometheus::Counter* drafter_branch_tokens_ = nullptr;
  prometheus::Counter* drafter_branch_hits_ = nullptr;
  prometheus::Family<prometheus::Counter>* fallbacks_ = nullptr;
  prometheus::Family<prometheus::Counter>* draft_stream_breaks_ = nullptr;
  prometheus::Family<prometheus::Counter>* draft_chain_arrivals_ = nullptr;
  prometheus::Family<prometheus::Counter>* hidden_transport_streams_ = nullptr;
};

// Prints "<binary> metrics on <address>" on stdout and flushes (`tandem up` and the tests read
// it); services print it before their "listening on" line.
void AnnounceMetrics(std::string_view binary, const std::string& address);

// The metrics of one request's stream: time to first token, inter-token gaps, tokens, and the
// outcome. Does nothing when `metrics` is null. Arrival is construction time.
class RequestRecorder {
 public:
  explicit RequestRecorder(ServiceMetrics* metrics, std::string mode = "auto");

  // The mode that serves the request, once known (labels what follows).
  void set_mode(std::string mode);
  // A streamed message carrying `tokens` completion tokens (0: nothing recorded).
  void OnChunk(int tokens);
  // The request ended with `code`; only the first call counts. `forwards`: the target forwards
  // it took (verifier), 0 when unknown.
  void Finish(absl::StatusCode code, int forwards = 0);

  bool finished() const { return finished_; }

 private:
  ServiceMetrics* metrics_;
  std::string mode_;
  absl::Time arrival_;
  absl::Time last_chunk_;
  int tokens_ = 0;
  bool finished_ = false;
};

}  // namespace tandem
