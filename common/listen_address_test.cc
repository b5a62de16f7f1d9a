#include "common/listen_address.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

TEST(ParseListenAddressTest, AcceptsHostAndPort) {
  auto parsed = ParseListenAddress("127.0.0.1:50051");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "127.0.0.1");
  EXPECT_EQ(parsed->port, 50051);
  EXPECT_EQ(parsed->ToString(), "127.0.0.1:50051");
}

TEST(ParseListenAddressTest, AcceptsNamesPortZeroAndMaxPort) {
  EXPECT_EQ(ParseListenAddress("localhost:0")->port, 0);
  EXPECT_EQ(ParseListenAddress("my-host.example_1:65535")->port, 65535);
}

TEST(ParseListenAddressTest, AcceptsBracketedIpv6) {
  auto parsed = ParseListenAddress("[::1]:8080");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "::1");
  EXPECT_EQ(parsed->port, 8080);
  EXPECT_EQ(parsed->ToString(), "[::1]:8080");
}

TEST(ParseListenAddressTest, RejectsMalformedAddresses) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"", "missing ':PORT'"},
      {"127.0.0.1", "missing ':PORT'"},
      {":50051", "empty host"},
      {"127.0.0.1:", "empty port"},
      {"127.0.0.1:abc", "port is not a number"},
      {"127.0.0.1:-1", "port is not a number"},
      {"127.0.0.1:65536", "port must be 0..65535"},
      {"127.0.0.1:9999999999999", "port must be 0..65535"},
      {"::1:80", "IPv6 addresses need brackets"},
      {"[::1]80", "missing ':PORT' after ']'"},
      {"[::1:80", "missing ']'"},
      {"[]:80", "empty IPv6 address"},
      {"[zz]:80", "bad character in IPv6 address"},
      {"host name:80", "bad character in host"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseListenAddress(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.why)) << c.text;
  }
}

TEST(ParseConnectAddressTest, AcceptsWhatCanBeDialed) {
  auto parsed = ParseConnectAddress("localhost:1");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "localhost");
  EXPECT_EQ(parsed->port, 1);
  parsed = ParseConnectAddress("[::1]:65535");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->ToString(), "[::1]:65535");
  // The longest DNS name, with the longest port.
  const std::string longest = std::string(253, 'a') + ":65535";
  ASSERT_EQ(longest.size(), kMaxConnectAddressBytes);
  EXPECT_TRUE(ParseConnectAddress(longest).ok());
}

// What a hostile server may put in OpenDataTransferResponse.address (and
// an operator in --data_advertise): each refused with its reason, the
// text quoted escaped, and never quoted at all when it is too long.
TEST(ParseConnectAddressTest, RefusesHostileAddressesWithTheirReason) {
  struct Case {
    std::string text;
    const char* message;
  } cases[] = {
      {"", "'' is not HOST:PORT (missing ':PORT')"},
      {"localhost", "'localhost' is not HOST:PORT (missing ':PORT')"},
      {":80", "':80' is not HOST:PORT (empty host)"},
      {"localhost:0", "'localhost:0' is not HOST:PORT (port must be 1..65535)"},
      {"localhost:65536",
       "'localhost:65536' is not HOST:PORT (port must be 1..65535)"},
      {"localhost:-1",
       "'localhost:-1' is not HOST:PORT (port is not a number)"},
      {"::1:80", "'::1:80' is not HOST:PORT (IPv6 addresses need brackets)"},
      {"[fe80::1%eth0]:80",
       "'[fe80::1%eth0]:80' is not HOST:PORT (bad character in IPv6 "
       "address)"},
      {"0.0.0.0:80",
       "'0.0.0.0:80' is not HOST:PORT (a wildcard address is nowhere to "
       "connect to)"},
      {"[::]:80",
       "'[::]:80' is not HOST:PORT (a wildcard address is nowhere to connect "
       "to)"},
      {"[0:0::0]:80",
       "'[0:0::0]:80' is not HOST:PORT (a wildcard address is nowhere to "
       "connect to)"},
      {"evil\n\x1b[31m:80",
       "'evil\\n\\x1b[31m:80' is not HOST:PORT (bad character in host)"},
      {std::string("nul\0byte:80", 11),
       "'nul\\x00\\x62yte:80' is not HOST:PORT (bad character in host)"},
      {std::string(254, 'a') + ":65535",
       "an address of 260 bytes is not HOST:PORT (at most 259 bytes)"},
      {std::string(1 << 20, 'x'),
       "an address of 1048576 bytes is not HOST:PORT (at most 259 bytes)"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseConnectAddress(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(), c.message);
  }
}

TEST(ProbeBindTest, FreePortBinds) {
  EXPECT_TRUE(ProbeBind({"127.0.0.1", 0}).ok());
}

TEST(ProbeBindTest, PortInUseIsUnavailableWithReason) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);

  absl::Status status = ProbeBind({"127.0.0.1", port});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("Address already in use"));
  close(fd);
}

TEST(ProbeBindTest, UnresolvableHostIsInvalidArgument) {
  absl::Status status = ProbeBind({"no-such-host.invalid", 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("cannot resolve host"));
}

TEST(IsLoopbackTest, LoopbackAddressesAndNames) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1",
                           "localhost", "LocalHost"}) {
    EXPECT_TRUE(IsLoopback({host, 0})) << host;
  }
}

TEST(IsLoopbackTest, EverythingElseIsNot) {
  // Wildcards listen on every interface; other names may resolve anywhere.
  for (const char* host :
       {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "::ffff:10.0.0.1",
        "example.com", "localhost.com", "fe80::1"}) {
    EXPECT_FALSE(IsLoopback({host, 0})) << host;
  }
}

}  // namespace
}  // namespace opserver
