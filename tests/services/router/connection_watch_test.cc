// ConnectionWatch and FindConnectionSocket on real loopback connections.
#include "services/router/connection_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// A listening socket on 127.0.0.1, a client connected to it and the server's accepted end.
struct Connection {
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&at), sizeof(at)), 0);
    EXPECT_EQ(listen(listener, 4), 0);
    socklen_t length = sizeof(at);
    EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&at), &length), 0);
    server_port = ntohs(at.sin_port);
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<const sockaddr*>(&at), sizeof(at)), 0);
    sockaddr_in mine{};
    length = sizeof(mine);
    EXPECT_EQ(getsockname(client, reinterpret_cast<sockaddr*>(&mine), &length), 0);
    client_port = ntohs(mine.sin_port);
    accepted = accept(listener, nullptr, nullptr);
    EXPECT_GE(accepted, 0);
  }
  ~Connection() {
    if (client >= 0) close(client);
    close(accepted);
    close(listener);
  }
  void CloseClient() {
    close(client);
    client = -1;
  }

  int listener = -1;
  int client = -1;
  int accepted = -1;
  int server_port = 0;
  int client_port = 0;
};

bool WaitFor(const std::atomic<bool>& flag, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!flag && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return flag;
}

TEST(FindConnectionSocketTest, FindsTheAcceptedEndByItsAddresses) {
  Connection c;
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", c.server_port, "127.0.0.1", c.client_port),
            c.accepted);
  // The client's end, seen from its side.
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", c.client_port, "127.0.0.1", c.server_port), c.client);
  EXPECT_EQ(FindConnectionSocket("127.0.0.1", c.server_port, "127.0.0.1", c.client_port + 1), -1);
  EXPECT_EQ(FindConnectionSocket("127.0.0.2", c.server_port, "127.0.0.1", c.client_port), -1);
}

TEST(ConnectionWatchTest, ReportsAPeerThatClosesOnceAndNotBefore) {
  auto watch = ConnectionWatch::Create();
  ASSERT_TRUE(watch.ok()) << watch.status();
  Connection c;
  std::atomic<int> calls{0};
  std::atomic<bool> closed{false};
  auto watched = (*watch)->Watch(c.accepted, [&] {
    ++calls;
    closed = true;
  });
  ASSERT_NE(watched, nullptr);
  // Data from the client (a pipelined request) is not a close.
  ASSERT_EQ(send(c.client, "x", 1, 0), 1);
  EXPECT_FALSE(WaitFor(closed, std::chrono::milliseconds(100)));
  c.CloseClient();
  EXPECT_TRUE(WaitFor(closed, std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls, 1);
}

TEST(ConnectionWatchTest, AClosedPeerIsReportedAtOnceAndAnEndedWatchNever) {
  auto watch = ConnectionWatch::Create();
  ASSERT_TRUE(watch.ok()) << watch.status();
  {
    Connection c;
    c.CloseClient();
    std::atomic<bool> closed{false};
    auto watched = (*watch)->Watch(c.accepted, [&] { closed = true; });
    ASSERT_NE(watched, nullptr);
    EXPECT_TRUE(WaitFor(closed, std::chrono::seconds(5)));
  }
  Connection c;
  std::atomic<bool> closed{false};
  (*watch)->Watch(c.accepted, [&] { closed = true; }).reset();  // watched, then no more
  c.CloseClient();
  EXPECT_FALSE(WaitFor(closed, std::chrono::milliseconds(200)));
  EXPECT_EQ((*watch)->Watch(-1, [] {}), nullptr);  // epoll refuses the descriptor
}

}  // namespace
}  // namespace tandem
