#include "services/router/connection_watch.h"

#include <dirent.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

namespace {

// The numeric host and port of a socket address, as cpp-httplib writes them.
bool HostPort(const sockaddr_storage& address, socklen_t length, std::string* host, int* port) {
  char name[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, name, sizeof(name), service,
                  sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *host = name;
  return absl::SimpleAtoi(service, port);
}

}  // namespace

bool ConnectedEnds(int fd, SocketEnds* ends) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  // Not a socket (ENOTSOCK), or not connected: no ends.
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  if (address.ss_family != AF_INET && address.ss_family != AF_INET6) return false;
  if (!HostPort(address, length, &ends->local_addr, &ends->local_port)) return false;
  length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  return HostPort(address, length, &ends->remote_addr, &ends->remote_port);
}

void ForEachConnectedSocket(const std::function<bool(int fd, const SocketEnds& ends)>& visit) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  SocketEnds ends;
  while (const dirent* entry = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(dir)) continue;
    if (ConnectedEnds(fd, &ends) && !visit(fd, ends)) break;
  }
  closedir(dir);
}

int FindConnectionSocket(const std::string& local_addr, int local_port,
                         const std::string& remote_addr, int remote_port) {
  int found = -1;
  ForEachConnectedSocket([&](int fd, const SocketEnds& ends) {
    if (ends.local_port == local_port && ends.remote_port == remote_port &&
        ends.local_addr == local_addr && ends.remote_addr == remote_addr) {
      found = fd;
      return false;
    }
    return true;
  });
  return found;
}

absl::StatusOr<std::unique_ptr<ConnectionWatch>> ConnectionWatch::Create() {
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return absl::InternalError(absl::StrCat("epoll_create1: ", strerror(errno)));
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    const int error = errno;
    close(epoll_fd);
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(error)));
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = 0;
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &event) != 0) {
    const int error = errno;
    close(wake_fd);
    close(epoll_fd);
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(error)));
  }
  return std::unique_ptr<ConnectionWatch>(new ConnectionWatch(epoll_fd, wake_fd));
}

ConnectionWatch::ConnectionWatch(int epoll_fd, int wake_fd)
    : epoll_fd_(epoll_fd), wake_fd_(wake_fd), thread_([this] { Run(); }) {}

ConnectionWatch::~ConnectionWatch() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) std::abort();  // Run would not end
  thread_.join();
  close(wake_fd_);
  close(epoll_fd_);
}

std::unique_ptr<ConnectionWatch::Watched> ConnectionWatch::Watch(int fd,
                                                                 std::function<void()> on_closed) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  epoll_event event{};
  event.events = EPOLLRDHUP;  // EPOLLHUP and EPOLLERR are always reported
  event.data.u64 = id;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) return nullptr;
  entries_.emplace(id, Entry{fd, std::move(on_closed)});
  return std::unique_ptr<Watched>(new Watched(this, id));
}

ConnectionWatch::Watched::~Watched() { watch_->Unwatch(id_); }

void ConnectionWatch::Unwatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;  // reported and removed already
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  entries_.erase(it);
}

void ConnectionWatch::Run() {
  epoll_event events[64];
  while (true) {
    const int n = epoll_wait(epoll_fd_, events, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == 0) return;  // the destructor's wake-up
      // The callback runs under the lock, so Unwatch returns only once it has finished.
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(id);
      if (it == entries_.end()) continue;
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
      std::function<void()> on_closed = std::move(it->second.on_closed);
      entries_.erase(it);
      on_closed();
    }
  }
}

}  // namespace tandem
