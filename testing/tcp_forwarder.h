// A TCP forwarder for tests of what stands between a client and a server
// (a proxy, a NAT'd port): it listens on a loopback address, port 0, and
// joins each connection it accepts to a new connection to its target,
// copying bytes both ways until both sides have closed.
#ifndef OPSERVER_TESTING_TCP_FORWARDER_H_
#define OPSERVER_TESTING_TCP_FORWARDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/data_path.h"

namespace opserver {

class TcpForwarder {
 public:
  // Listens on `host` (an address literal), on a free port.
  static absl::StatusOr<std::unique_ptr<TcpForwarder>> Start(
      const std::string& host);
  // Closes every connection and joins the threads.
  ~TcpForwarder();
  TcpForwarder(const TcpForwarder&) = delete;
  TcpForwarder& operator=(const TcpForwarder&) = delete;

  int port() const { return port_; }
  // HOST:PORT to connect to (the host as Start was given it).
  std::string address() const;

  // Where accepted connections go from now on. A connection accepted
  // before the first call is closed at once (so a forwarder without a
  // target is a trap that counts who connects).
  void SetTarget(const std::string& host, int port);

  // Connections accepted, those joined to the target, and the bytes
  // carried either way, so far.
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t joined() const { return joined_.load(); }
  uint64_t bytes() const { return bytes_.load(); }

 private:
  TcpForwarder(std::string host, UniqueFd listen_fd, int port);
  void AcceptLoop();
  // Copies from `from` to `to` until `from` ends, then half-closes `to`.
  void Pump(int from, int to);

  const std::string host_;
  UniqueFd listen_fd_;
  const int port_;
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> joined_{0};
  std::atomic<uint64_t> bytes_{0};

  absl::Mutex mu_;
  std::string target_host_ ABSL_GUARDED_BY(mu_);
  int target_port_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Both ends of each joined connection, and the threads pumping them.
  std::vector<std::unique_ptr<UniqueFd>> sockets_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace opserver

#endif  // OPSERVER_TESTING_TCP_FORWARDER_H_
