// The verifier's gRPC service (tandem.v1.Verifier, callback API): converts each request to the
// engine's native SequenceRequest at once, submits it, and streams the engine's events back
// with one write in flight. No gRPC thread ever waits on the model: the engine runs on its own
// thread and reports through a per-request sink, which tells the engine to hold the sequence
// while the client is behind (flow control without unbounded buffering).
//
// Thread-safety: the service object is shared by gRPC's threads; it holds no mutable state of
// its own besides what Engine already makes thread-safe.
#pragma once

#include <string>

#include "absl/time/time.h"
#include "services/common/api_keys.h"
#include "services/common/metrics.h"
#include "tandem/v1/verifier.grpc.pb.h"
#include "worker/engine/engine.h"
#include "worker/template/tool_call_syntax.h"

namespace tandem {

struct VerifierIdentity {
  std::string model_id;      // what clients put in GenerateRequest.model ("" matches too)
  std::string worker_id;     // unique per process
  std::string default_mode;  // the engine's mode for "auto" requests (WorkerInfo.default_mode)
  // How the model writes tool calls (WorkerInfo.tool_call_syntax).
  ToolCallSyntax tool_call_syntax = ToolCallSyntax::kHermes;
};

// Converts a VerifyRequest to the engine's request. InvalidArgument names the field at fault.
// Mode options left 0 take `defaults`.
absl::StatusOr<SequenceRequest> ToSequenceRequest(const v1::VerifyRequest& request,
                                                  const VerifierIdentity& identity,
                                                  const ModelConfig& config,
                                                  const ModeOptions& defaults);

// Generate is a raw method: the service parses the request itself (services/common/
// proto_decode.h), so malformed bytes get INVALID_ARGUMENT with a reason, not UNIMPLEMENTED.
class VerifierService final
    : public v1::Verifier::WithRawCallbackMethod_Generate<v1::Verifier::CallbackService> {
 public:
  // `engine` and `metrics` (may be null: no request metrics) are not owned and must outlive
  // the service.
  // `watchdog` > 0: an engine stalled that long with work reports itself stalled (Stalled).
  // `peers`: the cluster token every call must carry (none: every call is answered).
  VerifierService(Engine* engine, VerifierIdentity identity, ModeOptions mode_defaults,
                  ServiceMetrics* metrics = nullptr, absl::Duration watchdog = absl::ZeroDuration(),
                  ApiKeys peers = {});

  // Whether the engine has had work without stepping for the watchdog's time or longer.
  bool Stalled() const;

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* raw) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::WorkerInfoRequest* request,
                                    v1::WorkerInfo* reply) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::WorkerLoadRequest* request,
                                    v1::WorkerLoad* reply) override;

 private:
  Engine* engine_;
  VerifierIdentity identity_;
  ModeOptions mode_defaults_;
  ServiceMetrics* metrics_;
  const absl::Duration watchdog_;
  const ApiKeys peers_;
};

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace tandem
