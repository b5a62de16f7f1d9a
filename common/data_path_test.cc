#include "common/data_path.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>

#include "gtest/gtest.h"

namespace opserver {
namespace {

TEST(DataPathTest, SendAllAndRecvFullMoveEveryByte) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  std::string sent(3 << 20, '\0');  // More than a socket buffer holds.
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7);
  std::thread writer([&] {
    EXPECT_TRUE(SendAll(a.get(), sent.data(), sent.size()).ok());
    shutdown(a.get(), SHUT_WR);
  });
  std::string got(sent.size() + 10, '\0');
  absl::StatusOr<size_t> n = RecvFull(b.get(), got.data(), got.size());
  writer.join();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, sent.size());  // Short: the peer half-closed.
  got.resize(*n);
  EXPECT_EQ(got, sent);
}

// Each socket call that moved bytes is reported, so a caller can keep an
// idle clock per call rather than per buffer.
TEST(DataPathTest, EachMoveIsReported) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]), b(fds[1]);
  int sends = 0;
  ASSERT_TRUE(SendAll(a.get(), "abc", 3, [&] { ++sends; }).ok());
  ASSERT_TRUE(SendAll(a.get(), "de", 2, [&] { ++sends; }).ok());
  shutdown(a.get(), SHUT_WR);
  EXPECT_EQ(sends, 2);
  int receives = 0;
  char got[10];
  absl::StatusOr<size_t> n =
      RecvFull(b.get(), got, sizeof(got), [&] { ++receives; });
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(got, *n), "abcde");
  EXPECT_GE(receives, 1);  // The end of the stream is not a move.
  EXPECT_LE(receives, 2);
}

// A TCP connection over loopback (RecvFull's low-water mark is TCP's:
// a Unix socket ignores it): {client's end, server's end}, each with a
// receive time-out of `timeout`, so a receive that would hang fails.
std::pair<UniqueFd, UniqueFd> LoopbackPair(absl::Duration timeout) {
  UniqueFd listener(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  EXPECT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&address),
                 sizeof(address)),
            0);
  EXPECT_EQ(listen(listener.get(), 1), 0);
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &size);
  UniqueFd client(socket(AF_INET, SOCK_STREAM, 0));
  EXPECT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&address),
                    sizeof(address)),
            0);
  UniqueFd server(accept(listener.get(), nullptr, nullptr));
  const timeval limit = absl::ToTimeval(timeout);
  for (int fd : {client.get(), server.get()}) {
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  }
  return {std::move(client), std::move(server)};
}

int LowWater(int fd) {
  int bytes = -1;
  socklen_t size = sizeof(bytes);
  getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, &size);
  return bytes;
}

// RecvFull waits for half a megabyte at a time (or the rest), never for more
// than the rest: a transfer whose sender then waits for an answer (as the
// data path's kept connections do) is received whole, whatever the size
// around the mark and however the sender cuts it. A receive that
// waited for bytes that never come would fail at the time-out instead.
TEST(DataPathTest, RecvFullTakesEveryByteThenLetsTheAnswerThrough) {
  auto [sender, receiver] = LoopbackPair(absl::Seconds(30));
  const size_t mib = 1 << 20;
  for (size_t size : {size_t{1}, mib / 2 - 1, mib / 2, mib / 2 + 1, mib + 1,
                      2 * mib + mib / 2, 4 * mib + 7}) {
    std::string sent(size, '\0');
    for (size_t i = 0; i < size; ++i) sent[i] = static_cast<char>(i * 13 + 1);
    std::thread writer([&, fd = sender.get()] {
      // In pieces, the last one short.
      for (size_t at = 0; at < size; at += 100000) {
        const size_t n = std::min<size_t>(100000, size - at);
        ASSERT_TRUE(SendAll(fd, sent.data() + at, n).ok());
      }
      char answer = 0;
      EXPECT_EQ(recv(fd, &answer, 1, 0), 1) << "size " << size;
      EXPECT_EQ(answer, 'K');
    });
    std::string got(size, '\0');
    absl::StatusOr<size_t> n = RecvFull(receiver.get(), got.data(), size);
    ASSERT_TRUE(n.ok()) << n.status() << " size " << size;
    EXPECT_EQ(*n, size);
    EXPECT_TRUE(got == sent) << "size " << size;
    // Back to the default, so a small message that follows wakes a poll.
    EXPECT_EQ(LowWater(receiver.get()), 1) << "size " << size;
    ASSERT_TRUE(SendAll(receiver.get(), "K", 1).ok());
    writer.join();
  }
}

// The socket's receive time-out still bounds RecvFull (it waits in poll,
// not in recv), as the same failure recv reports; and the low-water mark
// is back to its default after a failure too.
TEST(DataPathTest, RecvFullFailsAtTheReceiveTimeout) {
  auto [sender, receiver] = LoopbackPair(absl::Milliseconds(200));
  ASSERT_TRUE(SendAll(sender.get(), "abc", 3).ok());
  std::string got(2 << 20, '\0');
  absl::StatusOr<size_t> n = RecvFull(receiver.get(), got.data(), got.size());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable) << n.status();
  EXPECT_EQ(LowWater(receiver.get()), 1);
  EXPECT_EQ(got.substr(0, 3), "abc");
}

TEST(DataPathTest, SendToAClosedPeerIsUnavailableNotSigpipe) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd a(fds[0]);
  close(fds[1]);
  absl::Status s = SendAll(a.get(), "x", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(DataPathTest, ConnectToAClosedPortIsUnavailableNamingIt) {
  // Bind a port and close it again: nothing listens there.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const int port = ntohs(addr.sin_port);
  absl::StatusOr<UniqueFd> c =
      ConnectTcp("127.0.0.1", port, absl::Seconds(5), absl::ZeroDuration());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find(std::to_string(port)), std::string::npos)
      << c.status();
}

TEST(DataPathTest, RandomBytesDiffer) {
  auto a = RandomBytes(kDataTicketBytes);
  auto b = RandomBytes(kDataTicketBytes);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kDataTicketBytes);
  EXPECT_NE(*a, *b);
}

}  // namespace
}  // namespace opserver
