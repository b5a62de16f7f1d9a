// DelayProxy against a local echo server: bytes arrive intact in both
// directions, a round trip takes at least twice the one-way delay, half-close
// and close travel through, connections run concurrently, and destroying the
// proxy ends the connections it holds.

#include "bench/delay_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace opserver::bench {
namespace {

int ListenLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 ||
      bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 64) != 0) {
    return -1;
  }
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *port = ntohs(address.sin_port);
  return fd;
}

// Echoes every connection's bytes back until the peer half-closes, then
// half-closes its side too, as the proxy must pass on.
class EchoServer {
 public:
  EchoServer() {
    listen_fd_ = ListenLoopback(&port_);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~EchoServer() {
    // shutdown() wakes the blocked accept() (Linux) and any blocked recv().
    shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    for (std::thread& thread : threads_) thread.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  void AcceptLoop() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      absl::MutexLock lock(&mu_);
      fds_.push_back(fd);
      threads_.emplace_back([fd] {
        char buffer[65536];
        for (;;) {
          const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
          if (n <= 0) break;
          if (send(fd, buffer, n, MSG_NOSIGNAL) != n) break;
        }
        shutdown(fd, SHUT_WR);
      });
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// A blocking connection to 127.0.0.1:port whose reads give up after 10 s,
// so that a proxy that loses an end of stream fails the test, not hangs it.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return -1;
  }
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

// Reads until `size` bytes or the end of stream (or an error).
std::string Receive(int fd, size_t size) {
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = recv(fd, &bytes[done], size - done, 0);
    if (n <= 0) break;
    done += n;
  }
  bytes.resize(done);
  return bytes;
}

// 0 at an end of stream, -1 on an error or timeout, 1 if a byte came.
int ReadOne(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, 0);
  return n > 0 ? 1 : static_cast<int>(n);
}

std::string Pattern(size_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t state = seed * 2654435761u + 1;
  for (char& byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<char>(state >> 24);
  }
  return bytes;
}

TEST(DelayProxyTest, BytesArriveIntactAndHalfCloseTravelsBothWays) {
  EchoServer echo;
  auto proxy = DelayProxy::Start(absl::StrCat("127.0.0.1:", echo.port()),
                                 absl::Microseconds(250));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  const int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);

  // More than the socket buffers hold, written while it is read back, so
  // that both directions queue and wait for room.
  const std::string sent = Pattern(8 << 20, 1);
  std::thread writer([&] {
    EXPECT_TRUE(SendAll(fd, sent));
    // Our half-close must reach the echo server, whose half-close must
    // come back.
    shutdown(fd, SHUT_WR);
  });
  const std::string received = Receive(fd, sent.size());
  writer.join();
  EXPECT_EQ(received.size(), sent.size());
  EXPECT_TRUE(received == sent) << "bytes differ";
  EXPECT_EQ(ReadOne(fd), 0) << "expected the echo server's end of stream";
  close(fd);
  EXPECT_EQ((*proxy)->connections_accepted(), 1);
}

TEST(DelayProxyTest, RoundTripTakesAtLeastTwiceTheDelay) {
  EchoServer echo;
  const absl::Duration delay = absl::Milliseconds(20);
  auto proxy =
      DelayProxy::Start(absl::StrCat("127.0.0.1:", echo.port()), delay);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  const int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 5; ++i) {
    const std::string message = absl::StrCat("ping ", i);
    const absl::Time start = absl::Now();
    ASSERT_TRUE(SendAll(fd, message));
    EXPECT_EQ(Receive(fd, message.size()), message);
    // The proxy's contract, not a speed claim: no upper bound.
    EXPECT_GE(absl::Now() - start, 2 * delay);
  }
  close(fd);
}

TEST(DelayProxyTest, ConcurrentConnectionsStaySeparate) {
  EchoServer echo;
  auto proxy = DelayProxy::Start(absl::StrCat("127.0.0.1:", echo.port()),
                                 absl::Microseconds(500));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  constexpr int kClients = 8;
  std::vector<std::thread> clients;
  std::atomic<int> intact{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      const int fd = Connect((*proxy)->port());
      if (fd < 0) return;
      // Several round trips each, so that the connections overlap.
      bool ok = true;
      for (int round = 0; round < 10 && ok; ++round) {
        const std::string sent = Pattern(100000, c * 100 + round);
        std::thread writer([&] { SendAll(fd, sent); });
        ok = Receive(fd, sent.size()) == sent;
        writer.join();
      }
      shutdown(fd, SHUT_WR);
      if (ok && ReadOne(fd) == 0) intact.fetch_add(1);
      close(fd);
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(intact.load(), kClients);
  EXPECT_EQ((*proxy)->connections_accepted(), kClients);
}

TEST(DelayProxyTest, FullCloseOfTheTargetEndsTheClientsConnection) {
  // A target that closes every connection at once, having sent one byte.
  int port = 0;
  const int listen_fd = ListenLoopback(&port);
  ASSERT_GE(listen_fd, 0);
  std::thread target([listen_fd] {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    send(fd, "x", 1, MSG_NOSIGNAL);
    close(fd);
  });
  auto proxy = DelayProxy::Start(absl::StrCat("127.0.0.1:", port),
                                 absl::Microseconds(250));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  const int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(ReadOne(fd), 1);
  EXPECT_EQ(ReadOne(fd), 0);
  target.join();
  close(fd);
  close(listen_fd);
}

TEST(DelayProxyTest, RefusedTargetEndsTheClientsConnection) {
  int port = 0;
  const int unused = ListenLoopback(&port);
  ASSERT_GE(unused, 0);
  close(unused);  // Nothing listens there now.
  auto proxy = DelayProxy::Start(absl::StrCat("127.0.0.1:", port),
                                 absl::Microseconds(250));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  const int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  EXPECT_LE(ReadOne(fd), 0);
  close(fd);
}

TEST(DelayProxyTest, DestructorEndsOpenConnections) {
  EchoServer echo;
  auto proxy = DelayProxy::Start(absl::StrCat("127.0.0.1:", echo.port()),
                                 absl::Microseconds(250));
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    const int fd = Connect((*proxy)->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "a"));
    EXPECT_EQ(Receive(fd, 1), "a");
    fds.push_back(fd);
  }
  // Bytes still in flight when it stops must not keep a thread alive.
  ASSERT_TRUE(SendAll(fds[0], Pattern(1 << 20, 7)));
  proxy->reset();
  for (int fd : fds) {
    // Whatever was queued is dropped; the stream must end, not hang.
    char buffer[65536];
    ssize_t n;
    while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
    }
    // An end of stream, or a reset where the proxy closed a socket with
    // unread bytes in it; a timeout (EAGAIN) would mean a leftover thread.
    EXPECT_TRUE(n == 0 || errno == ECONNRESET) << std::strerror(errno);
    close(fd);
  }
}

TEST(DelayProxyTest, RejectsABadTarget) {
  EXPECT_FALSE(DelayProxy::Start("no-port", absl::Microseconds(1)).ok());
  EXPECT_FALSE(DelayProxy::Start("127.0.0.1:0", absl::Microseconds(1)).ok());
  EXPECT_FALSE(
      DelayProxy::Start("127.0.0.1:1", absl::Microseconds(-1)).ok());
}

}  // namespace
}  // namespace opserver::bench
