#include "server/data_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/thread_start.h"

namespace opserver {
// A connection that has not yet sent a whole ticket.
struct DataListener::Unclaimed {
  UniqueFd fd;
  absl::Time deadline;
  std::string source;  // The peer's address (without the port).
  std::string ticket;  // What it sent so far: part of an expected ticket.
  bool kept = false;   // Given back by a transfer (Keep).
  // Kept, with what no expected ticket starts with (ExpectTicket).
  bool parked = false;
};

// The connections waiting to be claimed, oldest first, and how many come
// from each address.
struct DataListener::Waiting {
  std::list<Unclaimed> connections;
  absl::flat_hash_map<std::string, size_t> per_source;

  void Add(Unclaimed connection) {
    ++per_source[connection.source];
    connections.push_back(std::move(connection));
  }
  std::list<Unclaimed>::iterator Erase(std::list<Unclaimed>::iterator it) {
    auto count = per_source.find(it->source);
    if (--count->second == 0) per_source.erase(count);
    return connections.erase(it);
  }
  size_t From(const std::string& source) const {
    auto count = per_source.find(source);
    return count == per_source.end() ? 0 : count->second;
  }
};

namespace {

// The address part of a peer's socket address, as bytes.
std::string SourceOf(const sockaddr_storage& peer) {
  if (peer.ss_family == AF_INET6) {
    const auto& address = reinterpret_cast<const sockaddr_in6&>(peer);
    return std::string(reinterpret_cast<const char*>(&address.sin6_addr),
                       sizeof(address.sin6_addr));
  }
  const auto& address = reinterpret_cast<const sockaddr_in&>(peer);
  return std::string(reinterpret_cast<const char*>(&address.sin_addr),
                     sizeof(address.sin_addr));
}

// Accepts per turn of the loop: under a flood of connections the accept
// loop would otherwise never end, and never read or hand over tickets.
constexpr int kAcceptsPerTurn = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<DataListener>> DataListener::Start(
    const Options& options) {
  std::unique_ptr<DataListener> listener(new DataListener(options));
  // The first address that binds: the one a client resolving the same host
  // name tries first.
  absl::StatusOr<UniqueFd> fd = FirstUsableSocket(
      options.host, options.port, /*passive=*/true, "listen on",
      [](int fd, const addrinfo& address) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        return bind(fd, address.ai_addr, address.ai_addrlen) == 0 &&
               listen(fd, 128) == 0;
      });
  if (!fd.ok()) return fd.status();
  listener->listen_fd_ = *std::move(fd);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listener->listen_fd_.get(), reinterpret_cast<sockaddr*>(&bound),
              &len);
  listener->port_ =
      ntohs(bound.ss_family == AF_INET6
                ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  listener->wake_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!listener->wake_fd_.valid()) {
    return absl::InternalError(
        absl::StrCat("data path: eventfd: ", std::strerror(errno)));
  }
  absl::StatusOr<std::thread> thread =
      StartThread("the data path's thread", [l = listener.get()] { l->Run(); });
  if (!thread.ok()) return thread.status();
  listener->thread_ = *std::move(thread);
  return listener;
}

DataListener::~DataListener() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
}

absl::StatusOr<std::string> DataListener::Expect(
    std::function<void(UniqueFd)> on_connect) {
  ASSIGN_OR_RETURN(std::string ticket, RandomBytes(kDataTicketBytes));
  absl::MutexLock lock(&mu_);
  expected_.emplace(ticket, std::move(on_connect));
  return ticket;
}

absl::Status DataListener::ExpectTicket(
    const std::string& ticket, std::function<void(UniqueFd)> on_connect) {
  if (ticket.size() != kDataTicketBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ticket: ", kDataTicketBytes, " bytes, not ", ticket.size()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!expected_.emplace(ticket, std::move(on_connect)).second) {
      return absl::AlreadyExistsError("ticket: expected already");
    }
  }
  WakeParked();
  return absl::OkStatus();
}

void DataListener::Refuse(const std::string& ticket) {
  if (ticket.size() != kDataTicketBytes) return;  // No connection has it.
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    while (!refused_tickets_.empty() &&
           (refused_tickets_.front().second <= now ||
            refused_tickets_.size() >= kMaxRefusedTickets)) {
      refused_tickets_.pop_front();
    }
    refused_tickets_.emplace_back(ticket, now + options_.ticket_timeout);
  }
  WakeParked();
}

bool DataListener::TakeRefusedLocked(const std::string& ticket) {
  for (auto it = refused_tickets_.begin(); it != refused_tickets_.end(); ++it) {
    if (it->first == ticket) {
      refused_tickets_.erase(it);
      return true;
    }
  }
  return false;
}

void DataListener::WakeParked() {
  if (parked_.load() == 0) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
}

void DataListener::Forget(const std::string& ticket) {
  std::function<void(UniqueFd)> dropped;  // Destroyed outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = expected_.find(ticket);
  if (it == expected_.end()) return;
  dropped = std::move(it->second);
  expected_.erase(it);
}

void DataListener::Keep(UniqueFd connection) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;  // Closed here.
    kept_.push_back(std::move(connection));
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_.get(), &one, sizeof(one));
}

void DataListener::AdmitKept(Waiting& waiting, Claims* claims) {
  std::vector<UniqueFd> kept;
  {
    absl::MutexLock lock(&mu_);
    kept.swap(kept_);
  }
  for (UniqueFd& fd : kept) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    if (getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len) !=
        0) {
      continue;  // Gone meanwhile.
    }
    const int flags = fcntl(fd.get(), F_GETFL);
    fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
    Unclaimed connection{std::move(fd),
                         absl::Now() + options_.kept_timeout,
                         SourceOf(peer),
                         {},
                         /*kept=*/true};
    // The client may have sent its next ticket already.
    if (Advance(connection, claims) == Progress::kGone) continue;
    Admit(std::move(connection), waiting, claims);
  }
}

size_t DataListener::expected() const {
  absl::MutexLock lock(&mu_);
  return expected_.size();
}

DataListener::Progress DataListener::Advance(Unclaimed& connection,
                                             Claims* claims) {
  char bytes[kDataTicketBytes];
  // No more than the rest of the ticket: what follows it is the transfer's.
  const size_t want = kDataTicketBytes - connection.ticket.size();
  ssize_t n = 0;
  if (want > 0) {
    do {
      n = recv(connection.fd.get(), bytes, want, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      return Progress::kGone;  // Closed or failed before its ticket.
    }
  }
  if (n > 0 && connection.kept && connection.ticket.empty() &&
      options_.drop_kept && options_.drop_kept()) {
    return Progress::kGone;
  }
  if (n > 0) connection.ticket.append(bytes, static_cast<size_t>(n));
  if (connection.ticket.empty()) return Progress::kSilent;
  std::function<void(UniqueFd)> on_connect;
  {
    absl::MutexLock lock(&mu_);
    // Checked again even without new bytes: its ticket may be forgotten.
    auto found = expected_.lower_bound(connection.ticket);
    if (found == expected_.end() ||
        found->first.compare(0, connection.ticket.size(), connection.ticket) !=
            0) {
      const bool whole = connection.ticket.size() == kDataTicketBytes;
      if (!connection.kept || (whole && TakeRefusedLocked(connection.ticket))) {
        return Progress::kGone;  // No ticket starts so: closed at once.
      }
      // Perhaps a ticket the client chose, whose command is on its way.
      if (!connection.parked) {
        connection.parked = true;
        // Under the lock that ExpectTicket takes before it looks at this:
        // an expected ticket that came after the check above wakes Run().
        ++parked_;
        connection.deadline = std::min(connection.deadline,
                                       absl::Now() + options_.ticket_timeout);
      }
      return Progress::kPartial;
    }
    connection.parked = false;
    if (connection.ticket.size() < kDataTicketBytes) return Progress::kPartial;
    on_connect = std::move(found->second);
    expected_.erase(found);
  }
  if (connection.kept) ++reused_;
  const int flags = fcntl(connection.fd.get(), F_GETFL);
  fcntl(connection.fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  claims->emplace_back(std::move(on_connect), std::move(connection.fd));
  return Progress::kGone;
}

bool DataListener::EvictSilent(const std::string* source, Waiting& waiting,
                               Claims* claims) {
  for (;;) {
    // The address to take from: the given one, or the one with the most
    // connections among those with a silent one. (On loopback every client
    // is 127.0.0.1, so this spares nobody there: what protects a client
    // that shares its address with a flood is that its ticket, once
    // sent, keeps its connection.)
    const std::string* from = source;
    if (from == nullptr) {
      size_t most = 0;
      for (const Unclaimed& u : waiting.connections) {
        if (!u.ticket.empty() && !u.parked) continue;
        const size_t count = waiting.From(u.source);
        if (count > most) {
          most = count;
          from = &u.source;
        }
      }
    }
    // A kept connection first (its client can dial again at the cost of
    // one connect), else the oldest.
    auto victim = waiting.connections.end();
    if (from != nullptr) {
      for (auto it = waiting.connections.begin();
           it != waiting.connections.end(); ++it) {
        if ((it->ticket.empty() || it->parked) && it->source == *from &&
            (victim == waiting.connections.end() ||
             (it->kept && !victim->kept))) {
          victim = it;
          if (it->kept) break;
        }
      }
    }
    if (victim == waiting.connections.end()) {
      // None silent. A partial ticket whose transfer has ended since is no
      // longer worth its place.
      bool freed = false;
      for (auto it = waiting.connections.begin();
           it != waiting.connections.end();) {
        if ((source == nullptr || it->source == *source) &&
            Advance(*it, claims) == Progress::kGone) {
          it = waiting.Erase(it);
          freed = true;
        } else {
          ++it;
        }
      }
      return freed;
    }
    // Its ticket may have arrived since it was last read: read it first.
    const Progress progress = Advance(*victim, claims);
    // Part of an expected ticket: kept; look again.
    if (progress == Progress::kPartial && !victim->parked) continue;
    if (progress == Progress::kSilent && !victim->kept) {
      ++refused_;  // Evicted for room.
    }
    waiting.Erase(victim);  // Closed, claimed, or silent: it goes.
    return true;
  }
}

void DataListener::Admit(Unclaimed connection, Waiting& waiting,
                         Claims* claims) {
  // A source at its cap makes room among its own connections only. A
  // flood can hold a place past a silent connection only by guessing the
  // first byte of an expected ticket (one time in 256 per ticket), and then
  // only until its ticket timeout or a wrong next byte.
  if (waiting.From(connection.source) >= options_.max_unclaimed_per_source &&
      !EvictSilent(&connection.source, waiting, claims)) {
    ++refused_;
    return;  // Every one of them has part of a ticket: the newcomer goes.
  }
  if (waiting.connections.size() >= options_.max_unclaimed &&
      !EvictSilent(nullptr, waiting, claims)) {
    ++refused_;
    return;
  }
  waiting.Add(std::move(connection));
}

void DataListener::Run() {
  Waiting waiting;
  std::vector<pollfd> polled;
  std::vector<std::list<Unclaimed>::iterator> polled_connections;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const absl::Time now = absl::Now();
    // Drop connections past their deadline; wait for the next deadline.
    absl::Duration wait = absl::InfiniteDuration();
    for (auto it = waiting.connections.begin();
         it != waiting.connections.end();) {
      if (it->deadline <= now) {
        it = waiting.Erase(it);
      } else {
        wait = std::min(wait, it->deadline - now);
        ++it;
      }
    }
    polled.clear();
    polled_connections.clear();
    polled.push_back({wake_fd_.get(), POLLIN, 0});
    polled.push_back({listen_fd_.get(), POLLIN, 0});
    size_t parked = 0;
    for (auto it = waiting.connections.begin(); it != waiting.connections.end();
         ++it) {
      // A whole ticket parked is followed by its transfer's bytes, which
      // are not the listener's to read: it waits for ExpectTicket or
      // Refuse (which wake this loop) or its deadline.
      const bool whole = it->ticket.size() == kDataTicketBytes;
      polled.push_back(
          {it->fd.get(), static_cast<short>(whole ? 0 : POLLIN), 0});
      polled_connections.push_back(it);
      parked += it->parked ? 1 : 0;
    }
    parked_.store(parked);
    const int timeout_ms = wait == absl::InfiniteDuration()
                               ? -1
                               : static_cast<int>(absl::ToInt64Milliseconds(
                                     absl::Ceil(wait, absl::Milliseconds(1))));
    if (poll(polled.data(), polled.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;  // Cannot happen with valid descriptors.
    }
    if (polled[0].revents != 0) {  // Stopping, or a connection was kept.
      uint64_t count;
      (void)!read(wake_fd_.get(), &count, sizeof(count));
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    // Read from the connections first (their pollfds follow the two
    // fixed ones in order), then accept: accepting changes the list.
    Claims claims;
    const bool woken = polled[0].revents != 0;
    for (size_t i = 0; i < polled_connections.size(); ++i) {
      if (polled[i + 2].revents == 0 &&
          !(woken && polled_connections[i]->parked)) {
        continue;
      }
      // A parked whole ticket is not read from, so a hang-up would be
      // reported on every turn: it goes now.
      if ((polled[i + 2].revents & (POLLHUP | POLLERR)) != 0 &&
          polled_connections[i]->ticket.size() == kDataTicketBytes) {
        waiting.Erase(polled_connections[i]);
        continue;
      }
      if (Advance(*polled_connections[i], &claims) == Progress::kGone) {
        waiting.Erase(polled_connections[i]);
      }
    }
    AdmitKept(waiting, &claims);
    if (polled[1].revents != 0) {
      for (int accepted = 0; accepted < kAcceptsPerTurn; ++accepted) {
        sockaddr_storage peer{};
        socklen_t peer_len = sizeof(peer);
        UniqueFd fd(accept4(listen_fd_.get(),
                            reinterpret_cast<sockaddr*>(&peer), &peer_len,
                            SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd.valid()) {
          // Out of descriptors or memory: the listening socket stays
          // readable, so back off instead of spinning.
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
              errno == ENOMEM) {
            absl::SleepFor(absl::Milliseconds(10));
          }
          break;  // EAGAIN, or an aborted connection.
        }
        ++accepted_;
        if (options_.drop_accepted && options_.drop_accepted()) continue;
        Unclaimed connection{std::move(fd),
                             absl::Now() + options_.ticket_timeout,
                             SourceOf(peer),
                             {}};
        // Clients send their ticket right after connecting: it is often
        // in already, and then the connection never has to wait.
        if (Advance(connection, &claims) == Progress::kGone) continue;
        Admit(std::move(connection), waiting, &claims);
      }
    }
    // Handed over outside the lock: the transfer takes its own.
    for (auto& [on_connect, fd] : claims) on_connect(std::move(fd));
  }
}

}  // namespace opserver
