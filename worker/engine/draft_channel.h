// The verifier engine's connection to one drafter: drafting sessions of many sequences
// multiplexed over one channel (see proto/tandem/v1/drafter.proto for the protocol). The gRPC
// implementation lives with the services; tests use an in-process one. Keeping the interface
// here keeps gRPC out of worker/.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Draft tokens for sequence indices [from, from + tokens.size()) of one session. A chain whose
// `from` equals the end of the session's previous chain extends it; any other replaces it. A
// non-OK `error` ends the session's drafting (its sequence continues without drafts).
struct DraftChain {
  uint64_t session = 0;
  int from = 0;
  std::vector<int32_t> tokens;
  absl::Status error;
};

class DraftChannel {
 public:
  // Called from any thread, possibly after the channel's calls returned; must not block.
  using ChainCallback = std::function<void(DraftChain)>;

  virtual ~DraftChannel() = default;

  // None of these block on the network. An error means the channel is broken; chains with an
  // error follow for every open session.
  virtual absl::Status Open(uint64_t session, std::span<const int32_t> tokens, int gamma) = 0;
  virtual absl::Status Advance(uint64_t session, int offset, std::span<const int32_t> append,
                               int gamma) = 0;
  virtual void Close(uint64_t session) = 0;
  // False once the channel is broken for good (the engine then opens a new one on the next
  // request that names this drafter).
  virtual bool healthy() const = 0;
};

// Makes a channel to the drafter at `address`; `on_chain` receives every chain.
using DraftChannelFactory = std::function<absl::StatusOr<std::unique_ptr<DraftChannel>>(
    const std::string& address, DraftChannel::ChainCallback on_chain)>;

}  // namespace tandem
