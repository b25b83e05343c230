// A total deadline for receiving each HTTP request, which cpp-httplib 0.11 does not have.
//
// cpp-httplib times out only between two reads (5 s), so a client that sends its request a byte
// every few seconds holds its connection's thread for as long as it likes, and enough of them
// hold every thread (`--http-max-connections`). RequestDeadline bounds the whole wait: a
// connection on the front's port must deliver each request, headers and body, within `timeout`
// of being accepted or of its previous response ending; one that does not is shut down (its
// thread's read fails, and cpp-httplib closes it). While a handler serves a request (Serve's
// handle lives: for a stream, until its last chunk is written) the connection's clock stands.
//
// cpp-httplib shows neither its sockets nor its connection states, so one thread looks for them
// every `period`: it lists this process's connected sockets whose local port is the front's
// (/proc/self/fd), keeps when each was first seen, and matches them to the handlers' requests by
// their two addresses. A connection's clock is accurate to one period. The shutdown goes through
// a duplicate of the descriptor that is checked to be the same socket (its inode) first, so a
// descriptor closed and reused meanwhile is never touched.
//
// Thread-safety: Serve and the handles' destructors from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

class RequestDeadline {
 public:
  // Watches the connections whose local port is `port`, calling `on_expired` (when set, on the
  // watch's thread) for each one it shuts down; a period of zero picks a quarter of the timeout,
  // at most a second.
  RequestDeadline(int port, absl::Duration timeout, std::function<void()> on_expired = nullptr,
                  absl::Duration period = absl::ZeroDuration());
  ~RequestDeadline();
  RequestDeadline(const RequestDeadline&) = delete;
  RequestDeadline& operator=(const RequestDeadline&) = delete;

  // The connection of a request being served, by its addresses (cpp-httplib's Request's
  // local_addr, local_port, remote_addr, remote_port): its clock stands until the handle is gone.
  class Serving {
   public:
    ~Serving();
    Serving(const Serving&) = delete;
    Serving& operator=(const Serving&) = delete;

   private:
    friend class RequestDeadline;
    Serving(RequestDeadline* deadline, std::string key)
        : deadline_(deadline), key_(std::move(key)) {}
    RequestDeadline* deadline_;
    std::string key_;
  };
  std::shared_ptr<Serving> Serve(const std::string& local_addr, int local_port,
                                 const std::string& remote_addr, int remote_port);

  // Connections shut down for missing the deadline so far.
  int64_t expired() const { return expired_.load(std::memory_order_relaxed); }

 private:
  struct Connection {
    int fd = -1;
    std::string key;
    absl::Time since;   // accepted, or last seen being served
    uint64_t seen = 0;  // the scan that last found it
  };

  void Run();
  void Scan(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& key);

  const int port_;
  const absl::Duration timeout_;
  const std::function<void()> on_expired_;
  const absl::Duration period_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unordered_map<std::string, int> serving_ ABSL_GUARDED_BY(mu_);          // key -> handles
  std::unordered_map<uint64_t, Connection> connections_ ABSL_GUARDED_BY(mu_);  // by inode
  uint64_t scans_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> expired_{0};
  std::thread thread_;
};

}  // namespace tandem
