// A verifier engine speculating against a drafter service on a loopback port, as tandem-verifier
// and tandem-drafter do (gRPC draft channels, hidden states as in-stream bytes): the tests that
// run `spec` through a real DrafterService over a DraftEngine of their own.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "services/common/server.h"
#include "services/drafter/drafter_service.h"
#include "services/verifier/grpc_draft_channel.h"
#include "tests/worker/engine/collecting_sink.h"
#include "worker/engine/draft_engine.h"
#include "worker/engine/engine.h"

namespace tandem::testing {

class LoopbackSpec {
 public:
  // Serves `drafter` (not owned; outlives this) on 127.0.0.1 with gRPC's default limits, and
  // makes an engine on `target` (not owned) whose default drafter it is.
  static absl::StatusOr<std::unique_ptr<LoopbackSpec>> Create(LoadedModel* target,
                                                              DraftEngine* drafter,
                                                              const std::string& model_id,
                                                              EngineOptions options) {
    std::unique_ptr<LoopbackSpec> spec(new LoopbackSpec(drafter, model_id));
    absl::StatusOr<RunningServer> server =
        StartServer({.listen = "127.0.0.1:0"}, {&spec->service_});
    if (!server.ok()) return server.status();
    spec->server_ = *std::move(server);
    options.default_drafter = spec->server_.address;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(target, options, MakeGrpcDraftChannelFactory({}));
    if (!engine.ok()) return engine.status();
    spec->engine_ = *std::move(engine);
    return spec;
  }

  // The engine goes first (its channels close their streams), then the server.
  ~LoopbackSpec() {
    engine_.reset();
    if (server_.server) {
      server_.server->Shutdown(std::chrono::system_clock::now());
      server_.server->Wait();
    }
  }

  // Submits `request` and waits for its last event, which must not be an error.
  std::shared_ptr<CollectingSink> Run(SequenceRequest request) {
    auto sink = std::make_shared<CollectingSink>();
    absl::StatusOr<uint64_t> id = engine_->Submit(std::move(request), sink);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return sink;
    EXPECT_TRUE(sink->Wait());
    EXPECT_TRUE(sink->error().ok()) << sink->error();
    return sink;
  }

 private:
  LoopbackSpec(DraftEngine* drafter, const std::string& model_id)
      : service_(drafter, {.model_id = model_id}) {}

  DrafterService service_;
  RunningServer server_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace tandem::testing
