#ifndef OPSERVER_SERVER_DATA_LISTENER_H_
#define OPSERVER_SERVER_DATA_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/data_path.h"

namespace opserver {

// The server's end of the data path (common/data_path.h): a TCP listener
// that hands each connection to the transfer whose ticket it sends first.
//
//   auto listener = DataListener::Start({.host = "127.0.0.1"});
//   std::string ticket = *(*listener)->Expect([](UniqueFd fd) { ... });
//   ... tell the client ticket and (*listener)->port() ...
//   (*listener)->Forget(ticket);  // when the transfer ends either way
//
// Every connection is hostile until it has sent a ticket that is expected:
// one that sends anything else, nothing within `ticket_timeout`, or that
// would exceed `max_unclaimed` connections waiting to be claimed, is
// closed. A ticket claims one connection only.
class DataListener {
 public:
  struct Options {
    // Where to listen: a host the gRPC server listens on, and a port (0:
    // any free one).
    std::string host = "127.0.0.1";
    int port = 0;
    absl::Duration ticket_timeout = absl::Seconds(10);
    size_t max_unclaimed = 64;
  };

  // Binds and starts the listener's thread. UNAVAILABLE (with the OS's
  // reason) when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<DataListener>> Start(
      const Options& options);
  // Stops the thread and closes every unclaimed connection.
  ~DataListener();
  DataListener(const DataListener&) = delete;
  DataListener& operator=(const DataListener&) = delete;

  int port() const { return port_; }

  // A new ticket; the connection that presents it is handed, as a blocking
  // socket, to `on_connect`, on the listener's thread (so it must not
  // block). Until then the ticket stays expected: Forget it when the
  // transfer ends.
  absl::StatusOr<std::string> Expect(std::function<void(UniqueFd)> on_connect);
  // The ticket no longer claims a connection. Unknown tickets are ignored.
  void Forget(const std::string& ticket);

  // Tickets expected now (for tests: a finished transfer leaves none).
  size_t expected() const;

 private:
  explicit DataListener(const Options& options) : options_(options) {}
  void Run();

  const Options options_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: wakes Run() to stop.
  int port_ = 0;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::function<void(UniqueFd)>> expected_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_DATA_LISTENER_H_
