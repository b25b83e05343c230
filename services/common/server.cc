#include "services/common/server.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/support/client_interceptor.h"

namespace tandem {

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the ", std::string(what), " file '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", std::string(what), " file '", path, "' is empty"));
  }
  return text.str();
}

// Adds `authorization: <value>` to every call of a channel.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", value_});
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new TokenInterceptor(value_);
  }

 private:
  const std::string value_;
};

std::string EnvName(std::string_view prefix, std::string_view suffix) {
  return absl::StrCat(std::string(prefix), "_", std::string(suffix));
}

// The signal handler's only way out: a byte on a pipe (write is async-signal-safe).
int shutdown_pipe[2] = {-1, -1};

void OnShutdownSignal(int signo) {
  const char byte = static_cast<char>(signo);
  [[maybe_unused]] ssize_t ignored = write(shutdown_pipe[1], &byte, 1);
}

}  // namespace

void AddServerFlags(CLI::App& app, ServerFlags* flags, std::string_view env_prefix) {
  app.add_option("--listen", flags->listen, "host:port to serve on (port 0: chosen by the OS)")
      ->envname(EnvName(env_prefix, "LISTEN"))
      ->capture_default_str();
  app.add_option("--tls-cert", flags->tls_cert, "PEM certificate chain; enables TLS")
      ->envname(EnvName(env_prefix, "TLS_CERT"));
  app.add_option("--tls-key", flags->tls_key, "PEM private key of --tls-cert")
      ->envname(EnvName(env_prefix, "TLS_KEY"));
  app.add_option("--tls-client-ca", flags->tls_client_ca,
                 "PEM CA bundle; clients must present a certificate it signed (mutual TLS)")
      ->envname(EnvName(env_prefix, "TLS_CLIENT_CA"));
}

void AddClusterTokenFlag(CLI::App& app, std::string* file) {
  app.add_option("--cluster-token-file", *file,
                 "file holding the secret Tandem's services share: verifiers and drafters answer "
                 "only calls that carry it; routers and verifiers send it")
      ->envname("TANDEM_CLUSTER_TOKEN_FILE");
}

absl::StatusOr<std::string> ReadClusterToken(const std::string& file) {
  if (file.empty()) return std::string();
  absl::StatusOr<std::string> text = ReadPem(file, "cluster token");
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster token file '", file, "' holds only whitespace"));
  }
  return token;
}

void AddClientTlsFlags(CLI::App& app, ClientFlags* flags, std::string_view env_prefix) {
  app.add_option("--client-tls-ca", flags->ca,
                 "PEM CA bundle that signed the other services' certificates; enables TLS")
      ->envname(EnvName(env_prefix, "CLIENT_TLS_CA"));
  app.add_option("--client-tls-cert", flags->cert, "PEM client certificate (mutual TLS)")
      ->envname(EnvName(env_prefix, "CLIENT_TLS_CERT"));
  app.add_option("--client-tls-key", flags->key, "PEM key of --client-tls-cert")
      ->envname(EnvName(env_prefix, "CLIENT_TLS_KEY"));
}

absl::StatusOr<RunningServer> StartServer(const ServerFlags& flags,
                                          const std::vector<grpc::Service*>& services) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!flags.tls_cert.empty() || !flags.tls_key.empty()) {
    if (flags.tls_cert.empty() || flags.tls_key.empty()) {
      return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
    }
    grpc::SslServerCredentialsOptions options;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    auto cert = ReadPem(flags.tls_cert, "TLS certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(flags.tls_key, "TLS key");
    if (!key.ok()) return key.status();
    pair.cert_chain = *cert;
    pair.private_key = *key;
    options.pem_key_cert_pairs.push_back(std::move(pair));
    if (!flags.tls_client_ca.empty()) {
      auto ca = ReadPem(flags.tls_client_ca, "TLS client CA");
      if (!ca.ok()) return ca.status();
      options.pem_root_certs = *ca;
      options.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(options);
  } else if (!flags.tls_client_ca.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }

  const size_t colon = flags.listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == flags.listen.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen must be host:port, got '", flags.listen, "'"));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // Clients ping idle streams every 10 s (MakeChannel) to notice a dead peer; the server's
  // default (one ping per 5 min without data) would call that abuse and cut the stream.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  RunningServer running;
  builder.AddListeningPort(flags.listen, credentials, &running.port);
  if (flags.max_receive_message_bytes != 0) {
    builder.SetMaxReceiveMessageSize(flags.max_receive_message_bytes);
  }
  for (grpc::Service* service : services) builder.RegisterService(service);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", flags.listen,
                                               "' (address in use or not a local address?)"));
  }
  running.address = absl::StrCat(flags.listen.substr(0, colon), ":", running.port);
  running.server->GetHealthCheckService()->SetServingStatus(true);
  return running;
}

std::string ServedModelId(const std::string& model_dir, const std::string& merge_lora) {
  // The last named folder of a path, whether or not it ends in a separator.
  auto folder = [](const std::string& dir) {
    std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
    if (path.filename().empty()) path = path.parent_path();
    return path.filename().string();
  };
  std::string id = folder(model_dir);
  if (!merge_lora.empty()) id += "+" + folder(merge_lora);
  return id;
}

void AnnounceListening(std::string_view role, const std::string& address) {
  std::cout << role << " listening on " << address << std::endl;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ClientFlags& client) {
  if (address.empty()) return absl::InvalidArgumentError("empty service address");
  grpc::ChannelArguments args;
  // Streams carry many small messages; let a dead peer be noticed within seconds.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A peer that comes back is reconnected within about a second however long it was away:
  // gRPC's default reconnect backoff grows to 120 s (a verifier down for 90 s was used again
  // only 24 s after it listened; a returning drafter drafted again 10-20 s late).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectBackoffMs / 4);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kReconnectBackoffMs / 4);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kReconnectBackoffMs);
  auto channel = [&](std::shared_ptr<grpc::ChannelCredentials> credentials) {
    if (client.token.empty()) return grpc::CreateCustomChannel(address, credentials, args);
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> token;
    token.push_back(std::make_unique<TokenInterceptorFactory>(client.token));
    return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                   std::move(token));
  };
  if (client.ca.empty()) {
    if (!client.cert.empty() || !client.key.empty()) {
      return absl::InvalidArgumentError("a client certificate needs --client-tls-ca");
    }
    return channel(grpc::InsecureChannelCredentials());
  }
  grpc::SslCredentialsOptions options;
  auto ca = ReadPem(client.ca, "TLS CA");
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *ca;
  if (!client.cert.empty() || !client.key.empty()) {
    if (client.cert.empty() || client.key.empty()) {
      return absl::InvalidArgumentError("mutual TLS needs both --client-tls-cert and -key");
    }
    auto cert = ReadPem(client.cert, "TLS client certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(client.key, "TLS client key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return channel(grpc::SslCredentials(options));
}

int WaitForShutdownSignal() {
  if (shutdown_pipe[0] < 0 && pipe(shutdown_pipe) != 0) {
    std::perror("pipe");
    return 0;
  }
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  char byte = 0;
  while (read(shutdown_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return byte;
}

void SetNotServing(grpc::Server& server) { SetServing(server, false); }

void SetServing(grpc::Server& server, bool serving) {
  if (auto* health = server.GetHealthCheckService()) health->SetServingStatus(serving);
}

}  // namespace tandem
