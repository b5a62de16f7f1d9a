// Starting an opserver binary as a child process, for tests and benchmarks
// that need a real server process (the Ascend chain's front, whose exit
// status matters, or both ends of the chain benchmark): on loopback, on
// free ports, found from the "listening on" and "metrics on" lines it
// prints.
//
//   OpserverLaunch launch;
//   launch.binary = path;
//   launch.flags = {"--device=ascend"};
//   launch.opserver_address = backend;
//   launch.out_path = dir + "/front.out";
//   absl::StatusOr<OpserverProcess> front = StartOpserver(launch);
#ifndef OPSERVER_TESTING_OPSERVER_PROCESS_H_
#define OPSERVER_TESTING_OPSERVER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace opserver::process {

struct OpserverLaunch {
  std::string binary;
  // After --listen=127.0.0.1:0 and --metrics_listen=127.0.0.1:0.
  std::vector<std::string> flags;
  // OPSERVER_ADDRESS for the child (its libaclnn_remote.so's server); no
  // other OPSERVER_ variable of this process is passed on.
  std::string opserver_address;
  // Where its stdout goes (read for the addresses), and its stderr; an
  // empty err_path leaves stderr this process's.
  std::string out_path;
  std::string err_path;
  absl::Duration timeout = absl::Seconds(60);
};

struct OpserverProcess {
  pid_t pid = 0;
  std::string address;  // gRPC, HOST:PORT.
  std::string metrics;  // /metrics, HOST:PORT.
};

// Starts the binary and waits for its "listening on" line. An error when it
// cannot start, exits first (reaped), or says nothing within the timeout
// (then killed and reaped). The caller stops it (SIGTERM, waitpid).
absl::StatusOr<OpserverProcess> StartOpserver(const OpserverLaunch& launch);

// `path` made absolute against the current directory.
std::string Absolute(const std::string& path);
// The file's contents; "" when it cannot be read.
std::string ReadFile(const std::string& path);

}  // namespace opserver::process

#endif  // OPSERVER_TESTING_OPSERVER_PROCESS_H_
