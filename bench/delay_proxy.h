#ifndef OPSERVER_BENCH_DELAY_PROXY_H_
#define OPSERVER_BENCH_DELAY_PROXY_H_

// A loopback TCP proxy that adds a fixed one-way delay in each direction, so
// that a benchmark on one machine can see what a network round trip costs
// the protocol (latency only: there is no bandwidth cap).
//
//   auto proxy = DelayProxy::Start("127.0.0.1:50051", absl::Microseconds(250));
//   ... dial 127.0.0.1:(*proxy)->port() ...
//
// Every byte read from one side at time t is written to the other side at
// t + delay, plus the thread's wake-up and send time (a direction thread
// sleeps until 60 us before a chunk is due and spins from there, since a
// timed wake-up alone overshoots by tens of microseconds). An end of stream
// (half-close) travels the same way, after the bytes before it. Each
// accepted connection gets its own connection to the target and one thread
// per direction. Destroying the proxy closes all of them and joins every
// thread.

#include <sys/socket.h>

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace opserver::bench {

class DelayProxy {
 public:
  // Listens on 127.0.0.1, on a free port, and forwards each connection to
  // `target_host_port` ("HOST:PORT", "[IPV6]:PORT"; resolved now).
  static absl::StatusOr<std::unique_ptr<DelayProxy>> Start(
      const std::string& target_host_port, absl::Duration one_way_delay);

  // Closes every connection (peers see them end) and joins all threads.
  ~DelayProxy();
  DelayProxy(const DelayProxy&) = delete;
  DelayProxy& operator=(const DelayProxy&) = delete;

  // The port the proxy listens on (127.0.0.1).
  int port() const { return port_; }

  // Connections accepted so far.
  int connections_accepted() const { return accepted_.load(); }

 private:
  // One proxied connection: two sockets, a thread per direction.
  struct Connection {
    int client_fd = -1;
    int target_fd = -1;
    // The direction thread that brings this to 0 closes both sockets, so
    // they stay open (and their numbers unused) while either thread runs.
    std::atomic<int> running{2};
    std::thread upstream;    // client -> target
    std::thread downstream;  // target -> client
  };

  DelayProxy() = default;

  void AcceptLoop();
  // Forwards `from` to `to` with the delay until `from` ends (then half-closes
  // `to`), a write fails (then ends both sockets), or the proxy stops.
  void Forward(Connection* connection, int from, int to);
  void FinishDirection(Connection* connection);
  // Joins and frees connections whose threads have both finished.
  void ReapFinished();

  absl::Duration delay_;
  sockaddr_storage target_{};
  socklen_t target_len_ = 0;
  int listen_fd_ = -1;
  // Readable once the proxy stops: every thread polls it beside its socket.
  int stop_fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace opserver::bench

#endif  // OPSERVER_BENCH_DELAY_PROXY_H_
