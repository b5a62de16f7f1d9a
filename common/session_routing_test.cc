#include "common/session_routing.h"

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(SessionRoutingTest, NewKeysAreWellFormedAndDistinct) {
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    std::string key = NewSessionRoutingKey();
    EXPECT_TRUE(CheckSessionRoutingKey(key).ok()) << key;
    EXPECT_TRUE(seen.insert(key).second) << key;
  }
}

TEST(SessionRoutingTest, MalformedKeysAreRefusedWithoutEchoingThem) {
  absl::Status short_key = CheckSessionRoutingKey("abc");
  EXPECT_EQ(short_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_key.message(),
            "x-opserver-session has 3 characters; a key is 32 lowercase hex "
            "digits (128 bits)");
  absl::Status upper = CheckSessionRoutingKey(std::string(32, 'A'));
  EXPECT_EQ(upper.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(upper.message(),
            "x-opserver-session holds a character that is not a lowercase "
            "hex digit; a key is 32 of them (128 bits)");
}

TEST(SessionRoutingTest, NotFoundNamesTheKeyAndTheHeader) {
  const std::string key(32, 'e');
  absl::Status status = SessionRoutingKeyNotFound(key);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(),
            "no session with routing key eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee "
            "(x-opserver-session) on this server: the call reached a server "
            "that did not create the session; a proxy in front must send "
            "every call with this key to one server (route on the "
            "x-opserver-session header: docs/pool.md)");
}

TEST(SessionRoutingTest, NotFoundEscapesAndShortensAHostileKey) {
  std::string hostile = "\n\x01" + std::string(100, 'z');
  absl::Status status = SessionRoutingKeyNotFound(hostile);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("routing key \"\\n\\x01zzz"));
  EXPECT_THAT(status.message(), HasSubstr("zzz...\" (x-opserver-session)"));
  EXPECT_THAT(status.message(), Not(HasSubstr(std::string(33, 'z'))));
}

}  // namespace
}  // namespace opserver
