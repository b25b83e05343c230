// The router's gRPC stubs for its verifiers, indexed like the VerifierPool. The table grows with
// the pool (verifiers discovered through the registry): a stub is made the first time its index
// is asked for and kept for the router's life, so a pointer handed out stays valid.
//
// Thread-safety: every method may be called from any thread; one mutex guards the table.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "router/verifier_pool.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem {

class VerifierStubs {
 public:
  using ChannelFactory =
      std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>(const std::string& address)>;

  // Stubs made on demand for `pool`'s addresses through `factory`.
  VerifierStubs(const router::VerifierPool* pool, ChannelFactory factory);
  // A fixed table of stubs that are not owned (one per pool entry, same order).
  explicit VerifierStubs(std::vector<v1::Verifier::Stub*> fixed);

  // The stub of pool entry `index`; null when its channel cannot be made (the factory's error is
  // printed once).
  v1::Verifier::Stub* Get(size_t index);

 private:
  const router::VerifierPool* pool_ = nullptr;
  ChannelFactory factory_;
  absl::Mutex mu_;
  std::vector<v1::Verifier::Stub*> stubs_ ABSL_GUARDED_BY(mu_);  // null = not made (or failed)
  std::vector<bool> failed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<v1::Verifier::Stub>> owned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
