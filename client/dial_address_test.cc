#include "client/dial_address.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/closed_port.h"

namespace opserver {
namespace remote {
namespace {

using ::testing::HasSubstr;

TEST(CheckDialAddressTest, HostPortAndGrpcTargetsAreAccepted) {
  EXPECT_TRUE(CheckDialAddress("127.0.0.1:50051").ok());
  EXPECT_TRUE(CheckDialAddress("localhost:1").ok());
  EXPECT_TRUE(CheckDialAddress("[::1]:50051").ok());
  EXPECT_TRUE(CheckDialAddress("dns:///host.example:50051").ok());
  EXPECT_TRUE(CheckDialAddress("unix:/tmp/opserver.sock").ok());
}

TEST(CheckDialAddressTest, MistakesAreNamedBeforeDialing) {
  struct Case {
    const char* address;
    const char* why;
  } cases[] = {
      {"", "cannot dial '': the address is empty"},
      {"http://127.0.0.1:50051",
       "cannot dial 'http://127.0.0.1:50051': it is a URL (http://)"},
      {"https://host:443", "it is a URL (https://)"},
      {"127.0.0.1", "cannot dial '127.0.0.1': missing ':PORT'"},
      {"127.0.0.1:", "cannot dial '127.0.0.1:': empty port"},
      {":50051", "cannot dial ':50051': empty host"},
      {"host:0", "port 0 is not a server's port"},
      {"host:http", "port is not a number"},
  };
  for (const Case& c : cases) {
    absl::Status status = CheckDialAddress(c.address);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.address;
    EXPECT_THAT(status.message(), HasSubstr(c.why));
    EXPECT_THAT(status.message(), HasSubstr("give HOST:PORT"));
  }
}

TEST(TcpConnectFailureTest, ARefusedPortSaysRefused) {
  ListenAddress address{"127.0.0.1", ClosedPort()};
  std::optional<std::string> why = TcpConnectFailure(address, absl::Minutes(1));
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("connection refused"));
}

TEST(TcpConnectFailureTest, AListeningPortIsNoFailure) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t size = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size);
  ListenAddress address{"127.0.0.1", ntohs(addr.sin_port)};
  EXPECT_EQ(TcpConnectFailure(address, absl::Minutes(1)), std::nullopt);
  close(fd);
}

TEST(TcpConnectFailureTest, AnUnresolvableNameSaysSo) {
  ListenAddress address{"no-such-host.invalid", 50051};
  std::optional<std::string> why = TcpConnectFailure(address, absl::Minutes(1));
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("does not resolve"));
}

}  // namespace
}  // namespace remote
}  // namespace opserver
