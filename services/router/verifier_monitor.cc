#include "services/router/verifier_monitor.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"

namespace tandem {

namespace {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

router::VerifierInfo ToVerifierInfo(const v1::WorkerInfo& info) {
  router::VerifierInfo out;
  out.model = info.model();
  out.modes.assign(info.modes().begin(), info.modes().end());
  out.max_context = info.max_context();
  out.worker_id = info.worker_id();
  out.default_mode = info.default_mode();
  out.tool_call_syntax = info.tool_call_syntax();
  return out;
}

router::VerifierLoad ToVerifierLoad(const v1::WorkerLoad& load) {
  router::VerifierLoad out;
  out.running = load.running_sequences();
  out.queued = load.queued_sequences();
  out.cost.request_tokens = load.request_tokens();
  for (const v1::StepTime& point : load.step_times()) {
    out.cost.step_times.push_back(StepTimePoint{.batch_tokens = point.batch_tokens(),
                                                .step_seconds = point.step_seconds(),
                                                .samples = point.samples()});
  }
  for (const v1::ModeCost& mode : load.mode_costs()) {
    std::vector<ModeLoadPoint>& points = out.cost.modes[mode.mode()];
    for (const v1::ModeLoad& point : mode.points()) {
      points.push_back(ModeLoadPoint{.sequences = point.sequences(),
                                     .tokens_per_step = point.tokens_per_step(),
                                     .extend_tokens = point.extend_tokens(),
                                     .wait_seconds = point.wait_seconds(),
                                     .step_seconds = point.step_seconds(),
                                     .start_seconds = point.start_seconds(),
                                     .samples = point.samples()});
    }
  }
  return out;
}

// The state of one verifier's calls within a poll.
struct Probe {
  grpc::ClientContext context;
  v1::WorkerLoadRequest load_request;
  v1::WorkerLoad load;
  grpc::Status load_status;
  grpc::ClientContext info_context;
  v1::WorkerInfoRequest info_request;
  v1::WorkerInfo info;
  grpc::Status info_status;
  bool want_info = false;
};

}  // namespace

VerifierMonitor::VerifierMonitor(router::VerifierPool* pool, std::vector<v1::Verifier::Stub*> stubs,
                                 absl::Duration period)
    : pool_(pool),
      owned_stubs_(std::make_unique<VerifierStubs>(std::move(stubs))),
      stubs_(owned_stubs_.get()),
      period_(period) {}

VerifierMonitor::VerifierMonitor(router::VerifierPool* pool, VerifierStubs* stubs,
                                 absl::Duration period)
    : pool_(pool), stubs_(stubs), period_(period) {}

VerifierMonitor::~VerifierMonitor() { Stop(); }

void VerifierMonitor::Start(absl::Duration first_wait) {
  PollOnce(first_wait, /*wait_for_ready=*/true);
  thread_.Start(period_, [this] { PollOnce(period_, /*wait_for_ready=*/false); });
}

void VerifierMonitor::Stop() { thread_.Stop(); }

void VerifierMonitor::PollOnce(absl::Duration timeout, bool wait_for_ready) {
  const size_t n = pool_->size();
  std::vector<Probe> probes(n);
  // Retired entries (registrations that expired) and addresses without a channel are skipped.
  std::vector<v1::Verifier::Stub*> stubs(n, nullptr);
  std::vector<size_t> polled;
  for (size_t i = 0; i < n; ++i) {
    if (pool_->Retired(i)) continue;
    stubs[i] = stubs_->Get(i);
    if (stubs[i] != nullptr) polled.push_back(i);
  }
  {
    absl::BlockingCounter loads(static_cast<int>(polled.size()));
    for (size_t i : polled) {
      Probe& probe = probes[i];
      probe.context.set_deadline(DeadlineIn(timeout));
      probe.context.set_wait_for_ready(wait_for_ready);
      stubs[i]->async()->GetLoad(&probe.context, &probe.load_request, &probe.load,
                                 [&probe, &loads](grpc::Status status) {
                                   probe.load_status = std::move(status);
                                   loads.DecrementCount();
                                 });
    }
    loads.Wait();
  }
  int info_calls = 0;
  for (size_t i : polled) {
    Probe& probe = probes[i];
    // Info is fetched for a verifier never seen, one coming back up, and one whose process
    // changed behind the same address (a new worker id).
    probe.want_info =
        probe.load_status.ok() &&
        (!pool_->HasInfo(i) || !pool_->Healthy(i) ||
         (!probe.load.worker_id().empty() && probe.load.worker_id() != pool_->WorkerId(i)));
    info_calls += probe.want_info ? 1 : 0;
  }
  if (info_calls > 0) {
    absl::BlockingCounter infos(info_calls);
    for (size_t i : polled) {
      Probe& probe = probes[i];
      if (!probe.want_info) continue;
      probe.info_context.set_deadline(DeadlineIn(timeout));
      stubs[i]->async()->GetInfo(&probe.info_context, &probe.info_request, &probe.info,
                                 [&probe, &infos](grpc::Status status) {
                                   probe.info_status = std::move(status);
                                   infos.DecrementCount();
                                 });
    }
    infos.Wait();
  }
  for (size_t i : polled) {
    Probe& probe = probes[i];
    if (probe.want_info) {
      if (probe.info_status.ok()) {
        pool_->SetInfo(i, ToVerifierInfo(probe.info));
      } else {
        std::fprintf(stderr, "tandem-router: verifier %s: GetInfo failed: %s\n",
                     pool_->address(i).c_str(), probe.info_status.error_message().c_str());
      }
    }
    if (probe.load_status.ok()) pool_->SetLoad(i, ToVerifierLoad(probe.load));
    const bool was_healthy = pool_->Healthy(i);
    const bool healthy = probe.load_status.ok() && !probe.load.draining() &&
                         !probe.load.stalled() && !pool_->WorkerId(i).empty();
    pool_->SetHealthy(i, healthy);
    // The first poll (wait_for_ready) also names the verifiers that are not there yet.
    if (was_healthy != healthy || (wait_for_ready && !healthy)) {
      std::string why;
      if (!probe.load_status.ok()) {
        why = ": " + probe.load_status.error_message();
      } else if (probe.load.draining()) {
        why = " (draining)";
      } else if (probe.load.stalled()) {
        why = absl::StrCat(" (its engine has had work and not stepped for ",
                           absl::SixDigits(probe.load.stalled_seconds()), " s)");
      }
      std::fprintf(stderr, "tandem-router: verifier %s is %s%s\n", pool_->address(i).c_str(),
                   healthy ? "up" : "down", why.c_str());
    }
  }
}

}  // namespace tandem
