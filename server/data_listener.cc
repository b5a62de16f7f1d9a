#include "server/data_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace opserver {
namespace {

// A connection that has not yet sent a whole ticket.
struct Unclaimed {
  UniqueFd fd;
  absl::Time deadline;
  std::string ticket;  // What it sent so far.
};

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
  listener->thread_ = std::thread([l = listener.get()] { l->Run(); });
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
  absl::StatusOr<std::string> ticket = RandomBytes(kDataTicketBytes);
  if (!ticket.ok()) return ticket.status();
  absl::MutexLock lock(&mu_);
  expected_.emplace(*ticket, std::move(on_connect));
  return ticket;
}

void DataListener::Forget(const std::string& ticket) {
  std::function<void(UniqueFd)> dropped;  // Destroyed outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = expected_.find(ticket);
  if (it == expected_.end()) return;
  dropped = std::move(it->second);
  expected_.erase(it);
}

size_t DataListener::expected() const {
  absl::MutexLock lock(&mu_);
  return expected_.size();
}

void DataListener::Run() {
  std::deque<Unclaimed> unclaimed;
  std::vector<pollfd> polled;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const absl::Time now = absl::Now();
    // Drop connections past their deadline; wait for the next deadline.
    absl::Duration wait = absl::InfiniteDuration();
    for (auto it = unclaimed.begin(); it != unclaimed.end();) {
      if (it->deadline <= now) {
        it = unclaimed.erase(it);
      } else {
        wait = std::min(wait, it->deadline - now);
        ++it;
      }
    }
    polled.clear();
    polled.push_back({wake_fd_.get(), POLLIN, 0});
    polled.push_back({listen_fd_.get(), POLLIN, 0});
    for (const Unclaimed& u : unclaimed)
      polled.push_back({u.fd.get(), POLLIN, 0});
    const int timeout_ms = wait == absl::InfiniteDuration()
                               ? -1
                               : static_cast<int>(absl::ToInt64Milliseconds(
                                     absl::Ceil(wait, absl::Milliseconds(1))));
    if (poll(polled.data(), polled.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      return;  // Cannot happen with valid descriptors.
    }
    if (polled[0].revents != 0) continue;  // Stopping: checked above.
    // Read from the connections first (their pollfds follow the two
    // fixed ones in order), then accept: accepting changes the deque.
    std::vector<std::pair<std::function<void(UniqueFd)>, UniqueFd>> claimed;
    size_t index = 2;
    for (auto it = unclaimed.begin(); it != unclaimed.end(); ++index) {
      if (polled[index].revents == 0) {
        ++it;
        continue;
      }
      char bytes[kDataTicketBytes];
      const size_t want = kDataTicketBytes - it->ticket.size();
      ssize_t n = recv(it->fd.get(), bytes, want, 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        ++it;
        continue;
      }
      if (n <= 0) {  // Closed or failed before its ticket.
        it = unclaimed.erase(it);
        continue;
      }
      it->ticket.append(bytes, static_cast<size_t>(n));
      if (it->ticket.size() < kDataTicketBytes) {
        ++it;
        continue;
      }
      std::function<void(UniqueFd)> on_connect;
      {
        absl::MutexLock lock(&mu_);
        auto found = expected_.find(it->ticket);
        if (found != expected_.end()) {
          on_connect = std::move(found->second);
          expected_.erase(found);
        }
      }
      if (on_connect) {
        const int flags = fcntl(it->fd.get(), F_GETFL);
        fcntl(it->fd.get(), F_SETFL, flags & ~O_NONBLOCK);
        claimed.emplace_back(std::move(on_connect), std::move(it->fd));
      }
      it = unclaimed.erase(it);  // Claimed, or a wrong ticket: closed.
    }
    // Handed over outside the lock: the transfer takes its own.
    for (auto& [on_connect, fd] : claimed) on_connect(std::move(fd));
    if (polled[1].revents != 0) {
      for (;;) {
        UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr,
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
        if (unclaimed.size() >= options_.max_unclaimed) unclaimed.pop_front();
        unclaimed.push_back(
            {std::move(fd), absl::Now() + options_.ticket_timeout, {}});
      }
    }
  }
}

}  // namespace opserver
