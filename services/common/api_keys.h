// Optional bearer tokens: the router's API keys (--api-key, TANDEM_ROUTER_API_KEYS) and the
// cluster token the verifiers and drafters check (--cluster-token-file). When any key is set, a
// caller must present one as "Bearer KEY": in the HTTP Authorization header, or in the gRPC
// `authorization` metadata. With no key set every call is allowed.
//
// Thread-safety: immutable after construction; any thread may call the const methods.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace tandem {

class ApiKeys {
 public:
  ApiKeys() = default;
  // Empty strings are dropped (an empty environment variable sets no key).
  explicit ApiKeys(const std::vector<std::string>& keys);

  bool enabled() const { return !keys_.empty(); }

  // Checks an Authorization value ("Bearer KEY"; the scheme is case-insensitive).
  // Unauthenticated, with a message saying what is missing or wrong, when keys are enabled and
  // `authorization` does not carry one of them.
  absl::Status Check(absl::string_view authorization) const;

  // The same check on a gRPC call's `authorization` metadata.
  grpc::Status CheckGrpc(const grpc::ServerContextBase& context) const;

 private:
  std::vector<std::string> keys_;
};

}  // namespace tandem
