#include "server/data_listener.h"

#include <sys/socket.h>

#include <cerrno>
#include <string>

#include "absl/synchronization/notification.h"
#include "common/data_path.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

UniqueFd Dial(const DataListener& listener) {
  absl::StatusOr<UniqueFd> fd = ConnectTcp("127.0.0.1", listener.port(),
                                           absl::Seconds(5), absl::Seconds(10));
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? *std::move(fd) : UniqueFd();
}

// True when the server closed `fd` (reads end of stream or a reset) within
// the socket's receive timeout.
bool ClosedByServer(int fd) {
  char byte;
  ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

std::unique_ptr<DataListener> StartListener(
    DataListener::Options options = {}) {
  absl::StatusOr<std::unique_ptr<DataListener>> listener =
      DataListener::Start(options);
  EXPECT_TRUE(listener.ok()) << listener.status();
  return listener.ok() ? *std::move(listener) : nullptr;
}

TEST(DataListenerTest, HandsTheConnectionAndWhatFollowsTheTicketOver) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  EXPECT_GT(listener->port(), 0);
  absl::Notification got;
  UniqueFd server_end;
  absl::StatusOr<std::string> ticket = listener->Expect([&](UniqueFd fd) {
    server_end = std::move(fd);
    got.Notify();
  });
  ASSERT_TRUE(ticket.ok());
  ASSERT_EQ(ticket->size(), kDataTicketBytes);
  UniqueFd client = Dial(*listener);
  // The ticket in two pieces, then data: the data must not be consumed.
  ASSERT_TRUE(SendAll(client.get(), ticket->data(), 5).ok());
  ASSERT_TRUE(
      SendAll(client.get(), ticket->data() + 5, kDataTicketBytes - 5).ok());
  ASSERT_TRUE(SendAll(client.get(), "payload", 7).ok());
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
  char data[7];
  absl::StatusOr<size_t> n = RecvFull(server_end.get(), data, sizeof(data));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(data, *n), "payload");
  // Claimed: no longer expected.
  EXPECT_EQ(listener->expected(), 0u);
}

TEST(DataListenerTest, TicketsAreRandomAndDistinct) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  auto a = listener->Expect([](UniqueFd) {});
  auto b = listener->Expect([](UniqueFd) {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(*a, std::string(kDataTicketBytes, '\0'));
  EXPECT_EQ(listener->expected(), 2u);
  listener->Forget(*a);
  listener->Forget(*b);
  listener->Forget(*b);  // Unknown now: ignored.
  EXPECT_EQ(listener->expected(), 0u);
}

TEST(DataListenerTest, WrongTicketIsClosedAndClaimsNothing) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  bool called = false;
  auto ticket = listener->Expect([&](UniqueFd) { called = true; });
  ASSERT_TRUE(ticket.ok());
  std::string wrong = *ticket;
  wrong[0] ^= 1;
  UniqueFd client = Dial(*listener);
  ASSERT_TRUE(SendAll(client.get(), wrong.data(), wrong.size()).ok());
  EXPECT_TRUE(ClosedByServer(client.get()));
  EXPECT_FALSE(called);
  EXPECT_EQ(listener->expected(), 1u);  // The right one still works.
}

TEST(DataListenerTest, ATicketClaimsOneConnectionOnly) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  int calls = 0;
  absl::Notification got;
  auto ticket = listener->Expect([&](UniqueFd) {
    ++calls;
    got.Notify();
  });
  ASSERT_TRUE(ticket.ok());
  UniqueFd first = Dial(*listener);
  ASSERT_TRUE(SendAll(first.get(), ticket->data(), ticket->size()).ok());
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
  UniqueFd second = Dial(*listener);
  ASSERT_TRUE(SendAll(second.get(), ticket->data(), ticket->size()).ok());
  EXPECT_TRUE(ClosedByServer(second.get()));
  EXPECT_EQ(calls, 1);
}

TEST(DataListenerTest, ForgottenTicketIsRefused) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  bool called = false;
  auto ticket = listener->Expect([&](UniqueFd) { called = true; });
  ASSERT_TRUE(ticket.ok());
  listener->Forget(*ticket);
  UniqueFd client = Dial(*listener);
  ASSERT_TRUE(SendAll(client.get(), ticket->data(), ticket->size()).ok());
  EXPECT_TRUE(ClosedByServer(client.get()));
  EXPECT_FALSE(called);
}

TEST(DataListenerTest, SilentConnectionIsClosedAfterTheTicketTimeout) {
  DataListener::Options options;
  options.ticket_timeout = absl::Milliseconds(200);
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  UniqueFd client = Dial(*listener);
  ASSERT_TRUE(SendAll(client.get(), "abc", 3).ok());  // Part of a ticket.
  EXPECT_TRUE(ClosedByServer(client.get()));
}

TEST(DataListenerTest, UnclaimedConnectionsAreBoundedOldestFirst) {
  DataListener::Options options;
  options.max_unclaimed = 2;
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  UniqueFd a = Dial(*listener);
  // Accepted in order: each waits until the listener has taken it.
  absl::SleepFor(absl::Milliseconds(100));
  UniqueFd b = Dial(*listener);
  absl::SleepFor(absl::Milliseconds(100));
  UniqueFd c = Dial(*listener);
  EXPECT_TRUE(ClosedByServer(a.get()));
  // The newer ones still wait, and a ticket still claims one of them.
  absl::Notification got;
  auto ticket = listener->Expect([&](UniqueFd) { got.Notify(); });
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(SendAll(c.get(), ticket->data(), ticket->size()).ok());
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(DataListenerTest, PortInUseIsUnavailable) {
  auto first = StartListener();
  ASSERT_NE(first, nullptr);
  DataListener::Options options;
  options.port = first->port();
  absl::StatusOr<std::unique_ptr<DataListener>> second =
      DataListener::Start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("cannot listen"), std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace opserver
