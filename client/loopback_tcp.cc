#include "client/loopback_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace opserver {
namespace {

constexpr size_t kWriteBytes = 4 << 20;

absl::Status Errno(const char* call) {
  return absl::InternalError(
      absl::StrCat("loopback TCP: ", call, ": ", std::strerror(errno)));
}

// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<double> LoopbackTcpOneWaySeconds(uint64_t bytes) {
  Fd listener{socket(AF_INET, SOCK_STREAM, 0)};
  if (listener.fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
          0 ||
      listen(listener.fd, 1) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("bind/listen");
  }
  // The sink reads to the end of the stream, then acknowledges with one
  // byte, so the time covers every byte delivered, not just queued.
  std::thread sink([fd = listener.fd] {
    Fd conn{accept(fd, nullptr, nullptr)};
    if (conn.fd < 0) return;
    std::vector<char> buffer(kWriteBytes);
    while (read(conn.fd, buffer.data(), buffer.size()) > 0) {
    }
    const char ack = 1;
    if (write(conn.fd, &ack, 1) != 1) {
      // The sender went away; it reports its own error.
    }
  });
  std::vector<char> data(std::min<uint64_t>(kWriteBytes, bytes), 'x');
  absl::Status status;
  const auto start = std::chrono::steady_clock::now();
  {
    Fd conn{socket(AF_INET, SOCK_STREAM, 0)};
    if (conn.fd < 0 || connect(conn.fd, reinterpret_cast<sockaddr*>(&addr),
                               sizeof(addr)) != 0) {
      status = Errno("connect");
      // Unblock the sink's accept so it can be joined.
      shutdown(listener.fd, SHUT_RDWR);
    } else {
      for (uint64_t sent = 0; sent < bytes && status.ok();) {
        const ssize_t n = write(conn.fd, data.data(),
                                std::min<uint64_t>(data.size(), bytes - sent));
        if (n <= 0) {
          status = Errno("write");
          break;
        }
        sent += n;
      }
      shutdown(conn.fd, SHUT_WR);
      char ack = 0;
      if (status.ok() && read(conn.fd, &ack, 1) != 1) status = Errno("read");
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  sink.join();
  if (!status.ok()) return status;
  return seconds;
}

}  // namespace opserver
