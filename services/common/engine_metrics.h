// An EngineObserver that records an engine's steps, drafts, fallbacks and preemptions in a
// ServiceMetrics (the verifier's Engine and the drafter's DraftEngine report through it).
//
// Thread-safety: called on the engine thread; ServiceMetrics is thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "services/common/metrics.h"
#include "worker/engine/engine_observer.h"

namespace tandem {

class EngineMetricsObserver final : public EngineObserver {
 public:
  // `metrics` is not owned and must outlive the observer.
  explicit EngineMetricsObserver(ServiceMetrics* metrics) : metrics_(metrics) {}

  void OnStep(double seconds, int batch_tokens) override {
    metrics_->ObserveStep(seconds, batch_tokens);
  }
  void OnDraftVerified(std::string_view mode, int drafted, int accepted) override {
    metrics_->ObserveDraftVerified(std::string(mode), drafted, accepted);
  }
  void OnFallback(std::string_view reason) override {
    metrics_->AddDrafterFallback(std::string(reason));
  }
  void OnChainArrival(bool waited) override {
    metrics_->AddDraftChainArrival(waited ? "waited" : "ready");
  }
  void OnPreemption() override { metrics_->AddPreemptions(1); }

 private:
  ServiceMetrics* metrics_;
};

}  // namespace tandem
