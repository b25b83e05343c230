// The NCCL hidden-state transport (built with the CUDA backend only; the interface and the
// setup protocol are in services/common/hidden_transport.h and proto/tandem/v1/drafter.proto).
//
// Each side of a stream owns one 2-rank communicator (verifier rank 0, drafter rank 1), made
// nonblocking and driven by one thread per endpoint, so that no gRPC thread ever waits on NCCL:
//   - sender (verifier): Encode copies the rows and queues them; the thread stages each payload
//     through pinned host memory into a device buffer (cudaMemcpyAsync) and ncclSends it on the
//     endpoint's CUDA stream, one payload after the other, in Encode order.
//   - receiver (drafter): Receive queues messages in stream order; the thread ncclRecvs each NCCL
//     payload into a device buffer (where a drafter on the same GPU takes it as
//     HiddenRows::device, see NcclHiddenOptions::device_sink; otherwise it is copied back into
//     host HiddenRows) and runs the messages' callbacks in order. Bytes messages that arrive with
//     nothing pending are delivered inline.
// Every wait polls ncclCommGetAsyncError against a deadline: a peer that vanished, or a payload
// that never comes, aborts the communicator (ncclCommAbort) instead of hanging; from then on the
// endpoint reports the failure and NCCL payloads fail (the sender falls back to bytes).
#pragma once

#include "services/common/hidden_transport.h"

namespace tandem {

// Fills `end` (nccl, why_not, gpu_uuid, device) from the current CUDA device.
void ProbeHiddenNccl(HiddenTransportEnd* end);

}  // namespace tandem
