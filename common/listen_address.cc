#include "common/listen_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace opserver {
namespace {

bool IsHostChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '-' || c == '_';
}

}  // namespace

std::string ListenAddress::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool IsLoopback(const ListenAddress& address) {
  if (absl::EqualsIgnoreCase(address.host, "localhost")) return true;
  in_addr v4;
  if (inet_pton(AF_INET, address.host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, address.host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

namespace {

// Splits HOST:PORT or [IPV6]:PORT with PORT in min_port..65535; on
// failure, INVALID_ARGUMENT whose message is only the reason.
absl::StatusOr<ListenAddress> SplitHostPort(absl::string_view text,
                                            int min_port) {
  auto error = [](absl::string_view why) {
    return absl::InvalidArgumentError(why);
  };
  ListenAddress out;
  absl::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos) return error("missing ']'");
    out.host = std::string(text.substr(1, close - 1));
    if (out.host.empty()) return error("empty IPv6 address");
    for (char c : out.host) {
      if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' &&
          c != '.') {
        return error("bad character in IPv6 address");
      }
    }
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      return error("missing ':PORT' after ']'");
    }
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return error("missing ':PORT'");
    out.host = std::string(text.substr(0, colon));
    if (out.host.empty()) return error("empty host");
    for (char c : out.host) {
      if (!IsHostChar(c)) {
        return error(c == ':' ? "IPv6 addresses need brackets"
                              : "bad character in host");
      }
    }
    port_text = text.substr(colon + 1);
  }
  if (port_text.empty()) return error("empty port");
  for (char c : port_text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      return error("port is not a number");
    }
  }
  int port = 0;
  if (port_text.size() > 5 || !absl::SimpleAtoi(port_text, &port) ||
      port < min_port || port > 65535) {
    return error(absl::StrCat("port must be ", min_port, "..65535"));
  }
  out.port = port;
  return out;
}

// 0.0.0.0 or :: however spelled: where a server listens on every address.
bool IsWildcard(const std::string& host) {
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return v4.s_addr == htonl(INADDR_ANY);
  }
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 &&
         IN6_IS_ADDR_UNSPECIFIED(&v6);
}

}  // namespace

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text) {
  absl::StatusOr<ListenAddress> parsed = SplitHostPort(text, 0);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not HOST:PORT (", parsed.status().message(), ")"));
  }
  return parsed;
}

absl::StatusOr<ListenAddress> ParseConnectAddress(absl::string_view text) {
  if (text.size() > kMaxConnectAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an address of ", text.size(), " bytes is not HOST:PORT (at most ",
        kMaxConnectAddressBytes, " bytes)"));
  }
  absl::StatusOr<ListenAddress> parsed = SplitHostPort(text, 1);
  absl::string_view why;
  if (!parsed.ok()) {
    why = parsed.status().message();
  } else if (IsWildcard(parsed->host)) {
    why = "a wildcard address is nowhere to connect to";
  }
  if (!why.empty()) {
    // Escaped: the text may be a peer's bytes on their way to a log.
    return absl::InvalidArgumentError(absl::StrCat(
        "'", absl::CHexEscape(text), "' is not HOST:PORT (", why, ")"));
  }
  return parsed;
}

absl::Status ProbeBind(const ListenAddress& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  std::string port = std::to_string(address.port);
  int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &results);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve host '", address.host, "': ", gai_strerror(rc)));
  }
  absl::Status status;
  for (addrinfo* ai = results; ai != nullptr && status.ok(); ai = ai->ai_next) {
    int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;  // Address family not supported here: gRPC skips it.
    int one = 1;
    // gRPC sets SO_REUSEADDR too, so a port in TIME_WAIT is not "in use".
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      status = absl::UnavailableError(absl::StrCat(
          "cannot bind ", address.ToString(), ": ", std::strerror(errno)));
    }
    close(fd);
  }
  freeaddrinfo(results);
  return status;
}

}  // namespace opserver
