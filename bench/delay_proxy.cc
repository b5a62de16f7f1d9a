#include "bench/delay_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace opserver::bench {
namespace {

// A steady clock: the delay must not stretch or shrink if the wall clock is
// adjusted while bytes are queued.
using Clock = std::chrono::steady_clock;

// Large enough that a bulk transfer is not split into tiny delayed chunks,
// small enough to stay off the stack.
constexpr size_t kReadBytes = 256 << 10;

// How long before a chunk is due its thread stops sleeping and spins.
constexpr std::chrono::microseconds kSpin(60);

absl::Status ErrnoError(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void SetNoDelay(int fd) {
  // Without it Nagle holds back small writes (gRPC frames) waiting for an
  // ACK, adding a delay of its own on top of the one we model.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetNonBlocking(int fd) {
  // Non-blocking so that no thread can be stuck in send() or recv() when
  // the proxy stops: they all wait in poll() beside the stop eventfd.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Splits "HOST:PORT" or "[IPV6]:PORT" and resolves it.
absl::Status Resolve(const std::string& host_port, sockaddr_storage* address,
                     socklen_t* length) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("target \"", host_port, "\" is not HOST:PORT"));
  }
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  int port_number;
  if (!absl::SimpleAtoi(port, &port_number) || port_number <= 0 ||
      port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("target \"", host_port, "\" has no valid port"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (error != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve \"", host_port, "\": ", gai_strerror(error)));
  }
  std::memcpy(address, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  freeaddrinfo(found);
  return absl::OkStatus();
}

timespec ToTimespec(Clock::duration duration) {
  if (duration < Clock::duration::zero()) duration = Clock::duration::zero();
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count();
  timespec result;
  result.tv_sec = ns / 1000000000;
  result.tv_nsec = ns % 1000000000;
  return result;
}

enum class SendResult { kSent, kFailed, kStopped };

// Writes all of `bytes` to the non-blocking `fd`, waiting for room as long
// as needed unless `stop_fd` becomes readable.
SendResult SendAll(int fd, int stop_fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return SendResult::kFailed;
    }
    pollfd fds[2] = {{stop_fd, POLLIN, 0}, {fd, POLLOUT, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return SendResult::kFailed;
    if (fds[0].revents != 0) return SendResult::kStopped;
  }
  return SendResult::kSent;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DelayProxy>> DelayProxy::Start(
    const std::string& target_host_port, absl::Duration one_way_delay) {
  if (one_way_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("one_way_delay must not be negative");
  }
  std::unique_ptr<DelayProxy> proxy(new DelayProxy);
  proxy->delay_ = one_way_delay;
  absl::Status resolved =
      Resolve(target_host_port, &proxy->target_, &proxy->target_len_);
  if (!resolved.ok()) return resolved;

  proxy->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (proxy->stop_fd_ < 0) return ErrnoError("eventfd");
  proxy->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (proxy->listen_fd_ < 0) return ErrnoError("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // A free port: tests and benchmarks run in parallel.
  if (bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address),
           sizeof(address)) != 0) {
    return ErrnoError("bind 127.0.0.1:0");
  }
  if (listen(proxy->listen_fd_, 64) != 0) return ErrnoError("listen");
  socklen_t length = sizeof(address);
  if (getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&address),
                  &length) != 0) {
    return ErrnoError("getsockname");
  }
  proxy->port_ = ntohs(address.sin_port);
  SetNonBlocking(proxy->listen_fd_);
  DelayProxy* raw = proxy.get();
  proxy->acceptor_ = std::thread([raw] { raw->AcceptLoop(); });
  return proxy;
}

DelayProxy::~DelayProxy() {
  if (stop_fd_ >= 0) {
    // Never read back: the eventfd stays readable, so every poll() in every
    // thread, now or later, sees the stop.
    const uint64_t one = 1;
    if (write(stop_fd_, &one, sizeof(one)) != sizeof(one)) std::abort();
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock lock(&mu_);
    // The direction threads close their own sockets as they finish.
    for (auto& connection : connections_) {
      connection->upstream.join();
      connection->downstream.join();
    }
    connections_.clear();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void DelayProxy::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{stop_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;
    const int client = accept4(listen_fd_, nullptr, nullptr,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (client < 0) continue;  // EAGAIN, or a client that already left.
    ReapFinished();
    // The connection to the target is made before any byte flows, so its
    // handshake is not delayed; only the bytes are.
    const int target =
        socket(target_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (target < 0 ||
        connect(target, reinterpret_cast<const sockaddr*>(&target_),
                target_len_) != 0) {
      // The client sees its connection end, as if the target refused it.
      if (target >= 0) close(target);
      close(client);
      continue;
    }
    SetNonBlocking(target);
    SetNoDelay(client);
    SetNoDelay(target);
    accepted_.fetch_add(1);

    auto connection = std::make_unique<Connection>();
    Connection* raw = connection.get();
    raw->client_fd = client;
    raw->target_fd = target;
    absl::MutexLock lock(&mu_);
    raw->upstream = std::thread([this, raw] {
      Forward(raw, raw->client_fd, raw->target_fd);
    });
    raw->downstream = std::thread([this, raw] {
      Forward(raw, raw->target_fd, raw->client_fd);
    });
    connections_.push_back(std::move(connection));
  }
}

void DelayProxy::Forward(Connection* connection, int from, int to) {
  // Linux lets a timed wait overrun by the thread's timer slack (50 us by
  // default), which would add up to 100 us to every modelled round trip;
  // the smallest slack keeps the delay close to the one asked for.
  prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
  struct Chunk {
    Clock::time_point due;
    std::string bytes;
  };
  const auto delay = absl::ToChronoNanoseconds(delay_);
  std::deque<Chunk> queue;
  std::vector<char> buffer(kReadBytes);
  bool from_ended = false;
  for (;;) {
    // Deliver everything that is due.
    bool failed = false;
    while (!queue.empty() && queue.front().due <= Clock::now()) {
      const SendResult sent = SendAll(to, stop_fd_, queue.front().bytes);
      if (sent == SendResult::kStopped) return FinishDirection(connection);
      if (sent == SendResult::kFailed) {
        failed = true;
        break;
      }
      queue.pop_front();
    }
    if (failed) {
      // The receiver is gone: what is queued can never arrive. End the
      // connection both ways so that the other direction's thread and both
      // peers see it.
      shutdown(from, SHUT_RDWR);
      shutdown(to, SHUT_RDWR);
      return FinishDirection(connection);
    }
    if (from_ended && queue.empty()) {
      // The sender's end of stream, delayed like its bytes: a half-close,
      // so the other direction keeps flowing.
      shutdown(to, SHUT_WR);
      return FinishDirection(connection);
    }

    pollfd fds[2] = {{stop_fd_, POLLIN, 0},
                     {from_ended ? -1 : from, POLLIN, 0}};
    timespec timeout;
    timespec* timeout_or_null = nullptr;  // Wait for bytes if none queued.
    if (!queue.empty()) {
      // Sleep until shortly before the chunk is due, then poll without
      // sleeping: waking from a timed sleep takes tens of microseconds
      // here, which would lengthen every delay by as much.
      timeout = ToTimespec(queue.front().due - kSpin - Clock::now());
      timeout_or_null = &timeout;
    }
    if (ppoll(fds, 2, timeout_or_null, nullptr) < 0) {
      if (errno == EINTR) continue;
      shutdown(from, SHUT_RDWR);
      shutdown(to, SHUT_RDWR);
      return FinishDirection(connection);
    }
    if (fds[0].revents != 0) return FinishDirection(connection);
    if (fds[1].revents == 0) continue;
    const ssize_t n = recv(from, buffer.data(), buffer.size(), 0);
    if (n > 0) {
      queue.push_back({Clock::now() + delay, std::string(buffer.data(), n)});
    } else if (n == 0 ||
               (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
      // End of stream, or a reset: either way nothing more comes from this
      // side. A reset is passed on as an end of stream after the queued
      // bytes; writing back to the reset side then fails and ends the rest.
      from_ended = true;
    }
  }
}

void DelayProxy::FinishDirection(Connection* connection) {
  if (connection->running.fetch_sub(1) == 1) {
    close(connection->client_fd);
    close(connection->target_fd);
  }
}

void DelayProxy::ReapFinished() {
  absl::MutexLock lock(&mu_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& connection = **it;
    if (connection.running.load() == 0) {
      // Both threads are past their last use of the connection; joining
      // waits at most for them to return.
      connection.upstream.join();
      connection.downstream.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace opserver::bench
