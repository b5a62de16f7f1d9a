// fairness_bench's attackers (see the top of fairness_bench.cc): each runs
// in a process of its own, as a hostile tenant's client would, until the
// bench kills it; and the client helpers the victim shares with them.
#ifndef OPSERVER_BENCH_FAIRNESS_ATTACKERS_H_
#define OPSERVER_BENCH_FAIRNESS_ATTACKERS_H_

#include <memory>
#include <string>

#include "client/client.h"

namespace opserver::fairness {

// The two tenants of the server's token file.
inline constexpr char kVictimToken[] = "victim-token-0123456789abcdef";
inline constexpr char kAttackerToken[] = "attacker-token-0123456789abcdef";

// A client of `address` with `token`; exits the process when it cannot.
std::unique_ptr<remote::Client> Connect(const std::string& address,
                                        const std::string& token,
                                        bool pipeline);
// A session (not attached); exits the process when it cannot.
std::unique_ptr<remote::Session> Open(remote::Client& client,
                                      const std::string& name);

// What the bench tells an attacker process (its internal flags).
struct AttackerOptions {
  std::string name;  // --attack
  std::string address;
  int data_port = 0;
  int attack_s = 0;  // Seconds it runs at most.
  int nice = 0;
  bool oversized_batches = true;  // giant_batches' 60 MiB batches.
};

// Runs the attacker `options.name` for attack_s seconds (the bench kills
// it sooner), then exits; 2 for an unknown name.
int RunAttacker(const AttackerOptions& options);

}  // namespace opserver::fairness

#endif  // OPSERVER_BENCH_FAIRNESS_ATTACKERS_H_
