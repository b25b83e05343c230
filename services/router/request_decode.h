// Decoding the router's Generate request from the bytes on the wire, and converting it to the
// native request the router's checks read.
//
// The router registers Generate as a raw method and parses the request itself: protobuf
// (3.21) refuses a proto3 string field holding invalid UTF-8, and when gRPC (1.51) fails to
// parse a callback method's request, the call ends before any handler runs with UNIMPLEMENTED
// and an empty message (protobuf logs the field to the server's stderr). Parsing here lets the
// router answer INVALID_ARGUMENT naming the field, and keep serving.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "router/request_check.h"
#include "tandem/v1/generate.pb.h"

namespace tandem {

// The largest request the router accepts (gRPC's default receive limit). Larger ones are
// InvalidArgument; the server's own limit is set above this so that they reach the check.
inline constexpr size_t kMaxGenerateRequestBytes = 4 << 20;

// InvalidArgument for a request over `max_bytes`, a string field that is not UTF-8 (naming the
// field, e.g. chat.messages[1].content) or bytes that are not a GenerateRequest.
absl::StatusOr<v1::GenerateRequest> DecodeGenerateRequest(
    const grpc::ByteBuffer& buffer, size_t max_bytes = kMaxGenerateRequestBytes);

router::RouterRequest ToRouterRequest(const v1::GenerateRequest& request);

}  // namespace tandem
