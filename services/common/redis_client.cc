#include "services/common/redis_client.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem {

namespace {

RedisReply Convert(const redisReply& reply) {
  RedisReply out;
  switch (reply.type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(reply.str, reply.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = reply.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(reply.elements);
      for (size_t i = 0; i < reply.elements; ++i)
        out.elements.push_back(Convert(*reply.element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

}  // namespace

absl::StatusOr<RedisAddress> ParseRedisAddress(std::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Redis address '", std::string(host_port),
                                                   "' is not HOST:PORT (e.g. 127.0.0.1:6379)"));
  }
  RedisAddress address;
  std::string_view host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  address.host = std::string(host);
  const std::string_view port = host_port.substr(colon + 1);
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), address.port);
  if (error != std::errc() || end != port.data() + port.size() || address.port <= 0 ||
      address.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("Redis address '", std::string(host_port), "' has no valid port (1-65535)"));
  }
  return address;
}

absl::StatusOr<RedisClient::Options> RedisClient::WithAuth(RedisAddress address,
                                                           const RedisAuth& auth) {
  Options options{.address = std::move(address), .user = auth.user};
  if (auth.password_file.empty()) {
    if (!auth.user.empty()) {
      return absl::InvalidArgumentError("a Redis user needs its password (--redis-password-file)");
    }
    return options;
  }
  std::ifstream in(auth.password_file, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the Redis password file '", auth.password_file, "'"));
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  options.password = std::string(absl::StripAsciiWhitespace(text));
  if (options.password.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Redis password file '", auth.password_file, "' is empty"));
  }
  return options;
}

RedisClient::RedisClient(Options options)
    : options_(std::move(options)), backoff_(options_.min_backoff) {}

RedisClient::~RedisClient() {
  absl::MutexLock lock(&mu_);
  DropLocked();
}

bool RedisClient::connected() const {
  absl::MutexLock lock(&mu_);
  return context_ != nullptr;
}

std::string RedisClient::address() const {
  return absl::StrCat(options_.address.host, ":", options_.address.port);
}

void RedisClient::DropLocked() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

absl::Status RedisClient::ConnectLocked() {
  const absl::Time now = absl::Now();
  if (now < next_attempt_) {
    return absl::UnavailableError(absl::StrCat("Redis at ", address(),
                                               " is unreachable; next attempt in ",
                                               absl::FormatDuration(next_attempt_ - now)));
  }
  redisContext* context = redisConnectWithTimeout(
      options_.address.host.c_str(), options_.address.port, absl::ToTimeval(options_.timeout));
  if (context == nullptr || context->err != 0) {
    const std::string why = context != nullptr ? context->errstr : "out of memory";
    if (context != nullptr) redisFree(context);
    next_attempt_ = now + backoff_;
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to Redis at ", address(), ": ", why));
  }
  if (redisSetTimeout(context, absl::ToTimeval(options_.timeout)) != REDIS_OK) {
    redisFree(context);
    return absl::UnavailableError(
        absl::StrCat("cannot set a timeout on the Redis connection to ", address()));
  }
  if (!options_.password.empty()) {
    std::vector<const char*> args = {"AUTH"};
    if (!options_.user.empty()) args.push_back(options_.user.c_str());
    args.push_back(options_.password.c_str());
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(context, static_cast<int>(args.size()), args.data(), nullptr));
    std::string refused;
    if (reply == nullptr) {
      refused = context->errstr[0] != '\0' ? context->errstr : "no answer";
    } else if (reply->type == REDIS_REPLY_ERROR) {
      refused.assign(reply->str, reply->len);
    }
    if (reply != nullptr) freeReplyObject(reply);
    if (!refused.empty()) {
      redisFree(context);
      next_attempt_ = now + backoff_;
      backoff_ = std::min(backoff_ * 2, options_.max_backoff);
      return absl::UnauthenticatedError(absl::StrCat("Redis at ", address(), " refused AUTH",
                                                     options_.user.empty() ? "" : " as ",
                                                     options_.user, ": ", refused));
    }
  }
  context_ = context;
  backoff_ = options_.min_backoff;
  next_attempt_ = absl::InfinitePast();
  return absl::OkStatus();
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& argv) {
  absl::MutexLock lock(&mu_);
  if (context_ == nullptr) {
    absl::Status connected = ConnectLocked();
    if (!connected.ok()) return connected;
  }
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  args.reserve(argv.size());
  lengths.reserve(argv.size());
  for (const std::string& arg : argv) {
    args.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  auto* reply = static_cast<redisReply*>(
      redisCommandArgv(context_, static_cast<int>(args.size()), args.data(), lengths.data()));
  if (reply == nullptr) {
    // The connection is unusable after an I/O error or a timeout; the next command reconnects.
    const std::string why = context_->errstr;
    DropLocked();
    next_attempt_ = absl::Now() + backoff_;
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    return absl::UnavailableError(absl::StrCat("Redis at ", address(), ": ", why));
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string error(reply->str, reply->len);
    freeReplyObject(reply);
    return absl::FailedPreconditionError(absl::StrCat("Redis at ", address(), " answered ",
                                                      argv.empty() ? "" : argv[0], ": ", error));
  }
  RedisReply out = Convert(*reply);
  freeReplyObject(reply);
  return out;
}

}  // namespace tandem
