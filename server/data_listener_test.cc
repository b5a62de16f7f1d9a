#include "server/data_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
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

// Counts the connections a listener has taken (through
// Options::drop_accepted): it takes each in full (admits it, or closes
// it) before it accepts the next, so a test that waits for each dial to
// be taken knows their order.
class AcceptCounter {
 public:
  explicit AcceptCounter(DataListener::Options& options) {
    options.drop_accepted = [count = count_] {
      ++*count;
      return false;
    };
  }
  // Waits (up to 60 s) until `n` connections were taken.
  bool Taken(int n) const {
    for (int i = 0; i < 6000 && count_->load() < n; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return count_->load() >= n;
  }

 private:
  std::shared_ptr<std::atomic<int>> count_ =
      std::make_shared<std::atomic<int>>(0);
};

// Dials `listener` and presents a new ticket: the listener's end of the
// connection it handed over (invalid when it did not within 10 s), and
// the client's end in `client`.
UniqueFd Claimed(DataListener& listener, UniqueFd* client) {
  UniqueFd server_end;
  absl::Notification got;
  auto ticket = listener.Expect([&](UniqueFd fd) {
    server_end = std::move(fd);
    got.Notify();
  });
  EXPECT_TRUE(ticket.ok());
  if (!ticket.ok()) return UniqueFd();
  *client = Dial(listener);
  EXPECT_TRUE(SendAll(client->get(), ticket->data(), ticket->size()).ok());
  if (!got.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    listener.Forget(*ticket);
    ADD_FAILURE() << "the ticket was not claimed";
    return UniqueFd();
  }
  return server_end;
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
  auto ticket = listener->Expect([](UniqueFd) {});
  ASSERT_TRUE(ticket.ok());
  UniqueFd client = Dial(*listener);
  ASSERT_TRUE(SendAll(client.get(), ticket->data(), 3).ok());  // Part of it.
  EXPECT_TRUE(ClosedByServer(client.get()));
}

TEST(DataListenerTest, UnclaimedConnectionsAreBoundedOldestFirst) {
  DataListener::Options options;
  options.max_unclaimed = 2;
  AcceptCounter accepted(options);
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  // Accepted in order: each dial waits until the listener has taken the
  // one before it, so `a` is certainly the oldest.
  UniqueFd a = Dial(*listener);
  ASSERT_TRUE(accepted.Taken(1));
  UniqueFd b = Dial(*listener);
  ASSERT_TRUE(accepted.Taken(2));
  UniqueFd c = Dial(*listener);
  EXPECT_TRUE(ClosedByServer(a.get()));
  // The newer ones still wait, and a ticket still claims one of them.
  absl::Notification got;
  auto ticket = listener->Expect([&](UniqueFd) { got.Notify(); });
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(SendAll(c.get(), ticket->data(), ticket->size()).ok());
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// A connection whose ticket is in, unread, when more connections arrive
// than may wait is claimed: newcomers never push it out. The listener's
// thread is held in a claim callback so that the ticket and the newcomers
// queue up behind it and are taken in one go.
TEST(DataListenerTest, ATicketWaitingUnreadIsNotDroppedForNewcomers) {
  DataListener::Options options;
  options.max_unclaimed = 4;
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  absl::Notification holding, release;
  auto hold = listener->Expect([&](UniqueFd) {
    holding.Notify();
    release.WaitForNotification();
  });
  absl::Notification got;
  auto ticket = listener->Expect([&](UniqueFd) { got.Notify(); });
  ASSERT_TRUE(hold.ok() && ticket.ok());
  UniqueFd holder = Dial(*listener);
  ASSERT_TRUE(SendAll(holder.get(), hold->data(), hold->size()).ok());
  ASSERT_TRUE(holding.WaitForNotificationWithTimeout(absl::Seconds(10)));
  UniqueFd victim = Dial(*listener);
  ASSERT_TRUE(SendAll(victim.get(), ticket->data(), ticket->size()).ok());
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(Dial(*listener));
  release.Notify();
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// Tickets are random, so a first byte no expected ticket starts with is
// enough to close the connection (it does not wait for 16 bytes or the
// ticket timeout); a right first byte keeps it.
TEST(DataListenerTest, AWrongFirstByteIsClosedAtOnce) {
  DataListener::Options options;
  options.ticket_timeout = absl::Seconds(60);  // Longer than Dial's reads.
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  absl::Notification got;
  auto ticket = listener->Expect([&](UniqueFd) { got.Notify(); });
  ASSERT_TRUE(ticket.ok());
  const char wrong = static_cast<char>((*ticket)[0] ^ 1);
  UniqueFd intruder = Dial(*listener);
  ASSERT_TRUE(SendAll(intruder.get(), &wrong, 1).ok());
  EXPECT_TRUE(ClosedByServer(intruder.get()));
  UniqueFd client = Dial(*listener);
  ASSERT_TRUE(SendAll(client.get(), ticket->data(), 1).ok());
  ASSERT_TRUE(
      SendAll(client.get(), ticket->data() + 1, ticket->size() - 1).ok());
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// Waits until `want` of `fds` are closed by the server (or 10 s pass) and
// returns which are.
std::vector<bool> WaitUntilClosed(const std::vector<UniqueFd>& fds,
                                  size_t want) {
  std::vector<bool> closed(fds.size(), false);
  size_t count = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (count < want && absl::Now() < deadline) {
    std::vector<pollfd> polled;
    for (const UniqueFd& fd : fds) polled.push_back({fd.get(), POLLIN, 0});
    if (poll(polled.data(), polled.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (closed[i] || polled[i].revents == 0) continue;
      closed[i] = ClosedByServer(fds[i].get());
      count += closed[i];
    }
  }
  return closed;
}

TEST(DataListenerTest, WaitingConnectionsPerSourceAreCappedOldestFirst) {
  DataListener::Options options;
  options.max_unclaimed_per_source = 3;
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 8; ++i) silent.push_back(Dial(*listener));
  std::vector<bool> closed = WaitUntilClosed(silent, 5);
  EXPECT_EQ(closed, std::vector<bool>(
                        {true, true, true, true, true, false, false, false}));
  absl::Notification got;
  auto ticket = listener->Expect([&](UniqueFd) { got.Notify(); });
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(SendAll(silent[7].get(), ticket->data(), ticket->size()).ok());
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// Connects from `source` (any loopback address: 127.0.0.0/8) to the
// listener; invalid when that fails.
UniqueFd DialFrom(const char* source, int port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Thousands of connections that send nothing, opened and closed from
// another source address as fast as two threads can, while clients present
// their tickets: every client is claimed. Each client waits until ten more
// churned connections have been opened, so the churn runs between them
// however the threads are scheduled.
TEST(DataListenerTest, AChurnOfSilentConnectionsLosesNoTicket) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  const int port = listener->port();
  std::atomic<bool> stop{false};
  std::atomic<int> churned{0};
  std::vector<std::thread> churn;
  for (int t = 0; t < 2; ++t) {
    churn.emplace_back([&] {
      // Each thread keeps up to 40 open: together past max_unclaimed.
      std::deque<UniqueFd> open;
      for (int i = 0; i < 2000 && !stop.load(); ++i) {
        UniqueFd fd = DialFrom("127.0.0.2", port);
        if (!fd.valid()) continue;
        open.push_back(std::move(fd));
        if (open.size() > 40) open.pop_front();
        churned.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 30; ++i) {
    for (int wait = 0; wait < 60000 && churned.load() < 10 * (i + 1); ++wait) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    if (churned.load() < 10 * (i + 1)) {
      ADD_FAILURE() << "the churn stopped at " << churned.load();
      break;  // Joined below.
    }
    absl::Notification got;
    auto ticket = listener->Expect([&](UniqueFd) { got.Notify(); });
    ASSERT_TRUE(ticket.ok());
    UniqueFd client = Dial(*listener);
    ASSERT_TRUE(SendAll(client.get(), ticket->data(), ticket->size()).ok());
    EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)))
        << "client " << i;
    if (!got.HasBeenNotified()) listener->Forget(*ticket);
  }
  stop = true;
  for (std::thread& t : churn) t.join();
}

// A connection given back (Keep) carries its client's next ticket, sent
// before it was given back or after, and what follows the ticket.
TEST(DataListenerTest, AKeptConnectionCarriesTheNextTickets) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  UniqueFd client;
  UniqueFd server_end = Claimed(*listener, &client);
  ASSERT_TRUE(server_end.valid());
  for (int i = 0; i < 2; ++i) {
    absl::Notification next;
    auto b = listener->Expect([&](UniqueFd fd) {
      server_end = std::move(fd);
      next.Notify();
    });
    ASSERT_TRUE(b.ok());
    const std::string sent = *b + "next";
    // The first time the ticket is in before the connection is given back.
    if (i == 0) ASSERT_TRUE(SendAll(client.get(), sent.data(), 20).ok());
    listener->Keep(std::move(server_end));
    if (i == 1) ASSERT_TRUE(SendAll(client.get(), sent.data(), 20).ok());
    ASSERT_TRUE(next.WaitForNotificationWithTimeout(absl::Seconds(10)));
    char data[4];
    absl::StatusOr<size_t> n = RecvFull(server_end.get(), data, sizeof(data));
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(std::string(data, *n), "next");
  }
  EXPECT_EQ(listener->accepted(), 1u);
  EXPECT_EQ(listener->reused(), 2u);
  EXPECT_EQ(listener->expected(), 0u);
}

TEST(DataListenerTest, AKeptConnectionIsClosedAfterTheKeptTimeout) {
  DataListener::Options options;
  options.ticket_timeout = absl::Seconds(60);  // Longer than Dial's reads.
  options.kept_timeout = absl::Milliseconds(200);
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  UniqueFd client;
  UniqueFd server_end = Claimed(*listener, &client);
  ASSERT_TRUE(server_end.valid());
  listener->Keep(std::move(server_end));
  EXPECT_TRUE(ClosedByServer(client.get()));
  EXPECT_EQ(listener->refused(), 0u);
}

// Kept connections wait under the same bounds as new ones, and are the
// first to go for room: a newcomer past the per-source cap closes the
// kept connection, not an older new one (and that counts as no refusal).
TEST(DataListenerTest, AKeptConnectionIsTheFirstToGoForRoom) {
  DataListener::Options options;
  options.max_unclaimed_per_source = 2;
  options.ticket_timeout = absl::Seconds(60);
  AcceptCounter accepted(options);
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  UniqueFd older = Dial(*listener);
  ASSERT_TRUE(accepted.Taken(1));
  UniqueFd kept;
  UniqueFd server_end = Claimed(*listener, &kept);
  ASSERT_TRUE(server_end.valid());
  // Admitted before the listener accepts anything after this call.
  listener->Keep(std::move(server_end));
  UniqueFd newcomer = Dial(*listener);
  EXPECT_TRUE(ClosedByServer(kept.get()));
  EXPECT_EQ(listener->refused(), 0u);
  for (UniqueFd* waiting : {&older, &newcomer}) {
    absl::Notification claimed;
    auto next = listener->Expect([&](UniqueFd) { claimed.Notify(); });
    ASSERT_TRUE(next.ok());
    ASSERT_TRUE(SendAll(waiting->get(), next->data(), next->size()).ok());
    EXPECT_TRUE(claimed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
}

// Waits (up to 10 s) until `listener` has `n` connections parked.
bool Parked(const DataListener& listener, size_t n) {
  for (int i = 0; i < 1000 && listener.parked() < n; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  return listener.parked() >= n;
}

// A kept connection (client's end in `client`), given back to `listener`.
void KeepOne(DataListener& listener, UniqueFd* client) {
  UniqueFd server_end = Claimed(listener, client);
  ASSERT_TRUE(server_end.valid());
  listener.Keep(std::move(server_end));
}

std::string ClientTicket() {
  absl::StatusOr<std::string> ticket = RandomBytes(kDataTicketBytes);
  EXPECT_TRUE(ticket.ok());
  return ticket.value_or(std::string(kDataTicketBytes, 'x'));
}

// A ticket the client chose (the pipelined data_transfer command) may come
// on a kept connection before the server expects it, whole or in part:
// the connection waits, parked, and is handed over with what followed the
// ticket once the ticket is expected.
TEST(DataListenerTest, AKeptConnectionsTicketMayComeBeforeItIsExpected) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  UniqueFd client;
  KeepOne(*listener, &client);
  const std::string ticket = ClientTicket();
  // Half of it first: no expected ticket starts so, and it still waits.
  ASSERT_TRUE(SendAll(client.get(), ticket.data(), 8).ok());
  ASSERT_TRUE(Parked(*listener, 1));
  const std::string rest = ticket.substr(8) + "next";
  ASSERT_TRUE(SendAll(client.get(), rest.data(), rest.size()).ok());
  UniqueFd handed;
  absl::Notification got;
  ASSERT_TRUE(listener
                  ->ExpectTicket(ticket,
                                 [&](UniqueFd fd) {
                                   handed = std::move(fd);
                                   got.Notify();
                                 })
                  .ok());
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
  char data[4];
  absl::StatusOr<size_t> n = RecvFull(handed.get(), data, sizeof(data));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(data, *n), "next");
  EXPECT_EQ(listener->reused(), 1u);
  EXPECT_EQ(listener->expected(), 0u);
}

// Parking is for kept connections only: a new connection must present a
// ticket that is expected already.
TEST(DataListenerTest, ANewConnectionsUnexpectedTicketIsStillClosed) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  UniqueFd client = Dial(*listener);
  const std::string ticket = ClientTicket();
  ASSERT_TRUE(SendAll(client.get(), ticket.data(), ticket.size()).ok());
  EXPECT_TRUE(ClosedByServer(client.get()));
  EXPECT_EQ(listener->parked(), 0u);
}

// A refused ticket (its command was refused) closes the connection parked
// with it, and one that presents it later.
TEST(DataListenerTest, ARefusedTicketClosesItsConnection) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  UniqueFd parked;
  KeepOne(*listener, &parked);
  const std::string first = ClientTicket();
  ASSERT_TRUE(SendAll(parked.get(), first.data(), first.size()).ok());
  ASSERT_TRUE(Parked(*listener, 1));
  listener->Refuse(first);
  EXPECT_TRUE(ClosedByServer(parked.get()));

  UniqueFd later;
  KeepOne(*listener, &later);
  const std::string second = ClientTicket();
  listener->Refuse(second);
  ASSERT_TRUE(SendAll(later.get(), second.data(), second.size()).ok());
  EXPECT_TRUE(ClosedByServer(later.get()));
}

// A parked ticket waits for its command for the ticket time-out, not the
// (longer) time a kept connection waits for its next ticket.
TEST(DataListenerTest, AParkedTicketIsClosedAfterTheTicketTimeout) {
  DataListener::Options options;
  options.ticket_timeout = absl::Milliseconds(200);
  options.kept_timeout = absl::Seconds(60);
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  UniqueFd client;
  KeepOne(*listener, &client);
  const std::string ticket = ClientTicket();
  ASSERT_TRUE(SendAll(client.get(), ticket.data(), ticket.size()).ok());
  EXPECT_TRUE(ClosedByServer(client.get()));
}

// A parked connection goes for room as a silent one does: a newcomer past
// the per-source cap closes it, not an older connection holding part of
// an expected ticket.
TEST(DataListenerTest, AParkedConnectionGoesForRoom) {
  DataListener::Options options;
  options.max_unclaimed_per_source = 2;
  options.ticket_timeout = absl::Seconds(60);
  AcceptCounter accepted(options);
  auto listener = StartListener(options);
  ASSERT_NE(listener, nullptr);
  UniqueFd parked;
  KeepOne(*listener, &parked);
  const std::string unknown = ClientTicket();
  ASSERT_TRUE(SendAll(parked.get(), unknown.data(), unknown.size()).ok());
  ASSERT_TRUE(Parked(*listener, 1));
  absl::Notification claimed;
  absl::StatusOr<std::string> expected =
      listener->Expect([&](UniqueFd) { claimed.Notify(); });
  ASSERT_TRUE(expected.ok());
  UniqueFd older = Dial(*listener);
  ASSERT_TRUE(accepted.Taken(2));  // Claimed's dial, then this one.
  ASSERT_TRUE(SendAll(older.get(), expected->data(), 4).ok());
  UniqueFd newcomer = Dial(*listener);
  EXPECT_TRUE(ClosedByServer(parked.get()));
  ASSERT_TRUE(SendAll(older.get(), expected->data() + 4, 12).ok());
  EXPECT_TRUE(claimed.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

// The client's ticket is checked: its size, and that it is not expected
// already (a reused ticket).
TEST(DataListenerTest, ExpectTicketRefusesMalformedAndReusedTickets) {
  auto listener = StartListener();
  ASSERT_NE(listener, nullptr);
  EXPECT_EQ(listener->ExpectTicket("short", [](UniqueFd) {}).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string ticket = ClientTicket();
  ASSERT_TRUE(listener->ExpectTicket(ticket, [](UniqueFd) {}).ok());
  EXPECT_EQ(listener->ExpectTicket(ticket, [](UniqueFd) {}).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(listener->expected(), 1u);
  listener->Forget(ticket);
  EXPECT_EQ(listener->expected(), 0u);
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
