// The soak's processes: the server it starts and watches (/proc samples of
// its RSS, threads and fds), the killer that starts fault child processes
// and SIGKILLs each in the middle of a transfer, and the watchdog that ends
// the program when a phase hangs.
#ifndef OPSERVER_BENCH_SOAK_PROCESSES_H_
#define OPSERVER_BENCH_SOAK_PROCESSES_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/soak_scenarios.h"
#include "proto/opserver.pb.h"

namespace opserver::soak {

// The server's stderr by kind of line (see ServerLog).
ServerLog ReadServerLog(const std::string& path, bool tokens);

// The names of the process's threads, with how many have each.
std::map<std::string, int> ThreadNames(pid_t pid);
// RSS, peak RSS, threads and fds of `pid` now.
ProcSample ReadProc(pid_t pid);
std::string LoadAverage();

// Starts the server with stdout on a pipe and stderr in `log`; returns its
// pid and the address it reports. Exits the program when it does not start.
pid_t StartServer(const std::vector<std::string>& argv, const std::string& log,
                  std::string* address);
std::string DescribeWait(int wstatus);

// The killer: child client processes (this binary with --fault_child and
// `child_flags`) SIGKILLed in the middle of a transfer.
class Killer {
 public:
  Killer(std::string self, std::string address, absl::Duration interval,
         uint64_t seed, std::vector<std::string> child_flags = {});

  // Starts and kills children, one every interval, until `stop`.
  void Run(const std::atomic<bool>* stop);
  // A Markdown table: children by kind, killed, and other outcomes.
  std::string Report() const;
  uint64_t failures() const;
  uint64_t killed() const;

 private:
  struct Row {
    uint64_t started = 0, killed = 0;
    std::vector<double> ready_ms;
    std::vector<std::string> failures;
  };

  void RunOne(const std::string& kind, bool attach);
  void Fail(Row* row, std::string what);

  const std::string self_;
  const std::string address_;
  const absl::Duration interval_;
  const std::vector<std::string> child_flags_;
  std::mt19937_64 rng_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, bool>, Row> rows_ ABSL_GUARDED_BY(mu_);
};

// The server the watchdog kills when a phase overruns (0: none).
extern std::atomic<pid_t> server_pid;
// Names the phase now running and how long it may take.
void SetPhase(const char* phase, absl::Duration budget);
// Runs forever (on a detached thread): ends the program with status 3,
// after killing the server, when a phase overruns its budget.
void Watchdog();

v1::ServerStats QueryServerStats(Conn* conn, bool* ok);

// The secure mode's bearer tokens: three tenants and one nobody has.
struct Tenants {
  std::string alice, bob, mallory, wrong;
};
// Makes a new temporary directory (`dir`, under $TEST_TMPDIR when set)
// holding a CA (ca.pem), a server certificate for 127.0.0.1 and localhost
// that it signed (server.pem, server.key), both made with openssl, and a
// token file (tokens) naming alice, bob and mallory with fresh random
// tokens. False with the reason when openssl fails.
bool MakeSecureSetup(Tenants* tenants, std::string* dir, std::string* error);
// Removes what MakeSecureSetup made.
void RemoveSecureSetup(const std::string& dir);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_PROCESSES_H_
