#include "testing/tcp_forwarder.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<TcpForwarder>> TcpForwarder::Start(
    const std::string& host) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpForwarder: not an IPv4 address: ", host));
  }
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  socklen_t size = sizeof(address);
  if (!fd.valid() ||
      bind(fd.get(), reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      listen(fd.get(), 64) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &size) !=
          0) {
    return absl::UnavailableError(absl::StrCat(
        "TcpForwarder: cannot listen on ", host, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TcpForwarder> forwarder(
      new TcpForwarder(host, std::move(fd), ntohs(address.sin_port)));
  forwarder->acceptor_ =
      std::thread([f = forwarder.get()] { f->AcceptLoop(); });
  return forwarder;
}

TcpForwarder::TcpForwarder(std::string host, UniqueFd listen_fd, int port)
    : host_(std::move(host)), listen_fd_(std::move(listen_fd)), port_(port) {}

TcpForwarder::~TcpForwarder() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Wakes the blocked accept() (it fails with EINVAL).
  shutdown(listen_fd_.get(), SHUT_RDWR);
  acceptor_.join();
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    for (const std::unique_ptr<UniqueFd>& socket : sockets_) {
      shutdown(socket->get(), SHUT_RDWR);  // Wakes the pumps.
    }
    pumps.swap(pumps_);
  }
  for (std::thread& pump : pumps) pump.join();
}

std::string TcpForwarder::address() const {
  return absl::StrCat(host_, ":", port_);
}

void TcpForwarder::SetTarget(const std::string& host, int port) {
  absl::MutexLock lock(&mu_);
  target_host_ = host;
  target_port_ = port;
}

void TcpForwarder::AcceptLoop() {
  for (;;) {
    UniqueFd client(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // Shut down.
    }
    accepted_.fetch_add(1);
    std::string host;
    int port;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      host = target_host_;
      port = target_port_;
    }
    if (port == 0) continue;  // No target yet: closed.
    absl::StatusOr<UniqueFd> server =
        ConnectTcp(host, port, absl::Seconds(10), absl::ZeroDuration());
    // A target that does not answer: closed, as a proxy whose backend is
    // down closes it.
    if (!server.ok()) continue;
    joined_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    const int a = client.get();
    const int b = server->get();
    sockets_.push_back(std::make_unique<UniqueFd>(std::move(client)));
    sockets_.push_back(std::make_unique<UniqueFd>(*std::move(server)));
    pumps_.emplace_back([this, a, b] { Pump(a, b); });
    pumps_.emplace_back([this, a, b] { Pump(b, a); });
  }
}

void TcpForwarder::Pump(int from, int to) {
  std::string buffer(64 << 10, '\0');
  for (;;) {
    const ssize_t n = recv(from, buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      shutdown(to, SHUT_WR);  // Passes the half-close on.
      return;
    }
    if (n < 0 || !SendAll(to, buffer.data(), static_cast<size_t>(n)).ok()) {
      // A reset on one side resets the whole connection.
      shutdown(from, SHUT_RDWR);
      shutdown(to, SHUT_RDWR);
      return;
    }
    bytes_.fetch_add(static_cast<uint64_t>(n));
  }
}

}  // namespace opserver
