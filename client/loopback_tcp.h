// A raw TCP one-way stream over this host's loopback, measured in the
// calling process: the reference `opctl bench` prints next to its transfer
// figures. opctl cannot run anything on the server's host, so this is the
// limit of the path only when the server is on loopback too; for a remote
// server it is this host's own ceiling (CPU and memory cost of TCP), not
// the network's.
#ifndef OPSERVER_CLIENT_LOOPBACK_TCP_H_
#define OPSERVER_CLIENT_LOOPBACK_TCP_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace opserver {

// Sends `bytes` through a loopback TCP connection to a sink thread this
// call starts (4 MiB writes, as remote_bench's raw TCP baseline) and
// returns the seconds from connect to the sink's acknowledgement of the
// last byte. INTERNAL naming the failing socket call on error.
absl::StatusOr<double> LoopbackTcpOneWaySeconds(uint64_t bytes);

}  // namespace opserver

#endif  // OPSERVER_CLIENT_LOOPBACK_TCP_H_
