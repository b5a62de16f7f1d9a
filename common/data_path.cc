#include "common/data_path.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace opserver {
namespace {

absl::Status SocketError(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("data path: ", what, ": ", std::strerror(errno)));
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::Status SendAll(int fd, const char* data, size_t size,
                     const std::function<void()>& moved) {
  // At most 4 MiB per send(): one call of 256 MiB held the socket for its
  // whole length and moved 0.63-0.76 of a raw TCP stream on loopback where
  // 4 MiB calls moved 0.97-1.03 (BENCHMARKS.md, "The data path").
  constexpr size_t kMaxSend = size_t{4} << 20;
  while (size > 0) {
    ssize_t n = send(fd, data, std::min(size, kMaxSend), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError("send");
    }
    data += n;
    size -= static_cast<size_t>(n);
    if (moved && n > 0) moved();
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> RecvFull(int fd, char* data, size_t size,
                                const std::function<void()>& moved) {
  // Waits (poll) until this many bytes are in, or the rest of `size`,
  // then takes all that came: on loopback, a blocking recv() woke for
  // every segment, a context switch and a call per 64 KiB. (A blocking
  // recv() with SO_RCVLOWAT can hang: once it has taken part of its
  // target, the kernel still waits for the whole low-water mark.) At
  // least once a second it takes what came meanwhile, so a slow sender
  // is seen moving; SO_RCVTIMEO still bounds a wait with nothing at all.
  // Half a megabyte: a whole one made a single upload's speed depend on
  // where the scheduler put the two ends (2.3 or 3.9 GB/s between runs),
  // a quarter cost the Ascend chain a tenth (BENCHMARKS.md).
  constexpr size_t kWakeBytes = 512 << 10;
  constexpr int kSliceMs = 1000;
  timeval limit{};
  socklen_t limit_size = sizeof(limit);
  getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, &limit_size);
  const absl::Duration idle_limit = limit.tv_sec == 0 && limit.tv_usec == 0
                                        ? absl::InfiniteDuration()
                                        : absl::DurationFromTimeval(limit);
  const int slice_ms = idle_limit < absl::Milliseconds(kSliceMs)
                           ? static_cast<int>(absl::ToInt64Milliseconds(
                                 absl::Ceil(idle_limit, absl::Milliseconds(1))))
                           : kSliceMs;
  int low_water = 1;  // The socket's default.
  auto set_low_water = [&](int bytes) {
    if (bytes == low_water) return;
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
    low_water = bytes;
  };
  size_t got = 0;
  absl::Status failed;
  absl::Time idle_since = absl::Now();
  while (got < size) {
    set_low_water(static_cast<int>(std::min(size - got, kWakeBytes)));
    pollfd ready{fd, POLLIN, 0};
    if (poll(&ready, 1, slice_ms) < 0 && errno != EINTR) {
      failed = SocketError("receive");
      break;
    }
    ssize_t n = recv(fd, data + got, size - got, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) &&
          absl::Now() - idle_since < idle_limit) {
        continue;
      }
      failed = SocketError("receive");  // Past SO_RCVTIMEO: EAGAIN.
      break;
    }
    if (n == 0) break;  // The peer half-closed.
    got += static_cast<size_t>(n);
    idle_since = absl::Now();
    if (moved) moved();
  }
  // Back to the default: what follows on the connection (a ticket, an
  // acknowledgement) is small, and poll() counts readable bytes by it.
  set_low_water(1);
  if (!failed.ok()) return failed;
  return got;
}

absl::StatusOr<UniqueFd> FirstUsableSocket(
    const std::string& host, int port, bool passive, absl::string_view what,
    const std::function<bool(int fd, const addrinfo& address)>& use) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* results = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &results);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("data path: cannot resolve ",
                                               host, ": ", gai_strerror(rc)));
  }
  std::string why = "no address";
  UniqueFd usable;
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family,
                       ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       ai->ai_protocol));
    if (fd.valid() && use(fd.get(), *ai)) {
      usable = std::move(fd);
      break;
    }
    why = std::strerror(errno);
  }
  freeaddrinfo(results);
  if (!usable.valid()) {
    return absl::UnavailableError(absl::StrCat(
        "data path: cannot ", what, " ", host, " port ", port, ": ", why));
  }
  return usable;
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& host, int port,
                                    absl::Duration timeout,
                                    absl::Duration io_timeout) {
  absl::StatusOr<UniqueFd> fd = FirstUsableSocket(
      host, port, /*passive=*/false, "connect to",
      [&](int fd, const addrinfo& address) {
        if (connect(fd, address.ai_addr, address.ai_addrlen) == 0) return true;
        if (errno != EINPROGRESS) return false;
        pollfd p{fd, POLLOUT, 0};
        int ready;
        do {
          ready =
              poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
        } while (ready < 0 && errno == EINTR);
        if (ready == 0) errno = ETIMEDOUT;
        if (ready <= 0) return false;
        int error = 0;
        socklen_t len = sizeof(error);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
          return false;
        }
        errno = error;
        return error == 0;
      });
  if (!fd.ok()) return fd.status();
  const int flags = fcntl(fd->get(), F_GETFL);
  fcntl(fd->get(), F_SETFL, flags & ~O_NONBLOCK);
  if (io_timeout > absl::ZeroDuration()) {
    const timeval tv = absl::ToTimeval(io_timeout);
    setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd->get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  return fd;
}

absl::StatusOr<std::string> RandomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(out.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  return out;
}

}  // namespace opserver
