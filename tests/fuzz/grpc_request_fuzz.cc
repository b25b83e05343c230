// libFuzzer target for the gRPC request decoders: the bytes on the wire of the router's raw
// Generate method (services/router/request_decode.h, then the router's checks) and of the
// verifier's (services/common/proto_decode.h into a VerifyRequest). Decoding may refuse
// (InvalidArgument with the reason), never crash or hang; a request that decodes is checked as
// the router checks it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "router/request_check.h"
#include "services/common/proto_decode.h"
#include "services/router/request_decode.h"
#include "tandem/v1/verifier.pb.h"

namespace {

const tandem::router::ModelDescription& Model() {
  static const tandem::router::ModelDescription model{
      .id = "tandem-target", .modes = {"ar", "spec", "jacobi"}, .max_context = 4096};
  return model;
}

void ExpectInvalidArgument(const absl::Status& status) {
  if (status.ok() || absl::IsInvalidArgument(status)) return;
  std::fprintf(stderr, "grpc_request_fuzz: a refusal that is not InvalidArgument: %s\n",
               status.ToString().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  const grpc::ByteBuffer buffer(&slice, 1);

  absl::StatusOr<tandem::v1::GenerateRequest> generate = tandem::DecodeGenerateRequest(buffer);
  ExpectInvalidArgument(generate.status());
  if (generate.ok()) {
    ExpectInvalidArgument(
        tandem::router::CheckRequest(tandem::ToRouterRequest(*generate), Model()));
  }

  tandem::v1::VerifyRequest verify;
  ExpectInvalidArgument(tandem::DecodeProto(buffer, 4 << 20, "verifier", &verify));
  return 0;
}
