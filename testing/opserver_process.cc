#include "testing/opserver_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

extern char** environ;

namespace opserver::process {

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

absl::StatusOr<OpserverProcess> StartOpserver(const OpserverLaunch& launch) {
  std::vector<std::string> args = {launch.binary, "--listen=127.0.0.1:0",
                                   "--metrics_listen=127.0.0.1:0"};
  args.insert(args.end(), launch.flags.begin(), launch.flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  if (!launch.opserver_address.empty()) {
    env_strings.push_back("OPSERVER_ADDRESS=" + launch.opserver_address);
  }
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "OPSERVER_")) env_strings.push_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, launch.out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!launch.err_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, launch.err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  OpserverProcess process;
  const int spawned = posix_spawn(&process.pid, launch.binary.c_str(), &actions,
                                  nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", launch.binary));
  }
  const absl::Time deadline = absl::Now() + launch.timeout;
  while (absl::Now() < deadline) {
    for (absl::string_view line :
         absl::StrSplit(ReadFile(launch.out_path), '\n')) {
      if (absl::ConsumePrefix(&line, "metrics on ")) {
        process.metrics = std::string(line);
      }
      if (absl::ConsumePrefix(&line, "listening on ")) {
        process.address = std::string(line);
      }
    }
    if (!process.address.empty()) return process;
    int status;
    if (waitpid(process.pid, &status, WNOHANG) == process.pid) {
      return absl::InternalError(absl::StrCat(
          launch.binary, " exited before listening (status ", status, ")"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(process.pid, SIGKILL);
  waitpid(process.pid, nullptr, 0);
  return absl::DeadlineExceededError(
      absl::StrCat(launch.binary, " did not start within ",
                   absl::FormatDuration(launch.timeout)));
}

}  // namespace opserver::process
