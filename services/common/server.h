// What every Tandem service binary shares: listen/TLS flags, starting a gRPC server with the
// standard health service (grpc.health.v1) and server reflection, client channels with the
// matching credentials, and shutdown on SIGINT/SIGTERM.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace CLI {
class App;
}

namespace tandem {

struct ServerFlags {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 = chosen by the OS
  std::string tls_cert;                // PEM server certificate chain (TLS when set)
  std::string tls_key;                 // PEM private key
  std::string tls_client_ca;           // PEM CA; when set, clients must present a cert (mTLS)
  // Largest request message the server accepts; 0 = gRPC's default (4 MiB). Not a flag: a
  // service that checks request sizes itself raises it so that it can answer them.
  int max_receive_message_bytes = 0;
};

// How a service dials the others: TLS, and the cluster token.
struct ClientFlags {
  std::string ca;    // PEM CA that signed the servers' certificates (TLS when set)
  std::string cert;  // PEM client certificate (mTLS)
  std::string key;   // PEM client key (mTLS)
  // The cluster's shared token (ReadClusterToken of --cluster-token-file): when set, every call
  // on the channel carries it as `authorization: Bearer TOKEN`. Not a flag itself.
  std::string token;
};

// Adds --listen, --tls-cert, --tls-key, --tls-client-ca, each also read from the environment
// variable <env_prefix>_LISTEN, <env_prefix>_TLS_CERT, ... (e.g. TANDEM_VERIFIER_LISTEN).
void AddServerFlags(CLI::App& app, ServerFlags* flags, std::string_view env_prefix);
// Adds --client-tls-ca, --client-tls-cert, --client-tls-key (env <env_prefix>_CLIENT_TLS_CA...).
void AddClientTlsFlags(CLI::App& app, ClientFlags* flags, std::string_view env_prefix);

// Adds --cluster-token-file (env TANDEM_CLUSTER_TOKEN_FILE, one variable for every service): a
// file holding the secret the cluster's services share. A verifier and a drafter then answer
// only calls that carry it (UNAUTHENTICATED otherwise; health and reflection stay open for
// probes), and the router and verifiers send it on their calls to the others.
void AddClusterTokenFlag(CLI::App& app, std::string* file);
// The token in `file` with surrounding whitespace trimmed; "" for an empty path.
// InvalidArgument for an unreadable file or one that holds no token.
absl::StatusOr<std::string> ReadClusterToken(const std::string& file);

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;         // the bound port (the OS's choice when the flag said 0)
  std::string address;  // host:port clients can dial
};

// Starts a server with `services` (not owned; must outlive the server), the default health
// service (overall status SERVING) and reflection. Errors name the address or the file that
// failed (unreadable certificate, address in use).
absl::StatusOr<RunningServer> StartServer(const ServerFlags& flags,
                                          const std::vector<grpc::Service*>& services);

// The name a service gives the model it loaded from `model_dir`: the checkpoint folder's name
// ("models/tandem-target/" -> "tandem-target"), and with an adapter merged into its weights
// (--merge-lora) "<folder>+<adapter folder>", so that a router never mixes the two models.
std::string ServedModelId(const std::string& model_dir, const std::string& merge_lora = "");

// Prints "<role> listening on <address>" on stdout and flushes: `tandem up` and the tests read
// the chosen port from this line.
void AnnounceListening(std::string_view role, const std::string& address);

// The longest a client channel waits between reconnect attempts to a peer that is away.
inline constexpr int kReconnectBackoffMs = 1000;

// A channel to `address` with TLS when `client.ca` is set, else insecure, carrying `client.token`
// on every call when set; keepalives notice a dead peer within seconds, and reconnect attempts are
// at most kReconnectBackoffMs apart.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientFlags& client);

// Blocks the calling thread until SIGINT or SIGTERM; returns the signal number. Call once, from
// main, after the servers are up.
int WaitForShutdownSignal();

// Marks every service NOT_SERVING in the health service (draining).
void SetNotServing(grpc::Server& server);
// Marks every service SERVING or NOT_SERVING (a verifier's watchdog).
void SetServing(grpc::Server& server, bool serving);

}  // namespace tandem
