// The worker registry's data and the router's view of it, without any I/O: the record a worker
// publishes under `tandem:worker:<role>:<worker_id>` (JSON, refreshed with a TTL by heartbeats,
// so a worker that dies drops out when its key expires), and RegistryView, which turns each
// complete listing of those keys into VerifierPool entries and a set of drafters. The Redis side
// is services/common/registry_publisher.h (workers) and services/router/registry_watcher.h.
//
// Thread-safety: the free functions are pure. RegistryView's methods may be called from any
// thread; one mutex guards it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/verifier_pool.h"

namespace tandem::router {

inline constexpr std::string_view kWorkerKeyPrefix = "tandem:worker:";

// Listings in a row a drafter may be missing from before the router drops it: about 5 s at the
// watcher's 1 s period, past the publishers' 2 s heartbeat.
inline constexpr int kDrafterAbsentListings = 5;

// What a worker says about itself in the registry. Fields are only ever added.
struct WorkerRecord {
  std::string role;       // "verifier" | "drafter"
  std::string worker_id;  // unique per process
  std::string address;    // HOST:PORT others dial
  std::string model;
  std::vector<std::string> modes;
  int max_context = 0;
  // Drafter: the model it drafts for, when it is built for one: a DFlash drafter's target, or
  // the model itself for a drafter hosting a tri-mode target (mask drafts, split
  // self-speculation). Empty: a generic drafter (a small model sharing the target's tokenizer).
  std::string target;
  // Load when the record was written.
  int running = 0;
  int queued = 0;
  double kv_usage_ratio = 0;
  bool draining = false;
};

// "tandem:worker:<role>:<worker_id>".
std::string WorkerKey(const WorkerRecord& record);
std::string EncodeWorkerRecord(const WorkerRecord& record);
// InvalidArgument (saying what is missing or malformed) for anything that is not a record with a
// role, worker id and address.
absl::StatusOr<WorkerRecord> DecodeWorkerRecord(std::string_view json);

class RegistryView {
 public:
  // The pool's entries at construction are static (command-line verifiers): never retired.
  explicit RegistryView(VerifierPool* pool);

  struct Changes {
    std::vector<std::string> added;    // "role address" of workers that appeared
    std::vector<std::string> removed;  // and of those whose registration is gone
  };
  // Applies one complete listing of the registry: registered verifiers join the pool (or come
  // back); a verifier that registered before and is absent now is retired once the pool has it
  // unhealthy (it stopped answering the router's polls: an answering one is only missing from a
  // registry that lost its data, e.g. a Redis restart, until its next heartbeat); drafters are
  // replaced, one that is absent from kDrafterAbsentListings listings in a row dropped. Not
  // called while the registry cannot be read: the last view stands.
  Changes Apply(const std::vector<WorkerRecord>& records);

  // A registered drafter for a request to `model` that is not draining: one built for `model`
  // (its `target`) when there is one, else a generic one; never one built for another model.
  // The least busy of those, rotating among equals; "" when there is none.
  std::string PickDrafter(const std::string& model);
  std::vector<std::string> Drafters() const;

 private:
  VerifierPool* pool_;
  mutable absl::Mutex mu_;
  std::set<size_t> static_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, size_t> registered_ ABSL_GUARDED_BY(mu_);  // verifier address -> index
  std::vector<WorkerRecord> drafters_ ABSL_GUARDED_BY(mu_);
  // Listings in a row each kept drafter has been missing from.
  std::map<std::string, int> drafter_absences_ ABSL_GUARDED_BY(mu_);
  size_t next_drafter_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router
