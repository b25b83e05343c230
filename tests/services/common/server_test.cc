// StartServer / MakeChannel: health service, reflection, and TLS / mutual TLS with certificates
// made by openssl at test time.
#include "services/common/server.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/support/health_check.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// The health check with the answer required to be SERVING.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel) {
  bool serving = false;
  grpc::Status status = tandem::testing::CheckHealth(channel, &serving);
  if (status.ok()) {
    EXPECT_TRUE(serving);
  }
  return status;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/tandem-tls-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = new std::string(pattern);
    const std::string d = *dir_;
    // A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
    const std::string script =
        "set -e; cd " + d +
        "; openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
        "-subj /CN=tandem-test-ca 2>/dev/null"
        "; openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
        "-subj /CN=127.0.0.1 2>/dev/null"
        "; printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext"
        "; openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out server.pem -days 2 -extfile san.ext 2>/dev/null"
        "; openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
        "-subj /CN=tandem-client 2>/dev/null"
        "; openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out client.pem -days 2 2>/dev/null";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  static std::string* dir_;
};
std::string* TlsTest::dir_ = nullptr;

TEST(ServerTest, InsecureServerServesHealthOnAnOsChosenPort) {
  absl::StatusOr<RunningServer> server = StartServer({.listen = "127.0.0.1:0"}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT(server->port, 0);
  EXPECT_EQ(server->address, "127.0.0.1:" + std::to_string(server->port));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(server->address, {});
  ASSERT_TRUE(channel.ok());
  EXPECT_TRUE(CheckHealth(*channel).ok());
  server->server->Shutdown();
}

// A peer away for 20 s is reached again within about a second of listening: with gRPC's default
// reconnect backoff (1 s growing by 1.6 up to 120 s) the next attempt after a 20 s outage comes
// 4-8 s late.
TEST(ServerTest, ChannelReconnectsSoonAfterALongOutage) {
  int port = 0;
  {
    absl::StatusOr<RunningServer> first = StartServer({.listen = "127.0.0.1:0"}, {});
    ASSERT_TRUE(first.ok()) << first.status();
    port = first->port;
    first->server->Shutdown();
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, {});
  ASSERT_TRUE(channel.ok());
  const auto outage_end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < outage_end) {
    EXPECT_FALSE(CheckHealth(*channel).ok());  // fails fast: nothing listens
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  absl::StatusOr<RunningServer> back = StartServer({.listen = address}, {});
  ASSERT_TRUE(back.ok()) << back.status();
  const auto listening = std::chrono::steady_clock::now();
  while (!CheckHealth(*channel).ok()) {
    ASSERT_LT(std::chrono::steady_clock::now() - listening, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - listening).count();
  EXPECT_LT(seconds, 2.5) << "reconnected " << seconds << " s after the peer listened again";
  back->server->Shutdown();
}

TEST(ServerTest, ClearErrors) {
  EXPECT_FALSE(StartServer({.listen = "nonsense"}, {}).ok());
  EXPECT_FALSE(
      StartServer(
          {.listen = "127.0.0.1:0", .tls_cert = "/nonexistent.pem", .tls_key = "/nonexistent.key"},
          {})
          .ok());
  EXPECT_FALSE(StartServer({.listen = "127.0.0.1:0", .tls_cert = "/x.pem"}, {}).ok());
  EXPECT_FALSE(MakeChannel("", {}).ok());
  EXPECT_FALSE(MakeChannel("127.0.0.1:1", {.cert = "/x.pem"}).ok());
}

TEST_F(TlsTest, TlsServerNeedsATlsClient) {
  absl::StatusOr<RunningServer> server = StartServer(
      {.listen = "127.0.0.1:0", .tls_cert = File("server.pem"), .tls_key = File("server.key")}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> tls =
      MakeChannel(server->address, {.ca = File("ca.pem")});
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(CheckHealth(*tls).ok());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> plain = MakeChannel(server->address, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(CheckHealth(*plain).ok());
  server->server->Shutdown();
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificate) {
  absl::StatusOr<RunningServer> server = StartServer({.listen = "127.0.0.1:0",
                                                      .tls_cert = File("server.pem"),
                                                      .tls_key = File("server.key"),
                                                      .tls_client_ca = File("ca.pem")},
                                                     {});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> with_cert =
      MakeChannel(server->address,
                  {.ca = File("ca.pem"), .cert = File("client.pem"), .key = File("client.key")});
  ASSERT_TRUE(with_cert.ok()) << with_cert.status();
  EXPECT_TRUE(CheckHealth(*with_cert).ok());
  absl::StatusOr<std::shared_ptr<grpc::Channel>> without_cert =
      MakeChannel(server->address, {.ca = File("ca.pem")});
  ASSERT_TRUE(without_cert.ok());
  EXPECT_FALSE(CheckHealth(*without_cert).ok());
  server->server->Shutdown();
}

}  // namespace
}  // namespace tandem
