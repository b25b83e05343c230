// Noticing that an HTTP client went away while its handler waits for upstream work.
//
// cpp-httplib 0.11 (Debian 12's) gives a handler no handle on its connection and notices a
// closed one only when it writes the response, so a non-streaming request whose client hung up
// would generate to max_tokens. ConnectionWatch fills that gap on Linux: FindConnectionSocket
// finds the handler's socket by its two addresses (the handler holds it open, so the match is
// that connection), and one epoll thread per watch reports a peer that closed or reset it
// (EPOLLRDHUP, EPOLLHUP, EPOLLERR) to the handler's callback, which cancels the upstream calls.
// A client that only half-closes (shutdown for writing) and still waits for the answer counts
// as gone: HTTP clients do not do that.
//
// Thread-safety: Watch and the Watched handles' destructors from any thread; callbacks run on
// the watch's thread, one at a time, never after their handle's destructor has returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

// The two ends of connected TCP socket `fd`, numeric hosts as cpp-httplib's Request holds them;
// false for a descriptor that is not a connected IPv4/IPv6 socket.
struct SocketEnds {
  std::string local_addr;
  int local_port = 0;
  std::string remote_addr;
  int remote_port = 0;
};
bool ConnectedEnds(int fd, SocketEnds* ends);

// Calls `visit(fd, ends)` for each of this process's connected TCP sockets (from /proc/self/fd)
// until it returns false.
void ForEachConnectedSocket(const std::function<bool(int fd, const SocketEnds& ends)>& visit);

// The descriptor of this process's TCP socket whose local end is local_addr:local_port and
// whose peer is remote_addr:remote_port (numeric hosts, as cpp-httplib's Request holds them),
// or -1 when there is none.
int FindConnectionSocket(const std::string& local_addr, int local_port,
                         const std::string& remote_addr, int remote_port);

class ConnectionWatch {
 public:
  // Internal naming the call when epoll or its wake-up descriptor cannot be created.
  static absl::StatusOr<std::unique_ptr<ConnectionWatch>> Create();
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

  // A socket being watched; the destructor stops the watch (before the socket may close).
  class Watched {
   public:
    ~Watched();
    Watched(const Watched&) = delete;
    Watched& operator=(const Watched&) = delete;

   private:
    friend class ConnectionWatch;
    Watched(ConnectionWatch* watch, uint64_t id) : watch_(watch), id_(id) {}
    ConnectionWatch* watch_;
    uint64_t id_;
  };

  // Calls `on_closed` once, on the watch's thread, when the peer of socket `fd` closes or
  // resets the connection (at once if it already has). Null when epoll refuses the descriptor.
  std::unique_ptr<Watched> Watch(int fd, std::function<void()> on_closed);

 private:
  ConnectionWatch(int epoll_fd, int wake_fd);
  void Run();
  void Unwatch(uint64_t id);

  const int epoll_fd_;
  const int wake_fd_;  // an eventfd: written once to stop Run
  absl::Mutex mu_;
  struct Entry {
    int fd;
    std::function<void()> on_closed;
  };
  std::unordered_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;  // 0 is the wake-up descriptor's
  std::thread thread_;
};

}  // namespace tandem
