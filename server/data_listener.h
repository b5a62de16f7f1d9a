#ifndef OPSERVER_SERVER_DATA_LISTENER_H_
#define OPSERVER_SERVER_DATA_LISTENER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
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
// Every connection is hostile until it has sent a ticket that is expected.
// One is closed when what it sent so far is no expected ticket's prefix
// (tickets are random, so a wrong first byte is enough), when it sends no
// whole ticket within `ticket_timeout`, or when it has sent nothing yet and
// room is needed: at most `max_unclaimed` connections wait, at most
// `max_unclaimed_per_source` from one address. A connection that has sent
// part of an expected ticket is never closed to make room (a newcomer is,
// instead). A ticket claims one connection only.
//
// A client may also choose a ticket itself (ExpectTicket: the pipelined
// data_transfer command carries it), and then sends it at once, before
// the server may have read the command. So a kept connection whose ticket
// is not expected is not closed but parked, for at most `ticket_timeout`,
// until the ticket is expected or refused (Refuse); parked connections go
// for room like silent ones. A new connection's ticket must be expected
// already: parking is earned by a ticket presented before.
//
// A transfer that ended well may give its connection back (Keep): it waits
// for its client's next ticket like a new one, under the same bounds (it
// counts as a silent connection until that ticket comes, and is the first
// to go for room), for at most `kept_timeout`. Reusing a connection saves
// the client a connect and the server an accept, and keeps the window TCP
// grew on it: a fresh connection starts small, which on loopback made the
// receiver of a 4 MiB transfer spend twice the CPU per byte.
class DataListener {
 public:
  struct Options {
    // Where to listen: a host the gRPC server listens on, and a port (0:
    // any free one).
    std::string host = "127.0.0.1";
    int port = 0;
    // HOST:PORT to send clients to instead (Options::data_advertise,
    // already checked); empty: `port` on the host they dialed.
    std::string advertise;
    absl::Duration ticket_timeout = absl::Seconds(10);
    // How long a kept connection (Keep) waits for its next ticket.
    absl::Duration kept_timeout = absl::Seconds(60);
    // Connections waiting to be claimed, in all and from one source address.
    size_t max_unclaimed = 64;
    size_t max_unclaimed_per_source = 16;
    // For tests: called for each accepted connection; true closes it at
    // once, unread (as a listener that has no room for it does).
    std::function<bool()> drop_accepted;
    // For tests: called for each kept connection when the first byte of
    // its next ticket comes; true closes it unread (as one the listener
    // closed while idle just after its client checked that it was open).
    std::function<bool()> drop_kept;
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
  // Options::advertise.
  const std::string& advertise() const { return options_.advertise; }
  // Connections closed without a transfer so far: turned away or evicted
  // for room (for metrics).
  uint64_t refused() const { return refused_.load(); }
  // Connections accepted so far, and tickets presented on a kept
  // connection (for metrics).
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t reused() const { return reused_.load(); }

  // A new ticket; the connection that presents it is handed, as a blocking
  // socket, to `on_connect`, on the listener's thread (so it must not
  // block). Until then the ticket stays expected: Forget it when the
  // transfer ends.
  absl::StatusOr<std::string> Expect(std::function<void(UniqueFd)> on_connect);
  // The same with the client's `ticket` (kDataTicketBytes, unchecked
  // until here): INVALID_ARGUMENT for a malformed one, ALREADY_EXISTS for
  // one expected already. A parked connection that presented it is
  // claimed now.
  absl::Status ExpectTicket(const std::string& ticket,
                            std::function<void(UniqueFd)> on_connect);
  // The ticket no longer claims a connection. Unknown tickets are ignored.
  void Forget(const std::string& ticket);
  // The client's `ticket` will never be expected: a connection parked with
  // it, or presenting it within `ticket_timeout`, is closed. At most
  // kMaxRefusedTickets are remembered (the oldest go first).
  void Refuse(const std::string& ticket);
  static constexpr size_t kMaxRefusedTickets = 256;

  // Gives back the connection of a transfer that ended well, to wait for
  // the next ticket its client sends on it (blocking or not; after the
  // transfer's last byte). Closed at once when the listener is stopping.
  void Keep(UniqueFd connection);

  // Tickets expected now (for tests: a finished transfer leaves none).
  size_t expected() const;
  // Kept connections parked with a ticket not expected (yet), as of the
  // listener's last turn or since (for tests).
  size_t parked() const { return parked_.load(); }

 private:
  struct Unclaimed;
  struct Waiting;
  using Claims =
      std::vector<std::pair<std::function<void(UniqueFd)>, UniqueFd>>;
  enum class Progress { kSilent, kPartial, kGone };

  explicit DataListener(const Options& options) : options_(options) {}
  void Run();
  // Reads what `connection` sent of its ticket, without blocking. kGone:
  // it is claimed (its callback and socket are added to `claims`), closed
  // by its peer, or sent what no expected ticket starts with; otherwise
  // whether it has sent part of an expected ticket.
  Progress Advance(Unclaimed& connection, Claims* claims);
  // Makes `waiting` take the newly accepted `connection`, closing a silent one
  // to make room where needed, or closing the newcomer when there is none.
  void Admit(Unclaimed connection, Waiting& waiting, Claims* claims);
  // Admits the connections given back by Keep since the last turn.
  void AdmitKept(Waiting& waiting, Claims* claims);
  // Wakes Run() to look at its parked connections again, if it has any.
  void WakeParked();
  // True when `ticket` was refused (and forgets it: one connection only).
  bool TakeRefusedLocked(const std::string& ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes one waiting connection that has sent nothing (from `source`, or
  // else from the address with the most waiting) after a last read; false
  // when every candidate holds part of an expected ticket.
  bool EvictSilent(const std::string* source, Waiting& waiting, Claims* claims);

  const Options options_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: wakes Run() to stop.
  int port_ = 0;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Ordered, so that whether a partial ticket is some ticket's prefix is
  // one lower_bound.
  std::map<std::string, std::function<void(UniqueFd)>> expected_
      ABSL_GUARDED_BY(mu_);
  // Connections given back by Keep, for Run() to admit.
  std::vector<UniqueFd> kept_ ABSL_GUARDED_BY(mu_);
  // Refused tickets and until when they are remembered, oldest first.
  std::deque<std::pair<std::string, absl::Time>> refused_tickets_
      ABSL_GUARDED_BY(mu_);
  // Connections parked now (set by Run()).
  std::atomic<size_t> parked_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> reused_{0};
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_DATA_LISTENER_H_
