// The router's public gRPC service (tandem.v1.Generation, callback API). Generate checks the
// client's request, admits it within the in-flight bound, picks the least-loaded healthy verifier
// serving its model and relays that verifier's stream back, one message in flight at a time: the
// next upstream message is read only after the previous one was written to the client, so a slow
// client slows its verifier stream instead of filling the router's memory. Cancellation and the
// client's deadline carry over to the upstream call; upstream errors come back with their code.
//
// Generate is registered raw (bytes in, bytes out) so that the router parses the request itself
// and can answer INVALID_ARGUMENT for invalid UTF-8 and oversized requests (request_decode.h).
//
// Thread-safety: the service is shared by gRPC's threads; its state is the thread-safe pool and
// admission gate. Each call is a small state machine driven by gRPC callbacks; no gRPC thread
// ever waits.
#pragma once

#include <string>
#include <vector>

#include "router/admission.h"
#include "router/verifier_pool.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem {

struct RouterOptions {
  std::string drafter;  // drafter address sent to verifiers (VerifyRequest.drafter); "" = theirs
  int max_in_flight = 256;  // Generate calls in flight at most; more are RESOURCE_EXHAUSTED
};

class RouterService final
    : public v1::Generation::WithRawCallbackMethod_Generate<
          v1::Generation::WithCallbackMethod_ListModels<v1::Generation::Service>> {
 public:
  // `pool` and `stubs` (one per pool entry, same order) are not owned and must outlive the
  // service and every call it started (shut the server down first).
  RouterService(router::VerifierPool* pool, std::vector<v1::Verifier::Stub*> stubs,
                RouterOptions options);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* reply) override;

  int InFlightForTest() const { return admission_.in_flight(); }

 private:
  router::VerifierPool* pool_;
  std::vector<v1::Verifier::Stub*> stubs_;
  RouterOptions options_;
  router::AdmissionGate admission_;
};

}  // namespace tandem
