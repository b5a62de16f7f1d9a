// The soak's raw-RPC clients: each thread loops over randomly chosen
// scenarios that together call every RPC of Runtime, Operators and
// grpc.health.v1 through the generated stubs (valid work checked against
// the host reference, invalid requests made on purpose, calls abandoned
// mid-transfer), and the fault child processes the killer SIGKILLs. Also
// the connections every part of the soak dials with.
#ifndef OPSERVER_BENCH_SOAK_SCENARIOS_H_
#define OPSERVER_BENCH_SOAK_SCENARIOS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/time/time.h"
#include "bench/soak_report.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver::soak {

constexpr absl::Duration kCallDeadline = absl::Seconds(60);
constexpr absl::Duration kTransferDeadline = absl::Seconds(120);
// The server's --max_values default; requests just past it are "oversized".
constexpr uint64_t kMaxValues = 1u << 20;

// How every channel of this process reaches the server: plain, or TLS
// trusting `ca_pem` (the run's own CA). Set once, before any Connect.
void SetTlsRoots(std::string ca_pem);
bool UsingTls();

struct Conn {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Runtime::Stub> rt;
  std::unique_ptr<v1::Operators::Stub> ops;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

// `own_connection`: a TCP connection of its own rather than one shared with
// every other channel of the process that has the same arguments. `token`:
// sent as "authorization: Bearer TOKEN" with every call (TLS only: gRPC
// sends call credentials on secure channels alone).
std::shared_ptr<Conn> Connect(const std::string& address, bool own_connection,
                              const std::string& token = "");

void SetDeadline(grpc::ClientContext* context, absl::Duration d);

// Session names of every tenant, for the hostile tenant to try.
void PublishSessionName(const std::string& tenant, const std::string& name);
// A session name some other tenant than `tenant` made, or "".
std::string PickSessionName(const std::string& tenant, std::mt19937_64& rng);

enum class Mode {
  kSoak,      // Everything: valid, invalid, faults.
  kShutdown,  // Valid work only, while the server is told to stop.
};

struct ClientOptions {
  int id = 0;
  std::string address;
  // A channel shared with other clients; nullptr: a connection of its own.
  std::shared_ptr<Conn> shared;
  std::string tenant = "anonymous";
  std::string token;  // For a connection of its own.
  Stats* stats = nullptr;
  uint64_t seed = 0;
  Mode mode = Mode::kSoak;
};

// Loops over scenarios until `end` or `stop`, then ends its session.
// Shutdown mode: `slow_transfer` 1 or 2 first starts a 64 MiB upload or
// download paced to take about 20 s, so that it is still running when the
// server's shutdown grace ends.
void RunRpcClient(const ClientOptions& options, absl::Time end,
                  const std::atomic<bool>* stop, int slow_transfer = 0);

// A client process that starts a transfer (`kind`: upload, download or
// pipeline), says so on stdout ('R') and carries on until it is killed.
// It ends itself after 60 s in any case, and when `parent` is gone.
[[noreturn]] void RunFaultChild(const std::string& kind,
                                const std::string& address, bool attach,
                                int parent, const std::string& token);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_SCENARIOS_H_
