// The soak's hostile tenants. In the secure mode (TLS and tokens): a
// tenant with a valid token of its own that also calls with wrong tokens
// and none, and names other tenants' sessions. In the plain mode: a
// client that floods the server's data port with connections that never
// send a valid ticket (the data path is plain TCP, so a server with TLS
// has none: the flood needs the plain mode).
#ifndef OPSERVER_BENCH_SOAK_HOSTILE_H_
#define OPSERVER_BENCH_SOAK_HOSTILE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "bench/soak_report.h"

namespace opserver::soak {

struct HostileOptions {
  int id = 0;
  std::string address;
  std::string tenant;
  std::string token;        // Its own, valid.
  std::string wrong_token;  // One the server does not know.
  Stats* stats = nullptr;
  uint64_t seed = 0;
};

// Secure mode: loops until `end` or `stop`.
void RunHostileTenant(const HostileOptions& options, absl::Time end,
                      const std::atomic<bool>* stop);

// Plain mode: rounds of 8 to 31 connections to the data port, each sending
// a wrong ticket, part of one or nothing, until `end` or `stop`. The server
// must close every wrong ticket promptly; the other clients' data-path
// transfers must go on (they are checked where they run).
void RunDataPortFlood(const HostileOptions& options, absl::Time end,
                      const std::atomic<bool>* stop);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_HOSTILE_H_
