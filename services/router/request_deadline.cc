#include "services/router/request_deadline.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/router/connection_watch.h"

namespace tandem {

namespace {

std::string KeyOf(const std::string& local_addr, int local_port, const std::string& remote_addr,
                  int remote_port) {
  return absl::StrCat(local_addr, " ", local_port, " ", remote_addr, " ", remote_port);
}

struct Found {
  int fd;
  uint64_t inode;
  std::string key;
};

// This process's connected sockets whose local port is `port`.
std::vector<Found> ConnectionsOn(int port) {
  std::vector<Found> found;
  ForEachConnectedSocket([&](int fd, const SocketEnds& ends) {
    struct stat st {};
    if (ends.local_port == port && fstat(fd, &st) == 0) {
      found.push_back(
          Found{fd, static_cast<uint64_t>(st.st_ino),
                KeyOf(ends.local_addr, ends.local_port, ends.remote_addr, ends.remote_port)});
    }
    return true;
  });
  return found;
}

// A duplicate of descriptor `fd` while it is still socket `inode`, else -1 (closed, or reused
// for another file meanwhile). The duplicate keeps that socket open until it is closed.
int DuplicateIfSame(int fd, uint64_t inode) {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return -1;
  struct stat st {};
  if (fstat(copy, &st) == 0 && static_cast<uint64_t>(st.st_ino) == inode) return copy;
  close(copy);
  return -1;
}

}  // namespace

RequestDeadline::RequestDeadline(int port, absl::Duration timeout, std::function<void()> on_expired,
                                 absl::Duration period)
    : port_(port),
      timeout_(timeout),
      on_expired_(std::move(on_expired)),
      period_(period > absl::ZeroDuration() ? period : std::min(timeout / 4, absl::Seconds(1))),
      thread_([this] { Run(); }) {}

RequestDeadline::~RequestDeadline() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::shared_ptr<RequestDeadline::Serving> RequestDeadline::Serve(const std::string& local_addr,
                                                                 int local_port,
                                                                 const std::string& remote_addr,
                                                                 int remote_port) {
  std::string key = KeyOf(local_addr, local_port, remote_addr, remote_port);
  absl::MutexLock lock(&mu_);
  ++serving_[key];
  return std::shared_ptr<Serving>(new Serving(this, std::move(key)));
}

RequestDeadline::Serving::~Serving() { deadline_->Release(key_); }

void RequestDeadline::Release(const std::string& key) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = serving_.find(key);
  if (it == serving_.end()) return;
  if (--it->second > 0) return;
  serving_.erase(it);
  // The clock of the next request starts now, not at the next scan.
  for (auto& [inode, connection] : connections_) {
    if (connection.key == key) connection.since = now;
  }
}

void RequestDeadline::Run() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) {
    mu_.Unlock();
    Scan(absl::Now());
    mu_.Lock();
  }
}

void RequestDeadline::Scan(absl::Time now) {
  std::vector<Found> found = ConnectionsOn(port_);  // without the lock: syscalls per descriptor
  std::vector<std::pair<int, uint64_t>> expired;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t scan = ++scans_;
    for (Found& socket : found) {
      auto [it, added] = connections_.try_emplace(socket.inode);
      Connection& connection = it->second;
      if (added || connection.key != socket.key) {
        connection.key = std::move(socket.key);
        connection.since = now;
      }
      connection.fd = socket.fd;
      connection.seen = scan;
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      Connection& connection = it->second;
      if (connection.seen != scan) {  // closed
        it = connections_.erase(it);
        continue;
      }
      if (serving_.contains(connection.key)) {
        connection.since = now;
      } else if (now - connection.since > timeout_) {
        expired.emplace_back(connection.fd, it->first);
        connection.since = now;  // once per timeout at most, should the shutdown not end it
      }
      ++it;
    }
  }
  for (const auto& [fd, inode] : expired) {
    const int copy = DuplicateIfSame(fd, inode);
    if (copy < 0) continue;
    expired_.fetch_add(1, std::memory_order_relaxed);  // before the client can see the close
    if (on_expired_) on_expired_();
    shutdown(copy, SHUT_RDWR);
    close(copy);
  }
}

}  // namespace tandem
