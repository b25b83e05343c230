// grpc.health.v1.Health/Check for a whole server through a generic stub, so that a test needs
// no health proto of its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace tandem::testing {

// The call's status; `serving` (when not null) is whether the answer was SERVING.
inline grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                bool* serving = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  grpc::Status status;
  std::mutex mu;
  std::condition_variable done;
  bool finished = false;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   finished = true;
                   done.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [&] { return finished; });
  if (status.ok() && serving != nullptr) {
    // HealthCheckResponse{status: SERVING} is field 1 varint 1.
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (response.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    *serving = bytes == std::string("\x08\x01", 2);
  }
  return status;
}

}  // namespace tandem::testing
