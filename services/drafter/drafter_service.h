// The Drafter gRPC service (proto/tandem/v1/drafter.proto) over a DraftEngine.
//
// Each Draft call is one verifier's stream: a reactor reads its messages and posts them to the
// engine as that stream's sessions; the engine's chains go to a ChainOutbox and are written one
// at a time. When the stream ends (the verifier closed or cancelled it, or it broke) its
// sessions are closed. Protocol errors end only the session concerned, with an error chain.
// Hidden states arrive as in-stream bytes, or by NCCL once the verifier set that up on the
// stream (HiddenTransportSetup; services/common/hidden_transport.h): every message then passes
// through the stream's HiddenReceiver, which keeps the messages in order while a payload is on
// its way, and a payload that fails ends its session with an error chain. With a device sink
// (a DFlash drafter on the receiver's GPU) NCCL payloads stay on the GPU.
//
// Thread-safety: the service is called by gRPC threads; the engine must outlive the server
// (shut the server down first).
#pragma once

#include <atomic>
#include <string>

#include "grpcpp/grpcpp.h"
#include "services/common/api_keys.h"
#include "services/common/hidden_transport.h"
#include "tandem/v1/drafter.grpc.pb.h"
#include "worker/engine/draft_engine.h"

namespace tandem {

class ServiceMetrics;

struct DrafterServiceOptions {
  std::string model_id;   // the checkpoint's directory name
  std::string worker_id;  // unique per process
  // Chains waiting for one stream's reader before the stream is ended (see ChainOutbox).
  size_t max_queued_chains = 4096;
  // How hidden states may arrive (advertised in GetInfo; from LocalHiddenTransport of
  // --hidden-transport). The default takes bytes only.
  HiddenTransportEnd hidden_transport{.mode = HiddenTransportMode::kBytes,
                                      .why_not = "this drafter is not set up for NCCL"};
  NcclHiddenOptions nccl;  // `device` is taken from `hidden_transport`
  // For a DFlash drafter on CUDA (NewDeviceHiddenSink): NCCL payloads that land on its GPU go to
  // the engine as device rows (HiddenRows::device) without a host copy. A stream whose receiver
  // is on another GPU keeps the host path.
  DeviceHiddenSink device_sink;
  ServiceMetrics* metrics = nullptr;  // may be null
  ApiKeys peers;  // the cluster token every call must carry (none: every call is answered)
  // Structured output: sessions opened with a grammar draft under it (compiled here, over the
  // drafter's vocabulary). Null: grammars are ignored and such sessions draft free text. Not
  // owned; must outlive the service.
  const GrammarCompiler* grammars = nullptr;
};

class DrafterService final : public tandem::v1::Drafter::CallbackService {
 public:
  DrafterService(DraftEngine* engine, DrafterServiceOptions options);

  grpc::ServerBidiReactor<tandem::v1::DraftClientMessage, tandem::v1::DraftChain>* Draft(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const tandem::v1::WorkerInfoRequest* request,
                                    tandem::v1::WorkerInfo* info) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const tandem::v1::WorkerLoadRequest* request,
                                    tandem::v1::WorkerLoad* load) override;

  // Reported in GetLoad once shutdown has begun.
  void SetDraining() { draining_ = true; }

 private:
  DraftEngine* engine_;
  DrafterServiceOptions options_;
  std::atomic<bool> draining_{false};
};

// A worker id unique to this process: "<role>-<hostname>-<pid>-<random hex>".
std::string MakeWorkerId(const std::string& role);

}  // namespace tandem
