#include "services/common/metrics.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/version.h"
#include "httplib.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "worker/kv/kv_cache.h"

namespace tandem {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Registry;

const Histogram::BucketBoundaries& TtftBuckets() {
  static const auto* buckets =
      new Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *buckets;
}
const Histogram::BucketBoundaries& InterTokenBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  return *buckets;
}
const Histogram::BucketBoundaries& DurationBuckets() {
  static const auto* buckets =
      new Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  return *buckets;
}
const Histogram::BucketBoundaries& StepBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
  return *buckets;
}
const Histogram::BucketBoundaries& BatchTokenBuckets() {
  static const auto* buckets =
      new Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  return *buckets;
}
const Histogram::BucketBoundaries& TokensPerForwardBuckets() {
  static const auto* buckets =
      new Histogram::BucketBoundaries{0.5, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8};
  return *buckets;
}

// Families carry the service label as a constant label: every series gets it.
struct Families {
  Registry& registry;
  std::map<std::string, std::string> service;

  Family<Counter>* Counters(const std::string& name, const std::string& help) const {
    return &prometheus::BuildCounter().Name(name).Help(help).Labels(service).Register(registry);
  }
  Family<Gauge>* Gauges(const std::string& name, const std::string& help) const {
    return &prometheus::BuildGauge().Name(name).Help(help).Labels(service).Register(registry);
  }
  Family<Histogram>* Histograms(const std::string& name, const std::string& help) const {
    return &prometheus::BuildHistogram().Name(name).Help(help).Labels(service).Register(registry);
  }
};

}  // namespace

void AddMetricsFlags(CLI::App& app, MetricsFlags* flags, std::string_view env_prefix) {
  app.add_option("--metrics-listen", flags->listen,
                 "host:port serving Prometheus metrics on /metrics (port 0: chosen by the OS; "
                 "empty: no metrics endpoint)")
      ->envname(absl::StrCat(std::string(env_prefix), "_METRICS_LISTEN"));
}

std::string_view MetricsRoleName(MetricsRole role) {
  switch (role) {
    case MetricsRole::kRouter:
      return "router";
    case MetricsRole::kVerifier:
      return "verifier";
    case MetricsRole::kDrafter:
      return "drafter";
  }
  return "unknown";
}

// A scrape's view of the process: runs the scrape hook (one scrape at a time, so hooks may
// keep state such as the last value of a polled counter), then collects the registry.
class ServiceMetrics::Scrape final : public prometheus::Collectable {
 public:
  Scrape(ServiceMetrics* owner, std::shared_ptr<Registry> registry)
      : owner_(owner), registry_(std::move(registry)) {}

  void SetHook(std::function<void(ServiceMetrics&)> hook) {
    absl::MutexLock lock(&mu_);
    hook_ = std::move(hook);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    if (hook_) hook_(*owner_);
    return registry_->Collect();
  }

 private:
  ServiceMetrics* owner_;
  std::shared_ptr<Registry> registry_;
  mutable absl::Mutex mu_;
  std::function<void(ServiceMetrics&)> hook_ ABSL_GUARDED_BY(mu_);
};

ServiceMetrics::ServiceMetrics(MetricsRole role)
    : role_(role),
      registry_(std::make_shared<Registry>()),
      scrape_(std::make_shared<Scrape>(this, registry_)) {
  const Families r{*registry_, {{"service", std::string(MetricsRoleName(role))}}};
  const bool router = role == MetricsRole::kRouter;
  const bool verifier = role == MetricsRole::kVerifier;
  const bool drafter = role == MetricsRole::kDrafter;

  r.Gauges("tandem_build_info", "Build of the running binary; always 1")
      ->Add({{"version", VersionString()}})
      .Set(1);
  if (router || verifier) {
    requests_ =
        r.Counters("tandem_requests_total", "Finished requests by mode and gRPC status code name");
    generated_tokens_ = r.Counters("tandem_generated_tokens_total", "Completion tokens streamed");
    ttft_ =
        r.Histograms("tandem_time_to_first_token_seconds", "Request arrival to its first token");
    inter_token_ = r.Histograms("tandem_inter_token_latency_seconds",
                                "Gap between consecutive streamed chunks, per token");
    duration_ = r.Histograms("tandem_request_duration_seconds",
                             "Request arrival to its last token (requests that ended OK)");
    queue_depth_ = &r.Gauges("tandem_queue_depth",
                             router ? "Requests admitted and waiting for a verifier"
                                    : "Requests admitted and waiting for KV or a batch slot")
                        ->Add({});
    running_ = &r.Gauges("tandem_running_sequences",
                         router ? "Streams in flight" : "Sequences being decoded")
                    ->Add({});
  }
  if (verifier || drafter) {
    kv_usage_ =
        &r.Gauges("tandem_kv_usage_ratio",
                  "KV blocks held by sequences / all KV blocks (idle cached blocks are free)")
             ->Add({});
    prefix_lookups_ = &r.Counters("tandem_prefix_cache_lookups_total",
                                  "Sequences that looked for a cached prefix of their tokens")
                           ->Add({});
    prefix_lookup_tokens_ =
        &r.Counters("tandem_prefix_cache_lookup_tokens_total",
                    "Tokens those lookups could have taken from the cache (whole blocks)")
             ->Add({});
    prefix_hit_tokens_ = &r.Counters("tandem_prefix_cache_hit_tokens_total",
                                     "Tokens taken from the prefix cache: prefill saved")
                              ->Add({});
    prefix_evictions_ = &r.Counters("tandem_prefix_cache_evictions_total",
                                    "Idle cached KV blocks reused for other tokens")
                             ->Add({});
    auto& blocks = *r.Gauges("tandem_prefix_cache_blocks",
                             "Cached KV blocks: in_use (held by sequences) or idle (evictable)");
    prefix_blocks_in_use_ = &blocks.Add({{"state", "in_use"}});
    prefix_blocks_idle_ = &blocks.Add({{"state", "idle"}});
    hidden_transport_streams_ =
        r.Counters("tandem_hidden_transport_streams_total",
                   "Draft streams whose hidden-state transport settled (bytes, nccl, failed)");
    for (const char* transport : {"bytes", "nccl", "failed"}) {
      hidden_transport_streams_->Add({{"transport", transport}});
    }
    step_duration_ = &r.Histograms("tandem_step_duration_seconds",
                                   "One batched forward (plan, forward, consume, commit)")
                          ->Add({}, StepBuckets());
    batch_tokens_ = &r.Histograms("tandem_batch_tokens", "Tokens in one batched forward")
                         ->Add({}, BatchTokenBuckets());
  }
  if (verifier) {
    preemptions_ =
        &r.Counters("tandem_preemptions_total", "Sequences that lost their KV and were recomputed")
             ->Add({});
    tokens_per_forward_ = r.Histograms("tandem_tokens_per_forward",
                                       "Per finished request: completion tokens / target forwards");
    drafts_ = r.Counters("tandem_drafts_total",
                         "Verification steps that checked at least one draft token");
    draft_tokens_ =
        r.Counters("tandem_draft_tokens_total", "Draft tokens proposed to verification");
    accepted_tokens_ = r.Counters("tandem_accepted_tokens_total", "Draft tokens accepted");
    accepted_position_ =
        r.Counters("tandem_accepted_position_total",
                   "Drafts whose token at `position` (0-based, capped at 15) was accepted");
    fallbacks_ = r.Counters("tandem_drafter_fallbacks_total",
                            "Spec steps that fell back to AR (late, drafter_down)");
    // Zero series, so that a rate over them exists before the first fallback.
    for (const char* reason : {"late", "drafter_down"}) {
      fallbacks_->Add({{"reason", reason}});
    }
    draft_stream_breaks_ =
        r.Counters("tandem_draft_stream_breaks_total",
                   "Draft streams to a drafter that broke (ended, write_failed, backlog, "
                   "hidden_transport); their sequences decode without drafts");
    for (const char* reason : {"ended", "write_failed", "backlog", "hidden_transport"}) {
      draft_stream_breaks_->Add({{"reason", reason}});
    }
    draft_chain_arrivals_ =
        r.Counters("tandem_draft_chain_arrivals_total",
                   "Spec steps that verified drafts whose chain was there when the step loop "
                   "looked (ready) or came while it waited (waited)");
    for (const char* arrival : {"ready", "waited"})
      draft_chain_arrivals_->Add({{"arrival", arrival}});
  }
  if (router) {
    mode_decisions_ = r.Counters("tandem_mode_decisions_total",
                                 "The mode chosen for a request and why (pinned, policy, "
                                 "hysteresis, no_data, default)");
    mode_goodput_ = r.Gauges("tandem_mode_goodput_tokens_per_second",
                             "The mode policy's goodput estimate per candidate mode at its last "
                             "decision");
    migrations_ = r.Counters("tandem_migrations_total",
                             "Streams moved to another verifier (verifier_failed)");
    for (const char* reason : {"verifier_failed"}) {
      migrations_->Add({{"reason", reason}});
    }
    worker_up_ = r.Gauges("tandem_worker_up", "1 when the worker answers its health poll");
    http_closed_ = r.Counters("tandem_http_connections_closed_total",
                              "HTTP connections the router closed (request_timeout: no whole "
                              "request within --http-request-timeout)");
    http_closed_->Add({{"reason", "request_timeout"}});
    prefix_affinity_ = r.Counters(
        "tandem_prefix_affinity_total",
        "Requests long enough for prefix affinity, by where they went (followed, overridden, "
        "unknown)");
    for (const char* result : {"followed", "overridden", "unknown"}) {
      prefix_affinity_->Add({{"result", result}});
    }
  }
  if (drafter) {
    drafter_sessions_ = &r.Gauges("tandem_drafter_sessions", "Open drafting sessions")->Add({});
    drafter_forwards_ =
        &r.Counters("tandem_drafter_forwards_total", "Batched drafter forwards")->Add({});
    drafter_branches_ =
        &r.Counters("tandem_drafter_branches_total", "Branch-ahead chains sent to verifiers")
             ->Add({});
    drafter_branch_tokens_ = &r.Counters("tandem_drafter_branch_tokens_total",
                                         "Tokens drafted in branch-ahead branches, sent or dropped")
                                  ->Add({});
    drafter_branch_hits_ = &r.Counters("tandem_drafter_branch_hits_total",
                                       "Advances whose tokens took the path of a sent branch")
                                ->Add({});
  }
}

// /metrics over cpp-httplib. Not prometheus-cpp's civetweb exposer: civetweb starts its threads
// with a fixed 100 KiB stack, which glibc refuses (EINVAL) once a library with a large static
// TLS block is loaded — cuBLAS, linked by the CUDA backend, needs about 110 KiB — so every
// service built with CUDA failed to serve metrics.
class ServiceMetrics::Endpoint {
 public:
  ~Endpoint() {
    server.stop();
    if (thread.joinable()) thread.join();
  }
  httplib::Server server;
  std::thread thread;
  absl::Mutex scrape_mu;  // scrapes run one at a time (the hook's contract)
};

ServiceMetrics::~ServiceMetrics() = default;

absl::StatusOr<std::string> ServiceMetrics::Serve(const std::string& listen) {
  if (endpoint_ != nullptr) return absl::FailedPreconditionError("metrics are already served");
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size() ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen must be host:port, got '", listen, "'"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:9090
  }
  auto endpoint = std::make_unique<Endpoint>();
  endpoint->server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  endpoint->server.Get("/metrics", [this, mu = &endpoint->scrape_mu](const httplib::Request&,
                                                                     httplib::Response& res) {
    std::string text;
    {
      absl::MutexLock lock(mu);
      text = TextFormat();
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound = port == 0 ? endpoint->server.bind_to_any_port(host)
                              : (endpoint->server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on '", listen,
                                               "': cannot bind (address in use or not local?)"));
  }
  httplib::Server* server = &endpoint->server;
  endpoint->thread = std::thread([server] { server->listen_after_bind(); });
  endpoint_ = std::move(endpoint);
  const std::string shown = listen.substr(0, colon);
  return absl::StrCat(shown, ":", bound);
}

void ServiceMetrics::SetScrapeHook(std::function<void(ServiceMetrics&)> hook) {
  scrape_->SetHook(std::move(hook));
}

std::string ServiceMetrics::TextFormat() const {
  return prometheus::TextSerializer().Serialize(scrape_->Collect());
}

void ServiceMetrics::AddGeneratedTokens(const std::string& mode, int tokens) {
  if (generated_tokens_ == nullptr || tokens <= 0) return;
  generated_tokens_->Add({{"mode", mode}}).Increment(tokens);
}

void ServiceMetrics::ObserveTimeToFirstToken(const std::string& mode, double seconds) {
  if (ttft_ == nullptr) return;
  ttft_->Add({{"mode", mode}}, TtftBuckets()).Observe(seconds);
}

void ServiceMetrics::ObserveInterTokenLatency(const std::string& mode, double gap_seconds,
                                              int tokens) {
  if (inter_token_ == nullptr || tokens <= 0) return;
  Histogram& histogram = inter_token_->Add({{"mode", mode}}, InterTokenBuckets());
  const double per_token = gap_seconds / tokens;
  for (int i = 0; i < tokens; ++i) histogram.Observe(per_token);
}

void ServiceMetrics::ObserveRequestFinished(const std::string& mode, absl::StatusCode code,
                                            double duration_seconds, int completion_tokens,
                                            int forwards) {
  if (requests_ == nullptr) return;
  requests_->Add({{"mode", mode}, {"status", absl::StatusCodeToString(code)}}).Increment();
  if (code == absl::StatusCode::kOk) {
    duration_->Add({{"mode", mode}}, DurationBuckets()).Observe(duration_seconds);
  }
  if (tokens_per_forward_ != nullptr && forwards > 0 && completion_tokens > 0) {
    tokens_per_forward_->Add({{"mode", mode}}, TokensPerForwardBuckets())
        .Observe(static_cast<double>(completion_tokens) / forwards);
  }
}

void ServiceMetrics::SetQueueDepth(int64_t requests) {
  if (queue_depth_ != nullptr) queue_depth_->Set(static_cast<double>(requests));
}

void ServiceMetrics::SetRunningSequences(int64_t sequences) {
  if (running_ != nullptr) running_->Set(static_cast<double>(sequences));
}

void ServiceMetrics::SetKvUsageRatio(double ratio) {
  if (kv_usage_ != nullptr) kv_usage_->Set(ratio);
}

void ServiceMetrics::SetPrefixCache(const PrefixCacheStats& stats) {
  if (prefix_lookups_ == nullptr) return;
  const int64_t now[4] = {stats.lookups, stats.lookup_tokens, stats.hit_tokens, stats.evictions};
  prometheus::Counter* counters[4] = {prefix_lookups_, prefix_lookup_tokens_, prefix_hit_tokens_,
                                      prefix_evictions_};
  for (int i = 0; i < 4; ++i) {
    if (now[i] > prefix_counted_[i]) {
      counters[i]->Increment(static_cast<double>(now[i] - prefix_counted_[i]));
      prefix_counted_[i] = now[i];
    }
  }
  prefix_blocks_in_use_->Set(stats.cached_blocks - stats.idle_blocks);
  prefix_blocks_idle_->Set(stats.idle_blocks);
}

void ServiceMetrics::ObserveStep(double seconds, int batch_tokens) {
  if (step_duration_ == nullptr) return;
  step_duration_->Observe(seconds);
  batch_tokens_->Observe(batch_tokens);
}

void ServiceMetrics::AddPreemptions(int64_t count) {
  if (preemptions_ != nullptr && count > 0) preemptions_->Increment(static_cast<double>(count));
}

void ServiceMetrics::ObserveDraftVerified(const std::string& mode, int drafted, int accepted) {
  if (drafts_ == nullptr || drafted <= 0) return;
  drafts_->Add({{"mode", mode}}).Increment();
  draft_tokens_->Add({{"mode", mode}}).Increment(drafted);
  accepted = std::clamp(accepted, 0, drafted);
  if (accepted > 0) accepted_tokens_->Add({{"mode", mode}}).Increment(accepted);
  // Acceptance is a prefix: positions 0 .. accepted-1 were all accepted.
  for (int position = 0; position < accepted; ++position) {
    const int label = std::min(position, kMaxAcceptedPosition);
    accepted_position_->Add({{"mode", mode}, {"position", std::to_string(label)}}).Increment();
  }
}

void ServiceMetrics::AddHiddenTransportStream(const std::string& transport) {
  if (hidden_transport_streams_ != nullptr) {
    hidden_transport_streams_->Add({{"transport", transport}}).Increment();
  }
}

void ServiceMetrics::AddDraftStreamBreak(const std::string& reason) {
  if (draft_stream_breaks_ != nullptr) draft_stream_breaks_->Add({{"reason", reason}}).Increment();
}

void ServiceMetrics::AddDraftChainArrival(const std::string& arrival) {
  if (draft_chain_arrivals_ != nullptr) {
    draft_chain_arrivals_->Add({{"arrival", arrival}}).Increment();
  }
}

void ServiceMetrics::AddDrafterFallback(const std::string& reason) {
  if (fallbacks_ != nullptr) fallbacks_->Add({{"reason", reason}}).Increment();
}

void ServiceMetrics::AddModeDecision(const std::string& mode, const std::string& reason) {
  if (mode_decisions_ != nullptr) {
    mode_decisions_->Add({{"mode", mode}, {"reason", reason}}).Increment();
  }
}

void ServiceMetrics::SetModeGoodputEstimate(const std::string& mode, double tokens_per_second) {
  if (mode_goodput_ != nullptr) mode_goodput_->Add({{"mode", mode}}).Set(tokens_per_second);
}

void ServiceMetrics::AddMigration(const std::string& reason) {
  if (migrations_ != nullptr) migrations_->Add({{"reason", reason}}).Increment();
}

void ServiceMetrics::AddPrefixAffinity(const std::string& result) {
  if (prefix_affinity_ != nullptr) prefix_affinity_->Add({{"result", result}}).Increment();
}

void ServiceMetrics::SetWorkerUp(const std::string& worker, const std::string& role, bool up) {
  if (worker_up_ != nullptr) worker_up_->Add({{"worker", worker}, {"role", role}}).Set(up ? 1 : 0);
}

void ServiceMetrics::AddHttpConnectionsClosed(const std::string& reason, int64_t count) {
  if (http_closed_ != nullptr && count > 0) {
    http_closed_->Add({{"reason", reason}}).Increment(static_cast<double>(count));
  }
}

void ServiceMetrics::SetDrafterSessions(int64_t sessions) {
  if (drafter_sessions_ != nullptr) drafter_sessions_->Set(static_cast<double>(sessions));
}

void ServiceMetrics::AddDrafterBranches(int64_t sent, int64_t tokens, int64_t hits) {
  if (drafter_branches_ == nullptr) return;
  if (sent > 0) drafter_branches_->Increment(static_cast<double>(sent));
  if (tokens > 0) drafter_branch_tokens_->Increment(static_cast<double>(tokens));
  if (hits > 0) drafter_branch_hits_->Increment(static_cast<double>(hits));
}

void ServiceMetrics::AddDrafterForwards(int64_t forwards) {
  if (drafter_forwards_ != nullptr && forwards > 0) {
    drafter_forwards_->Increment(static_cast<double>(forwards));
  }
}

void AnnounceMetrics(std::string_view binary, const std::string& address) {
  std::cout << binary << " metrics on " << address << std::endl;
}

RequestRecorder::RequestRecorder(ServiceMetrics* metrics, std::string mode)
    : metrics_(metrics), mode_(std::move(mode)), arrival_(absl::Now()) {}

void RequestRecorder::set_mode(std::string mode) {
  if (!mode.empty()) mode_ = std::move(mode);
}

void RequestRecorder::OnChunk(int tokens) {
  if (metrics_ == nullptr || tokens <= 0 || finished_) return;
  const absl::Time now = absl::Now();
  if (tokens_ == 0) {
    metrics_->ObserveTimeToFirstToken(mode_, absl::ToDoubleSeconds(now - arrival_));
  } else {
    metrics_->ObserveInterTokenLatency(mode_, absl::ToDoubleSeconds(now - last_chunk_), tokens);
  }
  metrics_->AddGeneratedTokens(mode_, tokens);
  tokens_ += tokens;
  last_chunk_ = now;
}

void RequestRecorder::Finish(absl::StatusCode code, int forwards) {
  if (finished_) return;
  finished_ = true;
  if (metrics_ == nullptr) return;
  const absl::Time end = tokens_ > 0 ? last_chunk_ : absl::Now();
  metrics_->ObserveRequestFinished(mode_, code, absl::ToDoubleSeconds(end - arrival_), tokens_,
                                   forwards);
}

}  // namespace tandem
