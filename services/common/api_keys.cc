#include "services/common/api_keys.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace tandem {

namespace {

// Compares in time that depends only on the lengths, so that the time of a refusal does not
// tell how much of a guessed key was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    std::string trimmed(absl::StripAsciiWhitespace(key));
    if (!trimmed.empty()) keys_.push_back(std::move(trimmed));
  }
}

absl::Status ApiKeys::Check(absl::string_view authorization) const {
  if (keys_.empty()) return absl::OkStatus();
  authorization = absl::StripAsciiWhitespace(authorization);
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "this router requires an API key: send the header 'Authorization: Bearer KEY'");
  }
  constexpr absl::string_view kBearer = "bearer ";
  if (authorization.size() <= kBearer.size() ||
      !absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return absl::UnauthenticatedError("the Authorization header must read 'Bearer KEY'");
  }
  const absl::string_view key = absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  bool found = false;
  for (const std::string& allowed : keys_) found |= ConstantTimeEquals(key, allowed);
  if (!found) return absl::UnauthenticatedError("invalid API key");
  return absl::OkStatus();
}

grpc::Status ApiKeys::CheckGrpc(const grpc::ServerContextBase& context) const {
  if (keys_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  const absl::string_view value = it == metadata.end()
                                      ? absl::string_view()
                                      : absl::string_view(it->second.data(), it->second.size());
  absl::Status status = Check(value);
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (it == metadata.end()) {
    message = "this router requires an API key: send the metadata 'authorization: Bearer KEY'";
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}

}  // namespace tandem
