#include "testing/closed_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace opserver {

int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string ClosedPortAddress() {
  return "127.0.0.1:" + std::to_string(ClosedPort());
}

}  // namespace opserver
