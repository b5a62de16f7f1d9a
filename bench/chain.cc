#include "bench/chain.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/metrics_scrape.h"

extern char** environ;

namespace opserver::bench {
namespace {

std::string Absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

std::string ReadFile(const std::string& path) {
  std::string text;
  FILE* f = fopen(path.c_str(), "r");
  char buf[4096];
  size_t n;
  while (f != nullptr && (n = fread(buf, 1, sizeof(buf), f)) > 0) {
    text.append(buf, n);
  }
  if (f != nullptr) fclose(f);
  return text;
}

}  // namespace

absl::StatusOr<Chain::Process> Chain::Spawn(
    const std::string& binary, const std::string& name,
    const std::vector<std::string>& flags,
    const std::string& opserver_address) {
  const char* tmp = getenv("TMPDIR");
  std::string dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  std::string out_template = dir + "/chain_" + name + "_XXXXXX";
  int out_fd = mkstemp(out_template.data());
  if (out_fd < 0) return absl::InternalError("mkstemp failed");
  const std::string out = out_template;
  std::vector<std::string> args = {binary, "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0",
                                   "--idle_timeout_s=3600"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  if (!opserver_address.empty()) {
    env_strings.push_back("OPSERVER_ADDRESS=" + opserver_address);
  }
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "OPSERVER_")) env_strings.push_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  Process process;
  const int spawned = posix_spawn(&process.pid, binary.c_str(), &actions,
                                  nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_fd);
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", binary));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    for (absl::string_view line : absl::StrSplit(ReadFile(out), '\n')) {
      if (absl::ConsumePrefix(&line, "metrics on ")) {
        process.metrics = std::string(line);
      }
      if (absl::ConsumePrefix(&line, "listening on ")) {
        process.address = std::string(line);
      }
    }
    if (!process.address.empty()) break;
    int status;
    if (waitpid(process.pid, &status, WNOHANG) == process.pid) {
      return absl::InternalError(
          absl::StrCat(name, " opserver exited before listening"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  unlink(out.c_str());
  if (process.address.empty()) {
    kill(process.pid, SIGKILL);
    waitpid(process.pid, nullptr, 0);
    return absl::DeadlineExceededError(
        absl::StrCat(name, " opserver did not start"));
  }
  return process;
}

absl::StatusOr<std::unique_ptr<Chain>> Chain::Start(const std::string& spec) {
  std::vector<std::string> paths = absl::StrSplit(spec, ',');
  if (paths.size() != 2) {
    return absl::InvalidArgumentError(
        "--chain wants OPSERVER,LIBACLNN_REMOTE (two paths)");
  }
  const std::string opserver = Absolute(paths[0]);
  std::unique_ptr<Chain> chain(new Chain);
  absl::StatusOr<Process> backend =
      Spawn(opserver, "backend", {"--device=cpu"}, "");
  if (!backend.ok()) return backend.status();
  chain->backend_ = *backend;
  absl::StatusOr<Process> front =
      Spawn(opserver, "front",
            {"--device=ascend", "--cann_libraries=" + Absolute(paths[1])},
            chain->backend_.address);
  if (!front.ok()) return front.status();
  chain->front_ = *front;
  return chain;
}

Chain::~Chain() {
  for (pid_t pid : {front_.pid, backend_.pid}) {
    if (pid <= 0) continue;
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
  }
}

BackendCounts ScrapeCounts(const std::string& metrics_address) {
  const std::string page = scrape::Metrics(metrics_address);
  BackendCounts counts;
  counts.fences = scrape::Sum(page, "opserver_pipeline_commands_total",
                              "command=\"fence\"");
  counts.launches = scrape::Sum(page, "opserver_pipeline_commands_total",
                                "command=\"launch\"");
  counts.batches = scrape::Sum(page, "opserver_pipeline_batches_total");
  counts.unary_calls =
      scrape::Sum(page, "grpc_server_call_started_total") -
      scrape::Sum(page, "grpc_server_call_started_total", "/Pipeline");
  counts.synchronizes =
      scrape::Sum(page, "grpc_server_call_started_total", "/SynchronizeStream");
  return counts;
}

BackendCounts operator-(const BackendCounts& a, const BackendCounts& b) {
  BackendCounts d;
  d.fences = a.fences - b.fences;
  d.unary_calls = a.unary_calls - b.unary_calls;
  d.synchronizes = a.synchronizes - b.synchronizes;
  d.launches = a.launches - b.launches;
  d.batches = a.batches - b.batches;
  return d;
}

}  // namespace opserver::bench
