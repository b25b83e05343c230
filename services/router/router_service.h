// The router's public gRPC service (tandem.v1.Generation, callback API). Generate checks the
// client's request, admits it within the in-flight bound, picks the least-loaded healthy verifier
// serving its model and relays that verifier's stream back, one message in flight at a time: the
// next upstream message is read only after the previous one was written to the client, so a slow
// client slows its verifier stream instead of filling the router's memory. Cancellation and the
// client's deadline carry over to the upstream call; upstream errors come back with their code.
//
// Migration: the router keeps the completion tokens each call has streamed. When its verifier's
// stream breaks (UNAVAILABLE, ABORTED, INTERNAL, CANCELLED that the client did not ask for, or a
// verifier that began draining) before the last message, the call goes to another healthy
// verifier with those tokens as VerifyRequest.committed_token_ids and the same seed (the router
// sets one when the client gave none), and the client's stream continues where it stopped: no
// gap, no duplicate. After `max_migrations` such moves the error reaches the client.
//
// Mode: a request that names its mode gets it ("pinned"). An "auto" (or empty) request goes to
// the least-loaded verifier unless another one's best mode gains clearly more goodput from one
// more request (VerifierPool::Acquire with GainOf); then the mode policy picks its mode
// from that verifier's reported cost model at the verifier's load with this request, and the
// verifier gets that mode by name. Every decision is counted in tandem_mode_decisions_total with
// its reason.
//
// Generate is registered raw (bytes in, bytes out) so that the router parses the request itself
// and can answer INVALID_ARGUMENT for invalid UTF-8 and oversized requests (request_decode.h).
//
// Thread-safety: the service is shared by gRPC's threads; its state is the thread-safe pool and
// admission gate. Each call is a small state machine driven by gRPC callbacks; no gRPC thread
// ever waits.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "router/admission.h"
#include "router/mode_policy.h"
#include "router/prefix_affinity.h"
#include "router/verifier_pool.h"
#include "services/common/api_keys.h"
#include "services/common/metrics.h"
#include "services/router/verifier_stubs.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/verifier.grpc.pb.h"

namespace tandem {

struct RouterOptions {
  std::string drafter;  // drafter address sent to verifiers (VerifyRequest.drafter); "" = theirs
  int max_in_flight = 256;  // Generate calls in flight at most; more are RESOURCE_EXHAUSTED
  int max_migrations = 3;   // times one call may move to another verifier; then its error stands
  // When `drafter` is empty: a drafter address for each request, given the request's model id
  // (e.g. from the registry); "" = the verifier's own. Called on gRPC threads; must be
  // thread-safe and must not block.
  std::function<std::string(const std::string& model)> pick_drafter;
  // When enabled, Generation calls must carry `authorization: Bearer KEY` metadata.
  ApiKeys api_keys;
  // Request metrics and mode decisions (not owned; null = none). Must outlive every call.
  ServiceMetrics* metrics = nullptr;
  // Chooses the mode of "auto" requests on the verifier they go to (not owned; null = they run
  // in the verifier's default mode). Must outlive the service.
  router::ModePolicy* mode_policy = nullptr;
  // Prefix affinity: a request goes to the verifier that last served a prompt beginning like
  // its own (router/prefix_affinity.h), where that prefix's KV is likely cached, while that
  // verifier has at most `prefix_affinity_slack` more of this router's streams than the least
  // loaded one; else to the least loaded.
  bool prefix_affinity = true;
  int prefix_affinity_slack = 2;
};

class RouterService final
    : public v1::Generation::WithRawCallbackMethod_Generate<
          v1::Generation::WithCallbackMethod_ListModels<v1::Generation::Service>> {
 public:
  // `pool` and `stubs` (one per pool entry, same order) are not owned and must outlive the
  // service and every call it started (shut the server down first).
  RouterService(router::VerifierPool* pool, std::vector<v1::Verifier::Stub*> stubs,
                RouterOptions options);
  // `stubs` grows with the pool (verifiers found through the registry); not owned, and must
  // outlive the service and every call it started.
  RouterService(router::VerifierPool* pool, VerifierStubs* stubs, RouterOptions options);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* reply) override;

  int InFlightForTest() const { return admission_.in_flight(); }
  // Generate calls admitted and not yet ended (any thread).
  int in_flight() const { return admission_.in_flight(); }
  // Streams moved to another verifier since the start (a counter for metrics; any thread).
  uint64_t migrations() const { return migrations_.load(std::memory_order_relaxed); }

 private:
  // Names the mode of `upstream` (going to `verifier`) when the client asked for "auto", and
  // records the decision.
  // For VerifierPool::Acquire: what an "auto" request adds on a verifier (its best mode's
  // estimated goodput with the request minus without it); null for pinned modes or without a
  // policy.
  router::VerifierPool::Gain GainOf(const v1::GenerateRequest& request) const;
  // What PrefixAffinity keys a request by: the model id, then its input as text.
  static std::string AffinityText(const std::string& model, const v1::GenerateRequest& request);
  void ChooseMode(size_t verifier, v1::VerifyRequest* upstream);

  router::VerifierPool* pool_;
  std::unique_ptr<VerifierStubs> owned_stubs_;
  VerifierStubs* stubs_;
  RouterOptions options_;
  router::AdmissionGate admission_;
  router::PrefixAffinity affinity_;
  std::atomic<uint64_t> migrations_{0};
};

}  // namespace tandem
