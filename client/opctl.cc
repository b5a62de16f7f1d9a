// opctl: command-line client of an opserver, or of a pool of them in etcd
// (--server=etcd://HOST:PORT/PREFIX: --device counts the pool's devices as
// the C API does, and OPSERVER_CLAIM claims devices while opctl runs).
//
//   opctl [--server=HOST:PORT] [--timeout_ms=N] info
//   opctl [...] ops
//   opctl [...] stats
//   opctl [...] run OP --ARG=v1,v2,... [--ARG_shape=..] [--dtype=..] ...
//   opctl [...] bench [--bytes=N] [--iterations=N] [--elements=N]
//
// Global flags go before the command; each command parses its own.
//
// This file holds the global flags and the dispatch; each command lives in
// a file of its own (opctl_info, opctl_run, opctl_bench), what they share
// in opctl_command.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/etcd_pool.h"
#include "client/opctl_bench.h"
#include "client/opctl_command.h"
#include "client/opctl_info.h"
#include "client/opctl_run.h"
#include "common/cli_flags.h"
#include "common/etcd_address.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "opserver to talk to, HOST:PORT, or a pool of them in etcd, "
          "etcd://HOST:PORT[,HOST:PORT...]/PREFIX (docs/pool.md).");
ABSL_FLAG(int, timeout_ms, 5000,
          "Deadline for connecting and for each call, in milliseconds.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "Use TLS, trusting the server certificate this PEM CA signed.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM client certificate, for a server that requires one (mTLS).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token to send (the server's "
          "--auth_token_file names it).");

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace opserver::remote {
namespace opctl {
namespace {

constexpr char kUsage[] =
    "Command-line client of an opserver.\n"
    "Usage: opctl [--server=HOST:PORT|etcd://HOST:PORT/PREFIX]\n"
    "             [--timeout_ms=N] [--tls_ca_file=PEM\n"
    "             [--tls_cert_file=PEM --tls_key_file=PEM]] [--token_file=F]\n"
    "             COMMAND [ARGS]\n"
    "Commands:\n"
    "  info    devices, server version, health, and whether it drains\n"
    "  ops     operators with their tensor arguments, dtypes and parameters\n"
    "  run     one operator on values from the command line or .npy files\n"
    "          (opctl run --help for the details)\n"
    "  stats   sessions, memory in use and free per device, transfers,\n"
    "          draining\n"
    "  bench   transfer throughput, per-operator latency and the\n"
    "          pipelined vs unary cost of a backward step\n"
    "          (opctl bench --help for the details)\n"
    "With --server=etcd://..., the devices the pool's servers registered\n"
    "there are numbered as the C API numbers them (--device=N of run and\n"
    "bench is that ordinal; info lists them), OPSERVER_CLAIM=N claims N\n"
    "free devices while opctl runs, and stats covers every server.\n"
    "Exit status: 0 done, 1 the command failed (the server's answer, a\n"
    "connection, a command's arguments), 2 opctl's own command line\n"
    "(a flag, COMMAND).";

// Ordinal `ordinal` of a pool; INVALID_ARGUMENT naming the count past
// the last.
absl::StatusOr<PoolDevice> PoolOrdinal(const PoolResolution& pool,
                                       const std::string& server,
                                       uint32_t ordinal) {
  if (ordinal >= pool.devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", ordinal, ": the pool ", server, " has ",
        pool.devices.size(), " device", pool.devices.size() == 1 ? "" : "s",
        " (opctl info lists them)"));
  }
  return pool.devices[ordinal];
}

// Where the command starts: global flags end at the first argument that
// is not one (a --server or --timeout_ms given apart takes the next too).
int CommandIndex(int argc, char** argv) {
  int command_at = 1;
  while (command_at < argc) {
    absl::string_view arg = argv[command_at];
    if (!absl::StartsWith(arg, "-")) break;
    ++command_at;
    // "--server HOST:PORT": the value is the next argument.
    if ((arg == "--server" || arg == "-server" || arg == "--timeout_ms" ||
         arg == "-timeout_ms") &&
        command_at < argc) {
      ++command_at;
    }
  }
  return command_at;
}

// A command opctl knows, with arguments only where it takes some:
// nullopt, else the usage error's exit status.
std::optional<int> CheckCommand(const std::string& command,
                                const std::vector<std::string>& rest) {
  if (command != "info" && command != "ops" && command != "stats" &&
      command != "run" && command != "bench") {
    return UsageError(
        absl::StrCat("unknown command '", command, "' (try --help)"));
  }
  if ((command == "info" || command == "ops" || command == "stats") &&
      !rest.empty()) {
    return UsageError(absl::StrCat("unexpected arguments after '", command,
                                   "' (try --help)"));
  }
  return std::nullopt;
}

// The connection the global flags describe (pipelining chosen per call).
absl::StatusOr<ConnectOptions> GlobalConnectOptions() {
  const int timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms <= 0) {
    return absl::InvalidArgumentError("--timeout_ms must be positive");
  }
  ConnectOptions options;
  options.connect_timeout = options.call_timeout =
      absl::Milliseconds(timeout_ms);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file: give both or neither");
  }
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(path);
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_file: ", token.status().message()));
    }
    options.token = *std::move(token);
  }
  return options;
}

// The pool --server names, read (and claimed) once: every command sees the
// same ordinals, and the claim lasts until opctl exits. nullopt for a
// single server.
absl::StatusOr<std::optional<PoolResolution>> ResolveServer(
    const std::string& server) {
  if (!IsEtcdAddress(server)) return std::optional<PoolResolution>();
  ASSIGN_OR_RETURN(ClaimOptions claim, ClaimOptionsFromEnv());
  ASSIGN_OR_RETURN(PoolResolution resolved,
                   ResolvePool(server, claim, EtcdCredentialsFromEnv()));
  return std::optional<PoolResolution>(std::move(resolved));
}

// Runs `command` (checked by CheckCommand) with `connect`.
int Dispatch(const std::string& command, const std::vector<std::string>& rest,
             const std::string& server,
             const std::optional<PoolResolution>& pool,
             const Connector& connect) {
  if (command == "run") return Run(connect, rest);
  if (command == "bench") return Bench(connect, rest);
  if (pool.has_value()) {
    if (command == "info") return PoolInfo(*pool, server);
    if (command == "stats") return PoolStats(*pool, connect);
  }
  auto connected = connect(true, 0);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = *connected->client;
  if (command == "info") return Info(client);
  if (command == "stats") return Stats(client);
  return Ops(client);
}

int Main(int argc, char** argv) {
  // Abseil's Mutex deadlock detection (on in Debian's build) records every
  // lock order; a command-line client has no use for it, and it slows the
  // pipelined channel that `opctl bench` measures.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Global flags end at the command; what follows belongs to the command.
  const int command_at = CommandIndex(argc, argv);
  // Exits on --help, --version and a bad flag.
  std::vector<char*> args =
      ParseFlagsOrExit(command_at, argv, "opctl", kUsage, "client/opctl.cc");
  if (args.size() > 1) {
    return UsageError(
        absl::StrCat("unexpected argument '", args[1], "' (try --help)"));
  }
  if (command_at >= argc) return UsageError("missing COMMAND (try --help)");
  const std::string command = argv[command_at];
  std::vector<std::string> rest(argv + command_at + 1, argv + argc);
  if (std::optional<int> bad = CheckCommand(command, rest)) return *bad;
  // Help needs no server (run's lists the server's operators when it
  // answers; see opctl_run.cc).
  if (command == "bench" && WantsHelp(rest)) return BenchHelp();
  absl::StatusOr<ConnectOptions> options = GlobalConnectOptions();
  if (!options.ok()) return Fail(options.status().message());
  const std::string server = absl::GetFlag(FLAGS_server);
  absl::StatusOr<std::optional<PoolResolution>> pool = ResolveServer(server);
  if (!pool.ok()) return Fail(pool.status().message());
  const Connector connect = [&](bool pipeline,
                                uint32_t device) -> absl::StatusOr<Connection> {
    ConnectOptions chosen = *options;
    chosen.pipeline = pipeline;
    std::string address = server;
    if (pool->has_value()) {
      ASSIGN_OR_RETURN(PoolDevice found, PoolOrdinal(**pool, server, device));
      address = found.address;
      device = found.device;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                     Client::Connect(address, chosen));
    return Connection{std::move(client), device};
  };
  return Dispatch(command, rest, server, *pool, connect);
}

}  // namespace
}  // namespace opctl
}  // namespace opserver::remote

int main(int argc, char** argv) {
  const int status = opserver::remote::opctl::Main(argc, argv);
  // Everything opctl made is gone by now (Main's locals). It leaves without
  // gRPC's library-wide cleanup, which after a failed TLS handshake can wait
  // for the channel's reconnect backoff timer: security_binary_test saw
  // opctl hang over a minute after printing its error (1 run in ~12 under
  // ASan), and LeakSanitizer report the handshake's half-freed OpenSSL
  // state. As in the server's main, the leak check then runs here.
#if defined(__SANITIZE_ADDRESS__)
  __lsan_do_leak_check();
#endif
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}
