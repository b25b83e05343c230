#include "services/cli/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {

namespace {

constexpr size_t kStderrTailBytes = 4096;
constexpr std::string_view kListeningOn = " listening on ";
constexpr std::string_view kMetricsOn = " metrics on ";
constexpr std::string_view kHttpOn = " http on ";

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

std::vector<std::string> SharedCoresEnv() { return {"OMP_WAIT_POLICY=passive"}; }

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(Options options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no command to start");
  const std::string& path = options.argv[0];
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot run the ", options.name, " '", path, "': ", std::strerror(errno)));
  }
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError("pipe2 failed");
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& arg : options.argv) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (std::string& entry : options.default_env) {
    const std::string name = entry.substr(0, entry.find('='));
    if (getenv(name.c_str()) == nullptr) envp.push_back(entry.data());
  }
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    static constexpr char kFailed[] = "exec failed\n";
    WriteAll(STDERR_FILENO, kFailed, sizeof(kFailed) - 1);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  std::unique_ptr<ChildProcess> child(new ChildProcess(std::move(options), pid, out[0], err[0]));
  child->pump_ = std::thread([raw = child.get()] { raw->Pump(); });
  return child;
}

ChildProcess::ChildProcess(Options options, pid_t pid, int stdout_fd, int stderr_fd)
    : options_(std::move(options)), pid_(pid), stdout_fd_(stdout_fd), stderr_fd_(stderr_fd) {}

ChildProcess::~ChildProcess() {
  if (!exit_status_) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (pump_.joinable()) pump_.join();
  close(stdout_fd_);
  close(stderr_fd_);
}

void ChildProcess::Pump() {
  std::string line;
  bool stdout_open = true;
  bool stderr_open = true;
  char buffer[4096];
  while (stdout_open || stderr_open) {
    pollfd fds[2] = {{stdout_open ? stdout_fd_ : -1, POLLIN, 0},
                     {stderr_open ? stderr_fd_ : -1, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) {
      const ssize_t n = read(stdout_fd_, buffer, sizeof(buffer));
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        stdout_open = false;
      } else {
        line.append(buffer, static_cast<size_t>(n));
        size_t end;
        while ((end = line.find('\n')) != std::string::npos) {
          const std::string text = line.substr(0, end);
          line.erase(0, end + 1);
          const size_t at = text.find(kListeningOn);
          const size_t metrics_at = text.find(kMetricsOn);
          const size_t http_at = text.find(kHttpOn);
          absl::MutexLock lock(&mu_);
          if (!address_ && at != std::string::npos) {
            address_ = text.substr(at + kListeningOn.size());
          } else if (!address_ && !metrics_address_ && metrics_at != std::string::npos) {
            metrics_address_ = text.substr(metrics_at + kMetricsOn.size());
          } else if (!address_ && !http_address_ && http_at != std::string::npos) {
            http_address_ = text.substr(http_at + kHttpOn.size());
          } else if (options_.forward_output) {
            std::fprintf(stdout, "%s\n", text.c_str());
            std::fflush(stdout);
          }
        }
      }
    }
    if (fds[1].revents != 0) {
      const ssize_t n = read(stderr_fd_, buffer, sizeof(buffer));
      if (n <= 0) {
        if (n < 0 && errno == EINTR) continue;
        stderr_open = false;
      } else {
        if (options_.forward_output) WriteAll(STDERR_FILENO, buffer, static_cast<size_t>(n));
        absl::MutexLock lock(&mu_);
        stderr_tail_.append(buffer, static_cast<size_t>(n));
        if (stderr_tail_.size() > 2 * kStderrTailBytes) {
          stderr_tail_.erase(0, stderr_tail_.size() - kStderrTailBytes);
        }
      }
    }
  }
  absl::MutexLock lock(&mu_);
  output_closed_ = true;
}

absl::StatusOr<std::string> ChildProcess::WaitForAddress(absl::Duration timeout) {
  bool closed = false;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return address_.has_value() || output_closed_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (address_) return *address_;
    closed = output_closed_;
  }
  // Closed output almost always means the child is exiting; give it a moment to be reaped.
  std::optional<int> status = closed ? WaitForExit(absl::Seconds(5)) : PollExit();
  if (status) {
    return absl::UnavailableError(absl::StrCat("the ", options_.name, " ", DescribeExit(*status),
                                               " before it was ready; the end of its stderr:\n",
                                               StderrTail()));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the ", options_.name, " did not announce its address within ",
                   absl::FormatDuration(timeout), "; the end of its stderr:\n", StderrTail()));
}

void ChildProcess::Signal(int signo) {
  if (!exit_status_) kill(pid_, signo);
}

std::optional<int> ChildProcess::PollExit() {
  if (exit_status_) return exit_status_;
  int status = 0;
  pid_t reaped;
  while ((reaped = waitpid(pid_, &status, WNOHANG)) < 0 && errno == EINTR) {
  }
  if (reaped == pid_) exit_status_ = status;
  return exit_status_;
}

std::optional<int> ChildProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // No portable way to wait for one child with a timeout; a short poll is cheap next to the
  // seconds a service takes to stop.
  while (!PollExit() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return exit_status_;
}

std::optional<std::string> ChildProcess::MetricsAddress() const {
  absl::MutexLock lock(&mu_);
  return metrics_address_;
}

std::optional<std::string> ChildProcess::HttpAddress() const {
  absl::MutexLock lock(&mu_);
  return http_address_;
}

std::string ChildProcess::StderrTail() const {
  absl::MutexLock lock(&mu_);
  if (stderr_tail_.size() <= kStderrTailBytes) return stderr_tail_;
  return stderr_tail_.substr(stderr_tail_.size() - kStderrTailBytes);
}

std::string ChildProcess::DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int signo = WTERMSIG(wait_status);
    return absl::StrCat("was killed by signal ", signo, " (", strsignal(signo), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

}  // namespace tandem
