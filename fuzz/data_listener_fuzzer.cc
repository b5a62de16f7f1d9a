// The data listener's handshake (server/data_listener.h) over real loopback
// sockets. The input is a script: the listener's limits, how many tickets
// it expects (and, divided by 3, how many the client chooses), then up to
// 24 steps, each one of
//   - connect a new connection (at most 8),
//   - send on a connection the next piece of a ticket (so pieces in order
//     make the whole ticket), possibly with one byte flipped, or raw bytes,
//   - close a connection (a plain close, or a reset),
//   - sleep up to 3 ms,
//   - forget a ticket, or (with the step's bit 3) give a connection the
//     listener handed over back to it (Keep), to wait for its next ticket,
//   - (with the step's bit 4 instead) expect (with bit 3) or refuse a
//     ticket the client chose (up to 2 of them, sent on connections like
//     the others: a kept connection may send one before it is expected,
//     and waits for it, parked).
// Tickets, and kept connections, time out after 5 ms, so an input takes a
// few milliseconds.
//
// Invariants besides memory safety and a clean destruction:
//   - a ticket's callback runs at most once, and is handed a connection
//     that sent exactly that ticket as one of its 16-byte pieces (the
//     first, or, once given back, a later one);
//   - every connection that was not handed over is closed by the listener
//     once the ticket timeout has passed (none is kept waiting);
//   - afterwards the listener still works: a new ticket is claimed (a
//     client that finds its connection closed tries again, as the client
//     library does).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/data_path.h"
#include "fuzz/fuzz_support.h"
#include "server/data_listener.h"

namespace {

using opserver::DataListener;
using opserver::kDataTicketBytes;
using opserver::UniqueFd;

constexpr absl::Duration kTicketTimeout = absl::Milliseconds(5);
constexpr size_t kMaxConnections = 8;
constexpr size_t kMaxSteps = 24;

// Reads the input a byte at a time; zeros once it is used up.
class Script {
 public:
  Script(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Next() { return at_ < size_ ? data_[at_++] : 0; }
  bool Done() const { return at_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

struct Connection {
  UniqueFd fd;
  int port = 0;      // Its local port: how the listener's end is known.
  std::string sent;  // Everything sent, recorded before it is sent.
  bool closed_here = false;
};

// What the listener handed over, recorded on its thread.
struct Claims {
  absl::Mutex mu;
  std::vector<int> calls ABSL_GUARDED_BY(mu);  // Per ticket.
  std::vector<int> ports ABSL_GUARDED_BY(mu);  // Per ticket: the peer's port.
  std::vector<UniqueFd> fds ABSL_GUARDED_BY(mu);
};

int PortOf(int fd, bool peer) {
  sockaddr_storage address{};
  socklen_t len = sizeof(address);
  const int rc =
      peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&address), &len)
           : getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len);
  if (rc != 0) return -1;
  return ntohs(address.ss_family == AF_INET6
                   ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                   : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

// Closes without TIME_WAIT on this side (a reset), so that thousands of
// inputs do not use up the loopback's ports.
void Abort(UniqueFd& fd) {
  linger hard{1, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
  fd.reset();
}

// True once the listener closed `fd` (end of stream or reset) within
// `timeout`.
bool ClosedByListener(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    const int wait = static_cast<int>(absl::ToInt64Milliseconds(
        std::max(deadline - absl::Now(), absl::ZeroDuration())));
    if (poll(&p, 1, wait) <= 0) return false;
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
    FUZZ_CHECK(n < 0, "the listener sent bytes on an unclaimed connection");
  }
}

// One input's run: the listener, its tickets, the connections made to it
// and what it handed over.
class Run {
 public:
  explicit Run(Script& script) : script_(script) {
    DataListener::Options options;
    options.host = "127.0.0.1";
    options.ticket_timeout = kTicketTimeout;
    options.kept_timeout = kTicketTimeout;
    const uint8_t limits = script_.Next();
    options.max_unclaimed = 1 + (limits & 7);
    options.max_unclaimed_per_source = 1 + ((limits >> 3) & 7);
    auto started = DataListener::Start(options);
    FUZZ_CHECK(started.ok(), started.status().ToString());
    listener_ = *std::move(started);
    const uint8_t tickets = script_.Next();
    ticket_count_ = 1 + tickets % 3;
    const size_t client_count = tickets / 3 % 3;
    total_ = ticket_count_ + client_count;
    {
      absl::MutexLock lock(&claims_->mu);
      claims_->calls.assign(total_ + 1, 0);
      claims_->ports.assign(total_ + 1, -1);
    }
    for (size_t i = 0; i < ticket_count_; ++i) tickets_.push_back(Expect(i));
    for (size_t i = 0; i < client_count; ++i) {
      auto ticket = opserver::RandomBytes(kDataTicketBytes);
      FUZZ_CHECK(ticket.ok(), ticket.status().ToString());
      tickets_.push_back(*std::move(ticket));
    }
  }

  // The script's steps.
  void Steps() {
    for (size_t step = 0; step < kMaxSteps && !script_.Done(); ++step) {
      const uint8_t op = script_.Next();
      switch (op % 5) {
        case 0:
          Connect();
          break;
        case 1:
          Send();
          break;
        case 2:
          Close(op);
          break;
        case 3:  // Sleep.
          absl::SleepFor(absl::Microseconds(script_.Next() % 4 * 1000));
          break;
        case 4:
          if (op & 16) {
            ClientTicket(op);
          } else if (op & 8) {
            KeepClaimed();
          } else {
            listener_->Forget(tickets_[script_.Next() % total_]);
          }
          break;
      }
    }
  }

  // Every connection not handed over is closed once its ticket timeout
  // has passed: by then the listener has read it or given up on it.
  void CheckUnclaimedClosed() {
    for (Connection& c : connections_) {
      if (c.closed_here) continue;
      const absl::Time deadline = absl::Now() + absl::Seconds(5);
      while (!Claimed(c.port) &&
             !ClosedByListener(c.fd.get(), absl::Milliseconds(1))) {
        FUZZ_CHECK(absl::Now() < deadline,
                   "a connection that was not handed over is still open "
                   "after its ticket timeout; it sent ",
                   c.sent.size(), " bytes");
      }
    }
  }

  // A fresh ticket still claims a connection.
  void CheckFreshTicketClaimed() {
    const std::string last = Expect(total_);
    bool got = false;
    for (int attempt = 0; attempt < 20 && !got; ++attempt) {
      auto fd = opserver::ConnectTcp("127.0.0.1", listener_->port(),
                                     absl::Seconds(5), absl::Seconds(5));
      FUZZ_CHECK(fd.ok(), fd.status().ToString());
      opserver::SendAll(fd->get(), last.data(), last.size()).IgnoreError();
      got = AwaitLastClaim(fd->get());
      Abort(*fd);
      if (!got) absl::SleepFor(kTicketTimeout);
    }
    FUZZ_CHECK(got, "a valid ticket was refused 20 times in a row");
  }

  // Destroys the listener (joining its thread: it must not hang) and
  // checks what it handed over: each ticket at most one connection, one
  // that sent that ticket first.
  void Finish() {
    listener_.reset();
    absl::MutexLock lock(&claims_->mu);
    for (size_t i = 0; i <= total_; ++i) {
      FUZZ_CHECK(claims_->calls[i] <= 1, "ticket ", i, " claimed ",
                 claims_->calls[i], " connections");
      // Its peer is unknown when the client reset it before the listener
      // asked (-1); a port closed by a reset may have been reused.
      if (claims_->calls[i] == 0 || i == total_ || claims_->ports[i] < 0) {
        continue;
      }
      bool sent_it = false;
      for (const Connection& c : connections_) {
        if (c.port != claims_->ports[i]) continue;
        for (size_t at = 0; at < c.sent.size(); at += kDataTicketBytes) {
          sent_it |= c.sent.substr(at, kDataTicketBytes) == tickets_[i];
        }
      }
      FUZZ_CHECK(sent_it, "ticket ", i,
                 " was handed a connection that did not send it as a piece");
    }
    for (Connection& c : connections_) {
      if (!c.closed_here) Abort(c.fd);
    }
    for (UniqueFd& fd : claims_->fds) Abort(fd);
  }

 private:
  // Records a claim of the ticket at `index`.
  std::function<void(UniqueFd)> Recorder(size_t index) {
    return [claims = claims_, index](UniqueFd fd) {
      absl::MutexLock lock(&claims->mu);
      ++claims->calls[index];
      claims->ports[index] = PortOf(fd.get(), /*peer=*/true);
      claims->fds.push_back(std::move(fd));
    };
  }

  // A ticket whose claim is recorded at `index`.
  std::string Expect(size_t index) {
    auto ticket = listener_->Expect(Recorder(index));
    FUZZ_CHECK(ticket.ok(), ticket.status().ToString());
    return *std::move(ticket);
  }

  // Expects (op's bit 3) or refuses one of the client's tickets.
  void ClientTicket(uint8_t op) {
    if (total_ == ticket_count_) return;
    const size_t index =
        ticket_count_ + script_.Next() % (total_ - ticket_count_);
    if ((op & 8) == 0) {
      listener_->Refuse(tickets_[index]);
      return;
    }
    const absl::Status expected =
        listener_->ExpectTicket(tickets_[index], Recorder(index));
    FUZZ_CHECK(expected.ok() || absl::IsAlreadyExists(expected),
               expected.ToString());
  }

  void Connect() {
    if (connections_.size() >= kMaxConnections) return;
    auto fd = opserver::ConnectTcp("127.0.0.1", listener_->port(),
                                   absl::Seconds(5), absl::Seconds(5));
    FUZZ_CHECK(fd.ok(), fd.status().ToString());
    Connection connection;
    connection.port = PortOf(fd->get(), /*peer=*/false);
    connection.fd = *std::move(fd);
    connections_.push_back(std::move(connection));
  }

  // The next piece of a ticket (one byte flipped, sometimes), or raw
  // bytes from the input, on a connection.
  void Send() {
    if (connections_.empty()) return;
    Connection& c = connections_[script_.Next() % connections_.size()];
    if (c.closed_here) return;
    const uint8_t how = script_.Next();
    const size_t length = 1 + script_.Next() % kDataTicketBytes;
    std::string bytes;
    if ((how & 3) == 3) {  // Raw bytes from the input.
      for (size_t i = 0; i < length; ++i) bytes.push_back(script_.Next());
    } else {  // The next piece of a ticket.
      const std::string& ticket = tickets_[(how >> 2) % total_];
      // Within the connection's current 16-byte piece, so that a kept
      // connection can be sent its next ticket.
      bytes = ticket.substr(c.sent.size() % kDataTicketBytes, length);
      if ((how & 3) == 2) bytes[(how >> 4) % bytes.size()] ^= 1;
    }
    {
      absl::MutexLock lock(&claims_->mu);  // Before the listener sees it.
      c.sent += bytes;
    }
    // The listener may have closed it: either way.
    opserver::SendAll(c.fd.get(), bytes.data(), bytes.size()).IgnoreError();
  }

  // Gives one of the connections handed over so far back to the listener.
  void KeepClaimed() {
    UniqueFd fd;
    {
      absl::MutexLock lock(&claims_->mu);
      if (claims_->fds.empty()) return;
      fd = std::move(claims_->fds[script_.Next() % claims_->fds.size()]);
    }
    if (fd.valid()) listener_->Keep(std::move(fd));
  }

  // A plain close, or a reset when op's bit 3.
  void Close(uint8_t op) {
    if (connections_.empty()) return;
    Connection& c = connections_[script_.Next() % connections_.size()];
    if (c.closed_here) return;
    c.closed_here = true;
    if (op & 8) {
      Abort(c.fd);
    } else {
      c.fd.reset();
    }
  }

  bool Claimed(int port) {
    absl::MutexLock lock(&claims_->mu);
    for (int p : claims_->ports) {
      if (p == port) return true;
    }
    return false;
  }

  // Whether the last ticket's connection `fd` was claimed (false when the
  // listener closed it before reading it: no room).
  bool AwaitLastClaim(int fd) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (;;) {
      {
        absl::MutexLock lock(&claims_->mu);
        if (claims_->calls[total_] > 0) return true;
      }
      if (ClosedByListener(fd, absl::Milliseconds(1))) {
        absl::MutexLock lock(&claims_->mu);
        return claims_->calls[total_] > 0;
      }
      FUZZ_CHECK(absl::Now() < deadline, "a valid ticket was never claimed");
    }
  }

  Script& script_;
  std::unique_ptr<DataListener> listener_;
  std::shared_ptr<Claims> claims_ = std::make_shared<Claims>();
  size_t ticket_count_ = 0;  // The server's; the client's follow them.
  size_t total_ = 0;         // Tickets in all (tickets_.size()).
  std::vector<std::string> tickets_;
  std::vector<Connection> connections_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Script script(data, size);
  Run run(script);
  run.Steps();
  run.CheckUnclaimedClosed();
  run.CheckFreshTicketClaimed();
  run.Finish();
  return 0;
}
