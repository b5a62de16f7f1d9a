// The soak's clients that go through the C++ client library (//client) as
// its users do: pipelined sessions (phase one checked locally, launches,
// small writes and reads queued on the command channel), the data path for
// transfers of 4 MiB and more where the server has one, and transfers
// split over several connections where it has not. Every call's status is
// classified like a raw call's, and every result is checked against the
// kernels' formulas.
#ifndef OPSERVER_BENCH_SOAK_LIBRARY_SCENARIOS_H_
#define OPSERVER_BENCH_SOAK_LIBRARY_SCENARIOS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "bench/soak_report.h"
#include "client/client.h"

namespace opserver::soak {

struct LibraryClientOptions {
  int id = 0;
  std::string address;
  std::string tenant = "anonymous";
  // TLS and token as the run needs them; the data path and split settings
  // are the scenario's (see RunLibraryClient).
  remote::ConnectOptions connect;
  // Whether this client may use the server's data path (when the server
  // has one); without it, large transfers are split over connections.
  bool data_path = true;
  Stats* stats = nullptr;
  uint64_t seed = 0;
};

// Loops over library scenarios until `end` or `stop`, then closes its
// session. The first scenario is always a transfer of 8 MiB, so that every
// run moves data over the data path (or split) at least once per client.
void RunLibraryClient(const LibraryClientOptions& options, absl::Time end,
                      const std::atomic<bool>* stop);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_LIBRARY_SCENARIOS_H_
