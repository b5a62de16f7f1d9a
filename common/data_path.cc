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

namespace opserver {
namespace {

absl::Status SocketError(absl::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("data connection: ", what, ": ", std::strerror(errno)));
}

}  // namespace

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

absl::Status SendAll(int fd, const char* data, size_t size) {
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
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> RecvFull(int fd, char* data, size_t size) {
  size_t got = 0;
  while (got < size) {
    ssize_t n = recv(fd, data + got, size - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SocketError("receive");
    }
    if (n == 0) break;  // The peer half-closed.
    got += static_cast<size_t>(n);
  }
  return got;
}

absl::StatusOr<UniqueFd> ConnectTcp(const std::string& host, int port,
                                    absl::Duration timeout,
                                    absl::Duration io_timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* results = nullptr;
  const std::string port_text = std::to_string(port);
  const std::string where = absl::StrCat(host, " port ", port);
  if (int rc = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &results);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "data connection: cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string why = "no address";
  UniqueFd connected;
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family,
                       ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                       ai->ai_protocol));
    if (!fd.valid()) {
      why = std::strerror(errno);
      continue;
    }
    int rc = connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int ready;
      do {
        ready =
            poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
      } while (ready < 0 && errno == EINTR);
      int error = 0;
      socklen_t len = sizeof(error);
      if (ready == 0) {
        errno = ETIMEDOUT;
      } else if (ready > 0 && getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error,
                                         &len) == 0) {
        errno = error;
      }
      rc = (ready > 0 && error == 0) ? 0 : -1;
    }
    if (rc != 0) {
      why = std::strerror(errno);
      continue;
    }
    const int flags = fcntl(fd.get(), F_GETFL);
    fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
    if (io_timeout > absl::ZeroDuration()) {
      const timeval tv = absl::ToTimeval(io_timeout);
      setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    connected = std::move(fd);
    break;
  }
  freeaddrinfo(results);
  if (!connected.valid()) {
    return absl::UnavailableError(
        absl::StrCat("data connection: cannot connect to ", where, ": ", why));
  }
  return connected;
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
