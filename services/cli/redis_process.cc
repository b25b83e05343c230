#include "services/cli/redis_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "services/common/redis_client.h"

namespace tandem {

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(address.sin_port);
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin", ':')) {
    const std::string candidate = absl::StrCat(std::string(dir), "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::string();
}

absl::Status RedisProcess::Start(int port, const std::string& password, const RedisServerTls& tls) {
  Kill();
  const std::string binary = FindOnPath("redis-server");
  if (binary.empty()) return absl::NotFoundError("redis-server is not on PATH");
  port_ = port;
  std::vector<std::string> argv = {binary, "--bind",       "127.0.0.1", "--save",
                                   "",     "--appendonly", "no"};
  RedisAuth auth;
  if (tls.cert_file.empty()) {
    argv.insert(argv.end(), {"--port", std::to_string(port)});
  } else {
    argv.insert(argv.end(),
                {"--port", "0", "--tls-port", std::to_string(port), "--tls-cert-file",
                 tls.cert_file, "--tls-key-file", tls.key_file, "--tls-ca-cert-file", tls.ca_file,
                 "--tls-auth-clients", tls.require_client_cert ? "yes" : "no"});
    auth = {
        .tls_ca_file = tls.ca_file, .tls_cert_file = tls.cert_file, .tls_key_file = tls.key_file};
  }
  if (!password.empty()) argv.insert(argv.end(), {"--requirepass", password});
  absl::StatusOr<RedisClient::Options> options =
      RedisClient::WithAuth({.host = "127.0.0.1", .port = port}, auth);
  if (!options.ok()) return options.status();
  options->min_backoff = absl::Milliseconds(20);
  options->max_backoff = absl::Milliseconds(20);
  options->password = password;
  auto child = ChildProcess::Start({.name = "redis", .argv = argv, .forward_output = false});
  if (!child.ok()) return child.status();
  process_ = std::move(*child);
  RedisClient client(*options);
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up) {
    absl::StatusOr<RedisReply> pong = client.Command({"PING"});
    if (pong.ok()) return absl::OkStatus();
    if (process_->PollExit().has_value()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("redis-server did not answer PING on port ", port,
                                             ": ", process_->StderrTail()));
}

void RedisProcess::Kill() {
  if (process_ == nullptr) return;
  process_->Signal(SIGKILL);
  process_->WaitForExit(absl::Seconds(10));
  process_.reset();
}

std::string RedisProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

}  // namespace tandem
