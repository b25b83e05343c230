// A small synchronous Redis client over hiredis for the cluster's soft state (the worker
// registry). One connection, made on first use and made again after it breaks: a command on a
// broken connection reconnects at once unless the last attempt failed less than the current
// backoff ago (it doubles from min_backoff to max_backoff while Redis stays away), so a caller
// that polls in a loop never hammers a Redis that is down, and never waits longer than `timeout`.
//
// Thread-safety: every method may be called from any thread; one mutex serializes commands on
// the connection. Give a thread that must not wait behind others a client of its own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

struct redisContext;

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

// How a service authenticates to Redis (AUTH): an ACL user (empty: the default user) and a file
// holding the password (empty: no AUTH), so that the password is in no command line.
struct RedisAuth {
  std::string user;
  std::string password_file;
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
  };
  // The options for `address` with the credentials of `auth` (its password file read);
  // InvalidArgument for an unreadable or empty password file.
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
  void DropLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  redisContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  absl::Time next_attempt_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace tandem
