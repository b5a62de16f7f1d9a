// DeviceSet: the devices of several servers as one list of ordinals, for
// the C++ client (what OPSERVER_ADDRESS=h1,h2 is for the C API).

#include "client/device_set.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace {

using remote::DeviceSet;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Server> StartServer(int devices,
                                    const std::string& listen = "127.0.0.1:0") {
  Options options;
  options.listen = listen;
  options.threads = 1;
  options.devices = devices;
  options.device_memory_bytes = 64ull << 20;
  options.shutdown_grace = absl::ZeroDuration();
  auto server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(DeviceSetTest, ParsesAddressLists) {
  auto one = DeviceSet::ParseAddresses("127.0.0.1:1");
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(*one, ElementsAre("127.0.0.1:1"));
  auto two = DeviceSet::ParseAddresses(" a:1 , dns:///b:2");
  ASSERT_TRUE(two.ok());
  EXPECT_THAT(*two, ElementsAre("a:1", "dns:///b:2"));
  for (const char* bad : {"", "a:1,", ",a:1", "a:1,,b:2"}) {
    EXPECT_EQ(DeviceSet::ParseAddresses(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// Ordinals count the servers' devices in list order; a session on an
// ordinal runs on that server's device; a lost server fails only its own
// ordinals, naming it, and Reconnect brings them back once it returns.
TEST(DeviceSetTest, OrdinalsSpanServers) {
  auto first = StartServer(1);
  auto second = StartServer(2);
  const std::string second_address = second->address();
  remote::ConnectOptions options;
  options.connect_timeout = absl::Seconds(2);
  auto set = DeviceSet::Connect({first->address(), second_address}, options);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ((*set)->size(), 3u);
  auto d2 = (*set)->device(2);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->server, 1u);
  EXPECT_EQ(d2->local, 1u);
  EXPECT_EQ(d2->info.kind(), "cpu");
  EXPECT_THAT((*set)->device(3).status().message(),
              HasSubstr("device 3 does not exist"));

  auto on0 = (*set)->CreateSession(0, "device_set_test");
  auto on2 = (*set)->CreateSession(2, "device_set_test");
  ASSERT_TRUE(on0.ok() && on2.ok());
  auto buffer = (*on2)->Malloc(4096);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto stats = (*on2)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->device(), 1u);
  buffer->Release();

  // The second server goes away: its ordinals fail, naming it; the first
  // server's go on.
  on2->reset();
  second.reset();
  auto lost = (*set)->CreateSession(1, "device_set_test");
  EXPECT_FALSE(lost.ok());
  EXPECT_THAT(lost.status().message(), HasSubstr(second_address));
  auto still = (*on0)->Malloc(16);
  EXPECT_TRUE(still.ok()) << still.status();

  // It is back: a new connection serves its ordinals again.
  second = StartServer(2, second_address);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE((*set)->Reconnect(1).ok());
  auto again = (*set)->CreateSession(1, "device_set_test");
  ASSERT_TRUE(again.ok()) << again.status();
  auto again_stats = (*again)->Stats();
  ASSERT_TRUE(again_stats.ok());
  EXPECT_EQ(again_stats->device(), 0u);
}

TEST(DeviceSetTest, AnUnreachableServerFailsConnectNamingIt) {
  auto first = StartServer(1);
  remote::ConnectOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  auto set = DeviceSet::Connect({first->address(), "127.0.0.1:1"}, options);
  ASSERT_FALSE(set.ok());
  EXPECT_THAT(set.status().message(), HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(DeviceSet::Connect({}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace opserver
