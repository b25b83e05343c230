#include "services/common/redis_client.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
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

// Blocks SIGPIPE on the calling thread while it lives, and swallows one raised meanwhile: a write
// to a connection Redis closed then fails with EPIPE instead of killing the process (hiredis and
// OpenSSL write with write(2), not send(MSG_NOSIGNAL)).
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// OpenSSL's oldest queued error on this thread (the queue is emptied).
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no error reported";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// Why SSL_read/SSL_write returned `result` (<= 0).
std::string TlsIoError(SSL* ssl, int result) {
  const int error = errno;
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_ZERO_RETURN:
      return "the connection was closed";
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return "timed out";
    case SSL_ERROR_SYSCALL:
      if (error == EAGAIN || error == EWOULDBLOCK) return "timed out";
      return error == 0 ? "the connection was closed" : strerror(error);
    default:
      return absl::StrCat("TLS error: ", OpenSslError());
  }
}

// A client context that verifies the server against `auth`'s CAs (or the system's) and presents
// its client certificate when one is given.
absl::StatusOr<std::shared_ptr<ssl_ctx_st>> MakeTlsContext(const RedisAuth& auth) {
  if (auth.tls_cert_file.empty() != auth.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a Redis TLS client certificate and its key go together (--redis-tls-cert and "
        "--redis-tls-key)");
  }
  ERR_clear_error();
  std::shared_ptr<ssl_ctx_st> context(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (context == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create a TLS context: ", OpenSslError()));
  }
  SSL_CTX_set_min_proto_version(context.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER, nullptr);
  const bool cas =
      auth.tls_ca_file.empty()
          ? SSL_CTX_set_default_verify_paths(context.get()) == 1
          : SSL_CTX_load_verify_locations(context.get(), auth.tls_ca_file.c_str(), nullptr) == 1;
  if (!cas) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load the CAs for Redis TLS from ",
                     auth.tls_ca_file.empty() ? "the system's store" : "'" + auth.tls_ca_file + "'",
                     ": ", OpenSslError()));
  }
  if (!auth.tls_cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(context.get(), auth.tls_cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("cannot load the Redis TLS certificate '",
                                                     auth.tls_cert_file, "': ", OpenSslError()));
    }
    if (SSL_CTX_use_PrivateKey_file(context.get(), auth.tls_key_file.c_str(), SSL_FILETYPE_PEM) !=
            1 ||
        SSL_CTX_check_private_key(context.get()) != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot load the Redis TLS key '", auth.tls_key_file,
                       "' (or it does not match the certificate): ", OpenSslError()));
    }
  }
  return context;
}

bool IsIpAddress(const std::string& host) {
  unsigned char address[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), address) == 1 ||
         inet_pton(AF_INET6, host.c_str(), address) == 1;
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
  if (auth.tls || !auth.tls_ca_file.empty() || !auth.tls_cert_file.empty() ||
      !auth.tls_key_file.empty() || !auth.tls_server_name.empty()) {
    absl::StatusOr<std::shared_ptr<ssl_ctx_st>> tls = MakeTlsContext(auth);
    if (!tls.ok()) return tls.status();
    options.tls = *std::move(tls);
    options.tls_server_name = auth.tls_server_name;
  }
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
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = nullptr;
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

void RedisClient::BackOffLocked(absl::Time now) {
  next_attempt_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
}

absl::Status RedisClient::HandshakeLocked() {
  ERR_clear_error();
  ssl_ = SSL_new(options_.tls.get());
  if (ssl_ == nullptr || SSL_set_fd(ssl_, context_->fd) != 1) {
    return absl::InternalError(absl::StrCat("cannot start TLS: ", OpenSslError()));
  }
  // The name (or address) Redis' certificate must carry; SNI for a name.
  const std::string& name =
      options_.tls_server_name.empty() ? options_.address.host : options_.tls_server_name;
  const bool named = IsIpAddress(name)
                         ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), name.c_str()) == 1
                         : SSL_set_tlsext_host_name(ssl_, name.c_str()) == 1 &&
                               SSL_set1_host(ssl_, name.c_str()) == 1;
  if (!named) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a name TLS can verify: ", OpenSslError()));
  }
  // The socket's send and receive timeouts (redisSetTimeout) bound the handshake.
  const int result = SSL_connect(ssl_);
  if (result == 1) return absl::OkStatus();
  const long verified = SSL_get_verify_result(ssl_);
  const std::string why = verified != X509_V_OK
                              ? absl::StrCat("its certificate is not trusted for '", name,
                                             "': ", X509_verify_cert_error_string(verified))
                              : TlsIoError(ssl_, result);
  return absl::UnavailableError(
      absl::StrCat("TLS handshake with Redis at ", address(), " failed: ", why));
}

redisReply* RedisClient::RoundTripLocked(std::vector<const char*>& args,
                                         const std::vector<size_t>& lengths, std::string* error) {
  const SigpipeBlock no_sigpipe;
  const int argc = static_cast<int>(args.size());
  if (ssl_ == nullptr) {
    auto* reply =
        static_cast<redisReply*>(redisCommandArgv(context_, argc, args.data(), lengths.data()));
    if (reply == nullptr) *error = context_->errstr[0] != '\0' ? context_->errstr : "no answer";
    return reply;
  }
  char* command = nullptr;
  const int length = redisFormatCommandArgv(&command, argc, args.data(), lengths.data());
  if (length < 0) {
    *error = "out of memory";
    return nullptr;
  }
  ERR_clear_error();
  for (int sent = 0; sent < length;) {
    const int n = SSL_write(ssl_, command + sent, length - sent);
    if (n <= 0) {
      *error = TlsIoError(ssl_, n);
      redisFreeCommand(command);
      return nullptr;
    }
    sent += n;
  }
  redisFreeCommand(command);
  char buffer[16384];
  while (true) {
    void* reply = nullptr;
    if (redisReaderGetReply(context_->reader, &reply) != REDIS_OK) {
      *error = absl::StrCat("malformed reply: ", context_->reader->errstr);
      return nullptr;
    }
    if (reply != nullptr) return static_cast<redisReply*>(reply);
    const int n = SSL_read(ssl_, buffer, sizeof(buffer));
    if (n <= 0) {
      *error = TlsIoError(ssl_, n);
      return nullptr;
    }
    if (redisReaderFeed(context_->reader, buffer, static_cast<size_t>(n)) != REDIS_OK) {
      *error = "out of memory";
      return nullptr;
    }
  }
}

absl::Status RedisClient::ConnectLocked() {
  const absl::Time now = absl::Now();
  if (now < next_attempt_) {
    return absl::UnavailableError(absl::StrCat("Redis at ", address(),
                                               " is unreachable; next attempt in ",
                                               absl::FormatDuration(next_attempt_ - now)));
  }
  context_ = redisConnectWithTimeout(options_.address.host.c_str(), options_.address.port,
                                     absl::ToTimeval(options_.timeout));
  if (context_ == nullptr || context_->err != 0) {
    const std::string why = context_ != nullptr ? context_->errstr : "out of memory";
    DropLocked();
    BackOffLocked(now);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to Redis at ", address(), ": ", why));
  }
  if (redisSetTimeout(context_, absl::ToTimeval(options_.timeout)) != REDIS_OK) {
    DropLocked();
    return absl::UnavailableError(
        absl::StrCat("cannot set a timeout on the Redis connection to ", address()));
  }
  if (options_.tls != nullptr) {
    absl::Status handshake;
    {
      const SigpipeBlock no_sigpipe;
      handshake = HandshakeLocked();
    }
    if (!handshake.ok()) {
      DropLocked();
      BackOffLocked(now);
      return handshake;
    }
  }
  if (!options_.password.empty()) {
    std::vector<const char*> args = {"AUTH"};
    if (!options_.user.empty()) args.push_back(options_.user.c_str());
    args.push_back(options_.password.c_str());
    std::vector<size_t> lengths;
    for (const char* arg : args) lengths.push_back(strlen(arg));
    std::string failed;
    redisReply* reply = RoundTripLocked(args, lengths, &failed);
    if (reply == nullptr) {  // no answer: the connection failed, not the credentials
      DropLocked();
      BackOffLocked(now);
      return absl::UnavailableError(absl::StrCat("Redis at ", address(), ": ", failed));
    }
    std::string refused;
    if (reply->type == REDIS_REPLY_ERROR) refused.assign(reply->str, reply->len);
    freeReplyObject(reply);
    if (!refused.empty()) {
      DropLocked();
      BackOffLocked(now);
      return absl::UnauthenticatedError(absl::StrCat("Redis at ", address(), " refused AUTH",
                                                     options_.user.empty() ? "" : " as ",
                                                     options_.user, ": ", refused));
    }
  }
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
  std::string why;
  redisReply* reply = RoundTripLocked(args, lengths, &why);
  if (reply == nullptr) {
    // The connection is unusable after an I/O error or a timeout; the next command reconnects.
    DropLocked();
    BackOffLocked(absl::Now());
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
