// The router's table of verifiers: each one's address, what it serves (from its GetInfo), whether
// it is up (from GetLoad polls and failed streams) and how many of the router's streams it
// carries. Chooses a healthy verifier for a request: the least loaded, or the one where the
// request adds most goodput when the caller can estimate it. No gRPC here: the service
// layer polls the verifiers and reports what it learns, so the balancing policy is testable
// without a network. Entries can be added while the router runs (verifiers discovered through
// the registry) and retired (their registration expired); indices stay valid forever, so a
// stream in flight never loses its entry.
//
// Thread-safety: every method may be called from any thread; one mutex guards the table.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cost_model.h"

namespace tandem::router {

// What a verifier says about itself (WorkerInfo, converted).
struct VerifierInfo {
  std::string model;               // model id clients name in their requests
  std::vector<std::string> modes;  // decoding modes it serves
  int max_context = 0;             // the model's context length in tokens
  std::string worker_id;           // changes when the process behind the address restarts
  std::string default_mode;        // its mode for "auto" requests; "" = not said
  std::string tool_call_syntax;    // how its model writes tool calls; "" = not said (hermes)
};

// What a verifier's last load report said (WorkerLoad, converted).
struct VerifierLoad {
  int running = 0;  // sequences it decodes
  int queued = 0;   // sequences waiting for KV or a batch slot
  CostModel cost;   // its measured cost model (empty before it measured anything)
  // This router's streams on the verifier when the report arrived (VerifierPool::SetLoad sets
  // it): the part of running + queued that was this router's own at about the report's time.
  int own_streams = 0;
};

// The sequences a verifier holds: its last report's running + queued, with the part that was
// this router's own then (`load->own_streams`) replaced by this router's streams (`in_flight`,
// VerifierPool::Streams). A report is up to a poll old; between two reports the router's own
// streams change with every request that starts or ends, and those it counts itself, while
// other routers' streams on the verifier are known only from the report. Taking the larger of
// the report and the router's count instead overstates the load whenever a request ended since
// the report: a closed-loop client's next request then sees the one it replaced still counted.
// `in_flight` alone (at least 0) before any report.
double EstimatedSequences(const VerifierLoad* load, double in_flight);

// A model as the cluster serves it: modes are the union over the verifiers that serve it, the
// context the smallest.
struct ModelDescription {
  std::string id;
  std::vector<std::string> modes;
  int max_context = 0;
  std::string tool_call_syntax;  // the first of its verifiers' (one checkpoint, one template)
};

class VerifierPool {
 public:
  // One entry per address, in that order; indices below refer to it. Every verifier starts
  // down and without info until the first report.
  // `clock` reads the time for Streams' average (tests pass their own).
  explicit VerifierPool(
      std::vector<std::string> addresses,
      std::function<absl::Time()> clock = [] { return absl::Now(); });

  size_t size() const;
  std::string address(size_t index) const;
  // The index of `address`, appending a new entry (down, without info) when it has none. A
  // retired entry found again is not revived here: SetRetired(index, false) does that.
  size_t Add(std::string address);
  // A retired verifier is out of Models(), ResolveModel() and Acquire() until revived; streams
  // it carries go on. The monitor does not poll it.
  void SetRetired(size_t index, bool retired);
  bool Retired(size_t index) const;

  void SetInfo(size_t index, VerifierInfo info);
  bool HasInfo(size_t index) const;
  // The worker id of the last info, "" before any.
  std::string WorkerId(size_t index) const;
  void SetHealthy(size_t index, bool healthy);
  bool Healthy(size_t index) const;
  int InFlight(size_t index) const;
  // The router's streams on the verifier as the load a request placed now will decode
  // alongside: the larger of InFlight and its time-weighted average over about the last second
  // (an exponential average, time constant kStreamsWindow). At the instant a request arrives,
  // InFlight alone is often below the load: closed-loop clients that started together finish
  // together, and their next requests arrive one by one into a batch that is refilling within
  // milliseconds (at 4 clients, arrivals saw 2, 3 and 4 streams in turn), so a mode chosen for
  // 3 sequences runs at 4 for the rest of the request. The average holds the load of the last
  // second; the current count still wins when a burst has just raised it.
  double Streams(size_t index) const;
  static constexpr absl::Duration kStreamsWindow = absl::Seconds(1);
  // The info of the last GetInfo; nullopt before any.
  std::optional<VerifierInfo> Info(size_t index) const;
  void SetLoad(size_t index, VerifierLoad load);
  // The last load report; null before any. Shared, never changed once set.
  std::shared_ptr<const VerifierLoad> Load(size_t index) const;

  // Models of every verifier with info, up or down (a verifier that is briefly down does not
  // make its model unknown), sorted by id.
  std::vector<ModelDescription> Models() const;
  // The model a request names; "" names the only model when there is exactly one.
  // InvalidArgument names the models there are; Unavailable before any verifier answered.
  absl::StatusOr<ModelDescription> ResolveModel(std::string_view id) const;

  // What one more request is worth on a verifier: its estimated gain in goodput (tokens/s)
  // from its info, last load report (null before any) and the router's streams on it; nullopt
  // when it cannot say (no measurements). Called with the pool's lock held: it must not call
  // back into the pool.
  // `streams`: the router's streams on it (Streams()).
  using Gain = std::function<std::optional<double>(const VerifierInfo& info,
                                                   const VerifierLoad* load, double streams)>;

  // How Acquire chooses among the verifiers that can serve a request.
  struct Choice {
    // A verifier whose stream just failed: never picked.
    std::optional<size_t> avoid;
    // The verifier that likely holds the request's prefix in its prefix cache (PrefixAffinity):
    // picked while its streams in flight are at most the least loaded one's + `prefer_slack`.
    std::optional<size_t> prefer;
    int prefer_slack = 0;
    // What one more request is worth on each verifier (below); null = balancing alone.
    Gain gain;
    double gain_margin = 0.10;
  };

  // Picks the healthy verifier serving `model` (and `mode`, unless it is "" or "auto") and
  // counts one more stream on it; Release() ends it. The preferred verifier, if it is eligible
  // and not loaded beyond the slack; else by default the one with the fewest streams in
  // flight. With a `gain`, a verifier whose gain beats the least-loaded one's by more than
  // `gain_margin` (relative) is picked instead — the best one: on unlike verifiers (a faster
  // device, a better drafter, another mode measured better) the least loaded is not always
  // where a request adds most; on like ones the estimates tie within the margin and the choice
  // stays the least loaded. Unavailable (naming the model) when no healthy verifier serves it.
  absl::StatusOr<size_t> Acquire(std::string_view model, std::string_view mode,
                                 const Choice& choice);
  absl::StatusOr<size_t> Acquire(std::string_view model, std::string_view mode) {
    return Acquire(model, mode, Choice());
  }
  void Release(size_t index);

 private:
  struct Entry {
    std::optional<VerifierInfo> info;
    bool healthy = false;
    bool retired = false;
    int in_flight = 0;
    double average_in_flight = 0;  // time-weighted, as of `averaged_at`
    absl::Time averaged_at = absl::InfinitePast();
    std::shared_ptr<const VerifierLoad> load;
  };
  // The entry's average at `now` (in_flight held since averaged_at); Average stores it.
  static double AverageAt(const Entry& entry, absl::Time now);
  static void Average(Entry& entry, absl::Time now);
  static double StreamsOf(const Entry& entry, absl::Time now);

  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // round-robin start, so ties spread out
};

}  // namespace tandem::router
