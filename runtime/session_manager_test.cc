#include "runtime/session_manager.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/session_routing.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/session.h"

namespace opserver {
namespace {

TEST(SessionDeviceTest, CreateSessionFailsWhenTheDeviceHasNoStream) {
  FakeDevice device(/*max_streams=*/0);
  SessionManager manager(&device, SessionLimits());
  absl::StatusOr<std::shared_ptr<Session>> session =
      manager.Create("client", "owner");
  EXPECT_EQ(session.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(manager.session_count(), 0u);
}

// Several devices: everything a session does uses the device it was
// created on, and each device's memory is accounted on its own.
TEST(SessionManagerDevicesTest, SessionsAllocateFromTheirOwnDevice) {
  constexpr uint64_t kCapacity = 1 << 20;
  FakeDevice device0(-1, true, kCapacity);
  FakeDevice device1(-1, true, kCapacity);
  SessionManager manager({&device0, &device1}, SessionLimits());
  ASSERT_EQ(manager.device_count(), 2u);
  absl::StatusOr<std::shared_ptr<Session>> zero =
      manager.Create("zero", "owner", 0);
  absl::StatusOr<std::shared_ptr<Session>> one =
      manager.Create("one", "owner", 1);
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*zero)->device(), &device0);
  EXPECT_EQ((*one)->device(), &device1);
  EXPECT_EQ((*one)->device_index(), 1u);

  // Device 0 full: its session is refused by the device, device 1's
  // session still allocates, from device 1.
  absl::StatusOr<uint64_t> all = (*zero)->Malloc(kCapacity);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(device0.FreeBytes(), 0u);
  absl::StatusOr<uint64_t> refused = (*zero)->Malloc(4096);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<uint64_t> more = (*one)->Malloc(4096);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(device1.FreeBytes(), kCapacity - 4096);
  EXPECT_EQ((*(*one)->GetBuffer(*more))->device(), &device1);
  EXPECT_EQ((*(*zero)->GetBuffer(*all))->device(), &device0);

  // Stats show which device holds what; the totals are the sums.
  EXPECT_EQ(manager.device_accounting(0).buffers.load(), 1u);
  EXPECT_EQ(manager.device_accounting(0).bytes.load(), kCapacity);
  EXPECT_EQ(manager.device_accounting(1).buffers.load(), 1u);
  EXPECT_EQ(manager.device_accounting(1).bytes.load(), 4096u);
  EXPECT_EQ(manager.accounting().buffers.load(), 2u);
  EXPECT_EQ(manager.accounting().bytes.load(), kCapacity + 4096);
  EXPECT_EQ(manager.SessionsPerDevice(), (std::vector<uint64_t>{1, 1}));
  std::vector<SessionManager::OwnerStats> owners = manager.StatsByOwner();
  ASSERT_EQ(owners.size(), 2u) << "one entry per owner and device";
  EXPECT_EQ(owners[0].device, 0u);
  EXPECT_EQ(owners[0].buffer_bytes, kCapacity);
  EXPECT_EQ(owners[1].device, 1u);
  EXPECT_EQ(owners[1].buffer_bytes, 4096u);
}

TEST(SessionManagerDevicesTest, ClosingASessionReturnsItsDevice) {
  FakeDevice device0(-1, true, 1 << 20);
  FakeDevice device1(-1, true, 1 << 20);
  SessionManager manager({&device0, &device1}, SessionLimits());
  absl::StatusOr<std::shared_ptr<Session>> zero =
      manager.Create("zero", "owner", 0);
  absl::StatusOr<std::shared_ptr<Session>> one =
      manager.Create("one", "owner", 1);
  ASSERT_TRUE(zero.ok() && one.ok());
  ASSERT_TRUE((*zero)->Malloc(8192).ok());
  ASSERT_TRUE((*one)->Malloc(4096).ok());
  ASSERT_TRUE((*one)->Malloc(4096).ok());
  const std::string id = (*one)->id();
  one->reset();
  ASSERT_TRUE(manager.Close(id, "owner", "test").ok());
  manager.WaitForTeardown();
  EXPECT_EQ(manager.device_accounting(1).buffers.load(), 0u);
  EXPECT_EQ(manager.device_accounting(1).bytes.load(), 0u);
  EXPECT_EQ(device1.FreeBytes(), 1u << 20);
  EXPECT_EQ(manager.device_accounting(0).buffers.load(), 1u);
  EXPECT_EQ(manager.device_accounting(0).bytes.load(), 8192u);
  EXPECT_EQ(manager.SessionsPerDevice(), (std::vector<uint64_t>{1, 0}));
}

TEST(SessionManagerDevicesTest, DeviceOutOfRangeIsInvalidArgument) {
  FakeDevice device0;
  FakeDevice device1;
  SessionManager manager({&device0, &device1}, SessionLimits());
  for (uint32_t device : {2u, 0xffffffffu}) {
    absl::StatusOr<std::shared_ptr<Session>> session =
        manager.Create("client", "owner", device);
    EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(session.status().message(),
                ::testing::HasSubstr(absl::StrCat("device ", device,
                                                  " does not exist: the "
                                                  "server has 2 devices")));
  }
  EXPECT_EQ(manager.session_count(), 0u);
  // Nothing was made on any device for them.
  EXPECT_TRUE(device0.streams().empty());
  EXPECT_TRUE(device1.streams().empty());
  SessionManager single(&device0, SessionLimits());
  EXPECT_THAT(single.Create("client", "owner", 1).status().message(),
              ::testing::HasSubstr("the server has 1 device (0)"));
}

// The routing key a session was created with (common/session_routing.h)
// admits calls that carry it or none; another key, or a key for a session
// created without one, is NOT_FOUND naming the call's key, not the session.
TEST(SessionManagerRoutingTest, CallsMustCarryTheSessionsKeyOrNone) {
  FakeDevice device;
  SessionManager manager(&device, SessionLimits());
  const std::string key(32, 'a');
  const std::string other(32, 'b');
  absl::StatusOr<std::shared_ptr<Session>> keyed =
      manager.Create("keyed", "owner", 0, key);
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  absl::StatusOr<std::shared_ptr<Session>> plain =
      manager.Create("plain", "owner", 0);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::string id = (*keyed)->id();

  EXPECT_TRUE(manager.Get(id, "owner", key).ok());
  EXPECT_TRUE(manager.Get(id, "owner").ok());  // grpcurl, older clients.
  EXPECT_TRUE(manager.Get((*plain)->id(), "owner").ok());
  const std::string refused = SessionRoutingKeyNotFound(other).ToString();
  EXPECT_EQ(manager.Get(id, "owner", other).status().ToString(), refused);
  EXPECT_THAT(refused, ::testing::Not(::testing::HasSubstr(id)));
  EXPECT_THAT(refused, ::testing::HasSubstr(
                           "NOT_FOUND: no session with routing key " + other));
  EXPECT_EQ(manager.Get((*plain)->id(), "owner", other).status().ToString(),
            refused);
  // Unknown here (the proxy sent it to the wrong server) and another
  // owner's: the same answer.
  EXPECT_EQ(manager.Get("0123", "owner", other).status().ToString(), refused);
  EXPECT_EQ(manager.Get(id, "intruder", key).status(),
            SessionRoutingKeyNotFound(key));
  // Close is checked the same way, and a refused Close closes nothing.
  EXPECT_EQ(manager.Close(id, "owner", "test", nullptr, other),
            SessionRoutingKeyNotFound(other));
  EXPECT_EQ(manager.session_count(), 2u);
  EXPECT_TRUE(manager.Close(id, "owner", "test", nullptr, key).ok());
  EXPECT_EQ(manager.session_count(), 1u);
}

TEST(SessionManagerRoutingTest, MalformedKeyAtCreateIsInvalidArgument) {
  FakeDevice device;
  SessionManager manager(&device, SessionLimits());
  for (const std::string& bad :
       {std::string(), std::string("abc"), std::string(32, 'G')}) {
    absl::StatusOr<std::shared_ptr<Session>> session =
        manager.Create("client", "owner", 0, bad);
    EXPECT_EQ(session.status(), CheckSessionRoutingKey(bad));
    EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(manager.session_count(), 0u);
}

// A session's streams, the default one included, are its device's streams.
TEST(SessionManagerDevicesTest, StreamsOfASessionAreOnItsDevice) {
  FakeDevice device0;
  FakeDevice device1;
  SessionManager manager({&device0, &device1}, SessionLimits());
  absl::StatusOr<std::shared_ptr<Session>> one =
      manager.Create("one", "owner", 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(device1.streams().size(), 1u) << "the default stream's";
  absl::StatusOr<uint64_t> stream = (*one)->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(device1.streams().size(), 2u);
  EXPECT_TRUE(device0.streams().empty());
  // Work on the stream runs on device 1's device stream.
  std::shared_ptr<Stream> created = *(*one)->GetStream(*stream);
  // Outlive the copy, which the fake device runs at the stream's
  // synchronize after the task.
  char bytes[2] = {7, 0};
  ASSERT_TRUE(created
                  ->Enqueue([device = created->device_stream(), &bytes] {
                    return device->CopyToDevice(&bytes[1], &bytes[0], 1);
                  })
                  .ok());
  EXPECT_TRUE(created->SynchronizeAndWait().ok());
  EXPECT_EQ(device1.streams()[1]->copies.load(), 1);
  EXPECT_EQ(device1.streams()[0]->copies.load(), 0);
  EXPECT_EQ(bytes[1], 7);
}

}  // namespace
}  // namespace opserver
