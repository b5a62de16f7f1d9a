#include "client/dial_address.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace opserver {
namespace remote {
namespace {

// The target forms gRPC resolves itself; anything else must be HOST:PORT.
constexpr absl::string_view kGrpcSchemes[] = {
    "dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"};

bool IsGrpcTarget(absl::string_view address) {
  for (absl::string_view scheme : kGrpcSchemes) {
    if (absl::StartsWith(address, scheme)) return true;
  }
  return false;
}

// One connect() attempt to one resolved address: 0 when it connected, else
// the errno (ETIMEDOUT when `timeout` passed first).
int ConnectOnce(const addrinfo& ai, absl::Duration timeout) {
  const int fd =
      socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
             ai.ai_protocol);
  if (fd < 0) return errno;
  int error = 0;
  if (connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready =
          poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
      socklen_t size = sizeof(error);
      if (ready <= 0) {
        error = ETIMEDOUT;
      } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) {
        error = errno;
      }
    }
  }
  close(fd);
  return error;
}

std::string Describe(int error, absl::Duration timeout) {
  switch (error) {
    case ECONNREFUSED:
      return "connection refused (nothing listens on that port: is the "
             "server running, and is the port right?)";
    case ETIMEDOUT:
      return absl::StrCat("no answer within ", absl::FormatDuration(timeout),
                          " (host down, unreachable, or a firewall drops the "
                          "packets)");
    case EHOSTUNREACH:
    case ENETUNREACH:
      return absl::StrCat("unreachable: ", std::strerror(error));
    default:
      return std::strerror(error);
  }
}

}  // namespace

absl::Status CheckDialAddress(absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot dial '", address, "': ", why,
                     "; give HOST:PORT, e.g. 127.0.0.1:50051"));
  };
  if (address.empty()) return bad("the address is empty");
  if (IsGrpcTarget(address)) return absl::OkStatus();
  if (const size_t scheme = address.find("://");
      scheme != absl::string_view::npos) {
    return bad(absl::StrCat("it is a URL (", address.substr(0, scheme),
                            "://); opserver speaks gRPC, not a URL scheme"));
  }
  absl::StatusOr<ListenAddress> parsed = ParseListenAddress(address);
  if (!parsed.ok()) {
    // "'x' is not HOST:PORT (missing ':PORT')": keep the reason only.
    absl::string_view message = parsed.status().message();
    const size_t open = message.rfind(" (");
    return bad(open == absl::string_view::npos
                   ? message
                   : message.substr(open + 2, message.size() - open - 3));
  }
  if (parsed->port == 0) return bad("port 0 is not a server's port");
  return absl::OkStatus();
}

std::optional<ListenAddress> DialHostPort(absl::string_view address) {
  if (IsGrpcTarget(address)) return std::nullopt;
  absl::StatusOr<ListenAddress> parsed = ParseListenAddress(address);
  if (!parsed.ok() || parsed->port == 0) return std::nullopt;
  return *parsed;
}

std::optional<std::string> TcpConnectFailure(const ListenAddress& address,
                                             absl::Duration timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (const int error =
          getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found);
      error != 0) {
    return absl::StrCat("host name does not resolve: ", gai_strerror(error));
  }
  int error = ENOENT;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    error = ConnectOnce(*ai, timeout);
    if (error == 0) break;
  }
  freeaddrinfo(found);
  if (error == 0) return std::nullopt;
  return Describe(error, timeout);
}

}  // namespace remote
}  // namespace opserver
