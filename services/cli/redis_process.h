// A throwaway redis-server child on 127.0.0.1 with no persistence, for the registry's Redis in
// `tandem bench chaos` (and the registry tests): started on a given port, killed, and started
// again empty on the same port, as an operator's Redis restart without persistence would be.
//
// Thread-safety: a RedisProcess is driven from one thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "services/cli/child_process.h"

namespace tandem {

// A TCP port on 127.0.0.1 that the OS says is free now (bound to port 0, then released); 0 when
// none could be had. Another process may take it before the caller binds it.
int FreeLoopbackPort();

// The first executable `name` on $PATH (/usr/bin without PATH); "" when there is none.
std::string FindOnPath(const std::string& name);

// TLS for a RedisProcess: with `cert_file` set, the port speaks TLS only (PEM files; the key's
// certificate is also the PING client's, so the CA must have signed it).
struct RedisServerTls {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  bool require_client_cert = false;  // tls-auth-clients
};

class RedisProcess {
 public:
  // Starts redis-server on 127.0.0.1:`port` (requiring `password` when it is set, over TLS when
  // `tls` says so) and waits up to 20 s for it to answer PING. NotFound without redis-server on
  // PATH; Unavailable with its stderr when it does not answer. A running server is killed first.
  absl::Status Start(int port, const std::string& password = "", const RedisServerTls& tls = {});
  // SIGKILL, and waits for the exit (up to 10 s). No-op when not running.
  void Kill();

  std::string address() const;  // "127.0.0.1:PORT"
  int port() const { return port_; }

 private:
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace tandem
