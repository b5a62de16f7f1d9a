#include "common/data_path.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

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
