// opctl: command-line client of an opserver.
//
//   opctl [--server=HOST:PORT] info    device, versions and health

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "opserver to talk to.");
ABSL_FLAG(int, timeout_ms, 5000,
          "Deadline for connecting and for each call, in milliseconds.");

namespace {

constexpr char kUsage[] =
    "Command-line client of an opserver.\n"
    "Usage: opctl [--server=HOST:PORT] [--timeout_ms=N] COMMAND\n"
    "Commands:\n"
    "  info   device, server version and health";

int Fail(const std::string& message) {
  std::fprintf(stderr, "opctl: %s\n", message.c_str());
  return 1;
}

int Info(opserver::Client& client) {
  auto info = client.GetDeviceInfo();
  if (!info.ok()) return Fail(std::string(info.status().message()));
  auto health = client.CheckHealth();
  if (!health.ok()) return Fail(std::string(health.status().message()));
  std::printf("server:   %s\n", client.address().c_str());
  std::printf("device:   %s (%s)\n", info->kind().c_str(),
              info->name().c_str());
  std::printf("memory:   %llu bytes\n",
              static_cast<unsigned long long>(info->memory_bytes()));
  std::printf("threads:  %u\n", info->threads());
  std::printf("version:  opserver %s, %s, gRPC %s\n",
              info->server_version().c_str(), info->api_version().c_str(),
              info->grpc_version().c_str());
  std::printf("health:   %s\n", health->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    return Fail(args.size() < 2 ? "missing COMMAND (try --help)"
                                : absl::StrCat("unexpected arguments after '",
                                               args[1], "' (try --help)"));
  }
  std::string command = args[1];
  if (command != "info") {
    return Fail(absl::StrCat("unknown command '", command, "' (try --help)"));
  }
  opserver::ConnectOptions options;
  options.connect_timeout = options.call_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  auto client = opserver::Client::Connect(absl::GetFlag(FLAGS_server), options);
  if (!client.ok()) return Fail(std::string(client.status().message()));
  return Info(**client);
}
