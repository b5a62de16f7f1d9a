#include "common/etcd_address.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(EtcdAddressTest, ParsesEndpointsAndPrefix) {
  auto parsed = ParseEtcdAddress(
      "etcd://127.0.0.1:2379,[::1]:2380,etcd-0:2379/ops/pool1");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->endpoints,
              ElementsAre("127.0.0.1:2379", "[::1]:2380", "etcd-0:2379"));
  EXPECT_EQ(parsed->prefix, "ops/pool1");
  EXPECT_EQ(parsed->Root(), "/ops/pool1/");
  EXPECT_EQ(parsed->DeviceKey("10.0.0.1:50051", 3),
            "/ops/pool1/devices/10.0.0.1:50051/00003");
  EXPECT_EQ(parsed->ClaimKey("10.0.0.1:50051", 12),
            "/ops/pool1/claims/10.0.0.1:50051/00012");
}

TEST(EtcdAddressTest, IsEtcdAddressLooksAtTheSchemeOnly) {
  EXPECT_TRUE(IsEtcdAddress("etcd://"));
  EXPECT_FALSE(IsEtcdAddress("127.0.0.1:50051"));
  EXPECT_FALSE(IsEtcdAddress("dns:///etcd:2379"));
}

TEST(EtcdAddressTest, MalformedAddressesSayWhatIsWrong) {
  const struct {
    const char* text;
    const char* why;
  } cases[] = {
      {"http://127.0.0.1:2379/p", "not etcd://"},
      {"etcd://127.0.0.1:2379", "no /PREFIX"},
      {"etcd:///p", "no etcd endpoint"},
      {"etcd://127.0.0.1/p", "etcd endpoint '127.0.0.1'"},
      {"etcd://127.0.0.1:0/p", "has port 0"},
      {"etcd://127.0.0.1:2379,/p", "etcd endpoint ''"},
      {"etcd://127.0.0.1:99999/p", "etcd endpoint '127.0.0.1:99999'"},
      {"etcd://127.0.0.1:2379/", "empty PREFIX"},
      {"etcd://127.0.0.1:2379/a//b", "empty segment"},
      {"etcd://127.0.0.1:2379/a/", "empty segment"},
      {"etcd://127.0.0.1:2379/a b", "the character ' '"},
      {"etcd://127.0.0.1:2379/a\nb", "the character '\\n'"},
  };
  for (const auto& c : cases) {
    auto parsed = ParseEtcdAddress(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.why)) << c.text;
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX"));
  }
  EXPECT_FALSE(ParseEtcdAddress("etcd://h:1/" + std::string(300, 'a')).ok());
}

TEST(EtcdAddressTest, DeviceKeysParseBackAndHostileOnesAreRefused) {
  auto parts = ParseDeviceKeyRest("10.0.0.1:50051/00007");
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->address, "10.0.0.1:50051");
  EXPECT_EQ(parts->device, 7u);
  auto v6 = ParseDeviceKeyRest("[::1]:50051/00000");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->address, "[::1]:50051");
  for (const char* bad :
       {"", "00001", "/00001", "h:1/1", "h:1/0000x", "h:1/-0001", "h:1/+0001",
        "h/00001", "h:0/00001", "h:1/000001", "a b:1/00001"}) {
    EXPECT_FALSE(ParseDeviceKeyRest(bad).ok()) << bad;
  }
  EXPECT_FALSE(ParseDeviceKeyRest(std::string(400, 'a') + ":1/00001").ok());
}

}  // namespace
}  // namespace opserver
