// Decoding a request message from the bytes on the wire, for services that register a method as
// raw and parse the request themselves.
//
// protobuf (3.21) refuses a proto3 string field holding invalid UTF-8, and when gRPC (1.51) fails
// to parse a callback method's request, the call ends before any handler runs with
// UNIMPLEMENTED and an empty message (protobuf logs the field to the server's stderr). Parsing
// here answers INVALID_ARGUMENT naming the field, and the service keeps serving.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace tandem {

// Parses `buffer` into `out`. InvalidArgument for a request over `max_bytes` (`who` names the
// service in the message, e.g. "router"), a string field that is not UTF-8 (naming the field,
// e.g. chat.messages[1].content) or bytes that are not a message of `out`'s type.
absl::Status DecodeProto(const grpc::ByteBuffer& buffer, size_t max_bytes, std::string_view who,
                         google::protobuf::Message* out);

}  // namespace tandem
