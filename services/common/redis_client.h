// A small synchronous Redis client over hiredis for the cluster's soft state (the worker
// registry), over TCP or TLS. One connection, made on first use and made again after it breaks: a
// command on a broken connection reconnects at once unless the last attempt failed less than the
// current backoff ago (it doubles from min_backoff to max_backoff while Redis stays away), so a
// caller that polls in a loop never hammers a Redis that is down, and never waits longer than
// `timeout`.
//
// TLS: Debian 12's hiredis (0.14) has none, so with TLS on hiredis only dials the TCP connection
// and formats commands and parses replies (its reader); OpenSSL carries the bytes, after a
// handshake that verifies Redis' certificate against the given CAs and the server's name (or IP
// address), with a client certificate for Redis' `tls-auth-clients`.
//
// Thread-safety: every method may be called from any thread; one mutex serializes commands on
// the connection. Give a thread that must not wait behind others a client of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct redisContext;
struct redisReply;
struct ssl_ctx_st;
struct ssl_st;

namespace tandem {

struct RedisReply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus
  int64_t integer = 0;
  std::vector<RedisReply> elements;  // kArray
};

struct RedisAddress {
  std::string host;
  int port = 0;
};

// "HOST:PORT" (IPv6 as "[::1]:6379"). InvalidArgument names what is wrong.
absl::StatusOr<RedisAddress> ParseRedisAddress(std::string_view host_port);

// How a service and Redis know each other: AUTH with an ACL user (empty: the default user) and a
// file holding the password (empty: no AUTH), so that the password is in no command line; and
// TLS, on when `tls` is set or any TLS file is given.
struct RedisAuth {
  std::string user;
  std::string password_file;
  bool tls = false;
  std::string tls_ca_file;    // CAs that sign Redis' certificate; empty: the system's
  std::string tls_cert_file;  // a client certificate (PEM), with its key, for tls-auth-clients
  std::string tls_key_file;
  std::string tls_server_name;  // the name Redis' certificate must carry; empty: the host
};

class RedisClient {
 public:
  struct Options {
    RedisAddress address;
    absl::Duration timeout = absl::Seconds(1);  // connect and each command
    absl::Duration min_backoff = absl::Milliseconds(200);
    absl::Duration max_backoff = absl::Seconds(5);
    // AUTH after every connect when `password` is set (with `user` when set too). A refused
    // AUTH fails the command as Unauthenticated with Redis' answer, and backs off.
    std::string user;
    std::string password;
    // TLS when set (WithAuth makes it: trusted CAs, client certificate, verification on).
    std::shared_ptr<ssl_ctx_st> tls;
    std::string tls_server_name;  // empty: address.host
  };
  // The options for `address` with the credentials of `auth` (its password file read, its TLS
  // files loaded); InvalidArgument naming the file for an unreadable or empty password file or
  // a TLS file OpenSSL cannot load.
  static absl::StatusOr<Options> WithAuth(RedisAddress address, const RedisAuth& auth);

  explicit RedisClient(Options options);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command, e.g. {"SET", key, value, "PX", "6000"}. Unavailable when Redis cannot be
  // reached (or is backing off); Redis' own error replies are FailedPrecondition with its text.
  absl::StatusOr<RedisReply> Command(const std::vector<std::string>& argv);

  // True while a connection is open (it may still turn out broken on the next command).
  bool connected() const;
  std::string address() const;

 private:
  absl::Status ConnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The TLS handshake on context_'s socket; the reason when it fails.
  absl::Status HandshakeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one command and reads its reply (hiredis' or over TLS); null with *error set when the
  // connection failed (it is then unusable).
  redisReply* RoundTripLocked(std::vector<const char*>& args, const std::vector<size_t>& lengths,
                              std::string* error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BackOffLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  redisContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  ssl_st* ssl_ ABSL_GUARDED_BY(mu_) = nullptr;  // over context_'s socket, with TLS
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tandem
