// DraftChannel over gRPC: one bidirectional Draft stream to a drafter service multiplexes the
// drafting sessions of one verifier (proto/tandem/v1/drafter.proto).
//
// Open/Advance/Close queue a message and return at once; one write is in flight at a time and
// at most `max_queued` wait behind it (a drafter that stops reading breaks the channel rather
// than growing the queue). Chains read from the stream go to the ChainCallback on gRPC threads.
// When the stream ends for any reason (drafter killed, network, queue overflow), healthy()
// turns false for good and every open session receives one chain with an UNAVAILABLE error.
// At creation the channel also asks the drafter (GetInfo, in the background) which target
// layers' hidden states it wants; hidden_layers() is empty until the answer arrives (sessions
// opened before then send none) and stays empty if it never does.
//
// Hidden states travel as in-stream bytes unless the answer says the drafter can receive them
// by NCCL and ChooseHiddenTransport (services/common/hidden_transport.h) picks NCCL: the channel
// then sends a HiddenTransportSetup on the stream, joins the communicator in the background and
// switches to NCCL once the drafter says ready; a failure falls back to bytes, or, when NCCL
// was required (either side's --hidden-transport nccl), breaks the channel with the reason.
// The choice is logged once per stream and counted in tandem_hidden_transport_streams_total.
// Rows past kMaxHiddenBytesPerMessage travel in several messages (SplitHiddenRows). A stream
// that breaks is logged with its reason and counted in tandem_draft_stream_breaks_total.
//
// Thread-safety: Open, Advance, Close and healthy() may be called from any thread, but not
// concurrently with the destructor. The destructor cancels the stream and waits for it to end
// (so it must not run inside the callback); the callback is not called after it returns.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "services/common/hidden_transport.h"
#include "services/common/server.h"
#include "worker/engine/draft_channel.h"

namespace tandem {

class ServiceMetrics;

// The verifier's side of the hidden-state transport choice.
struct DraftHiddenTransportOptions {
  // From LocalHiddenTransport(--hidden-transport); the default never uses NCCL.
  HiddenTransportEnd local{.mode = HiddenTransportMode::kBytes,
                           .why_not = "this verifier is not set up for NCCL"};
  NcclHiddenOptions nccl;             // `device` is taken from `local`
  ServiceMetrics* metrics = nullptr;  // may be null
  std::string log_name = "tandem-verifier";
};

// The most bytes of hidden-state rows one Draft stream message carries. Real sizes exceed gRPC's
// default 4 MiB receive limit: hidden 4096 with 5 tapped layers is 40 KiB a token, so one
// 256-token prefill chunk's rows are 10 MiB; in pieces of 1 MiB every message stays well under
// the limit, and no service needs a raised one.
inline constexpr size_t kMaxHiddenBytesPerMessage = size_t{1} << 20;

// One message's share of an open or advance whose rows are too many for one message: its rows,
// and the tokens [append_begin, append_end) of the advance's `append` that go with them.
struct HiddenPiece {
  int append_begin = 0;
  int append_end = 0;
  HiddenRows rows;
};

// The messages, in order, of an advance appending `append` tokens to a drafter session that has
// `have`, with host `rows`: pieces of at most `max_bytes` of rows (one token's rows at least),
// each with the appended tokens its rows need (a drafter takes no row before its token), the
// last with the rest. One piece, the whole advance, when the rows fit or live on a device.
std::vector<HiddenPiece> SplitHiddenRows(int have, int append, const HiddenRows& rows,
                                         size_t max_bytes);

class GrpcDraftChannel final : public DraftChannel {
 public:
  // Starts the stream on `channel` (connecting happens in the background: a drafter that cannot
  // be reached shows up as error chains and healthy() == false).
  static std::unique_ptr<GrpcDraftChannel> Create(std::shared_ptr<grpc::Channel> channel,
                                                  std::string address, ChainCallback on_chain,
                                                  size_t max_queued = 4096,
                                                  DraftHiddenTransportOptions hidden = {});
  ~GrpcDraftChannel() override;

  using DraftChannel::Advance;
  using DraftChannel::Open;
  absl::Status Open(uint64_t session, std::span<const int32_t> tokens, int gamma,
                    const HiddenRows& hidden, int block_size,
                    const std::optional<DraftGrammar>& grammar) override;
  absl::Status Advance(uint64_t session, int offset, std::span<const int32_t> append, int gamma,
                       const HiddenRows& hidden) override;
  void Close(uint64_t session) override;
  bool healthy() const override;
  bool connected() const override;  // the gRPC channel is READY
  std::vector<int32_t> hidden_layers() const override;
  // Waits up to `timeout` for the drafter's GetInfo answer (or its failure); true once it came.
  bool WaitForInfo(absl::Duration timeout) const;
  // The transport the next hidden states go by.
  HiddenTransportKind hidden_transport() const;

 private:
  class Stream;
  struct Core;

  explicit GrpcDraftChannel(std::shared_ptr<Core> core);
  // One Advance message.
  absl::Status SendAdvance(uint64_t session, int offset, std::span<const int32_t> append, int gamma,
                           const HiddenRows& hidden);

  std::shared_ptr<Core> core_;
};

// Channels to drafters with the given client TLS settings (insecure when `tls.ca` is empty).
DraftChannelFactory MakeGrpcDraftChannelFactory(ClientFlags tls,
                                                DraftHiddenTransportOptions hidden = {});

}  // namespace tandem
