#include "bench/soak_processes.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

extern char** environ;

namespace opserver::soak {

std::map<std::string, int> ThreadNames(pid_t pid) {
  std::map<std::string, int> names;
  const std::string dir_name = absl::StrCat("/proc/", pid, "/task");
  if (DIR* dir = opendir(dir_name.c_str())) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      std::ifstream comm(absl::StrCat(dir_name, "/", entry->d_name, "/comm"));
      std::string name;
      std::getline(comm, name);
      ++names[name];
    }
    closedir(dir);
  }
  return names;
}

ProcSample ReadProc(pid_t pid) {
  ProcSample s;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    auto field = [&](const char* name, int64_t* out) {
      if (absl::StartsWith(line, name)) {
        std::vector<std::string> parts = absl::StrSplit(
            line.substr(std::strlen(name)), ' ', absl::SkipWhitespace());
        if (!parts.empty()) absl::SimpleAtoi(parts[0], out);
      }
    };
    field("VmRSS:", &s.rss_kb);
    field("VmHWM:", &s.hwm_kb);
    field("Threads:", &s.threads);
  }
  if (DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    s.fds = 0;
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++s.fds;
    }
    closedir(dir);
  }
  return s;
}

std::string LoadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string a, b, c;
  file >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

pid_t StartServer(const std::vector<std::string>& argv, const std::string& log,
                  std::string* address) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::exit(2);
  }
  const int err =
      open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err < 0) {
    std::perror(log.c_str());
    std::exit(2);
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Dies with the soak, whatever happens to it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], 1);
    dup2(err, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err);
  // "listening on HOST:PORT", within 60 s (an ASan build starts slowly).
  std::string text;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[256];
      ssize_t n = read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, n);
      size_t at = text.find("listening on ");
      size_t end = text.find('\n', at);
      if (at != std::string::npos && end != std::string::npos) {
        *address = text.substr(at + 13, end - at - 13);
        return pid;  // out[0] stays open: the server may print again.
      }
    }
    int wstatus;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) break;
  }
  std::fprintf(stderr, "soak: the server did not report its port; see %s\n",
               log.c_str());
  kill(pid, SIGKILL);
  std::exit(2);
}

std::string DescribeWait(int wstatus) {
  if (WIFEXITED(wstatus))
    return absl::StrCat("exit status ", WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wstatus), " (",
                        strsignal(WTERMSIG(wstatus)), ")");
  }
  return absl::StrCat("wait status ", wstatus);
}

// The killer: child client processes SIGKILLed in the middle of a transfer.

Killer::Killer(std::string self, std::string address, absl::Duration interval,
               uint64_t seed, std::vector<std::string> child_flags)
    : self_(std::move(self)),
      address_(std::move(address)),
      interval_(interval),
      child_flags_(std::move(child_flags)),
      rng_(seed) {}

void Killer::Run(const std::atomic<bool>* stop) {
  static const char* const kKinds[] = {"upload", "download", "pipeline"};
  for (uint64_t i = 0; !stop->load(); ++i) {
    const std::string kind = kKinds[i % 3];
    const bool attach = (rng_() % 2) == 0;
    RunOne(kind, attach);
    for (absl::Time until = absl::Now() + interval_;
         absl::Now() < until && !stop->load();) {
      absl::SleepFor(std::min(interval_, absl::Milliseconds(50)));
    }
  }
}

std::string Killer::Report() const {
  absl::MutexLock lock(&mu_);
  std::string out =
      "| killed during | session attached | started | killed mid-transfer "
      "| median ms to mid-transfer | other outcome |\n"
      "|---|---|---:|---:|---:|---|\n";
  for (const auto& [key, row] : rows_) {
    const std::vector<double>& ms = row.ready_ms;
    absl::StrAppend(
        &out, "| ", key.first, " | ", key.second ? "yes" : "no (idle reaper)",
        " | ", row.started, " | ", row.killed, " | ",
        absl::StrFormat("%.0f", Median(ms)), " | ",
        row.failures.empty()
            ? "none"
            : absl::StrCat("**", absl::StrJoin(row.failures, "; "), "**"),
        " |\n");
  }
  return out;
}

uint64_t Killer::failures() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [key, row] : rows_) n += row.failures.size();
  return n;
}

uint64_t Killer::killed() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [key, row] : rows_) n += row.killed;
  return n;
}

void Killer::RunOne(const std::string& kind, bool attach) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::vector<std::string> argv = {
      self_, absl::StrCat("--fault_child=", kind),
      absl::StrCat("--server=", address_),
      absl::StrCat("--attach=", attach ? "true" : "false"),
      absl::StrCat("--parent_pid=", getpid())};
  argv.insert(argv.end(), child_flags_.begin(), child_flags_.end());
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  const absl::Time start = absl::Now();
  const int rc =
      posix_spawn(&pid, self_.c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  Row* row;
  {
    absl::MutexLock lock(&mu_);
    row = &rows_[{kind, attach}];
    ++row->started;
  }
  if (rc != 0) {
    close(out[0]);
    Fail(row, absl::StrCat("posix_spawn: ", std::strerror(rc)));
    return;
  }
  // Wait for 'R' (mid-transfer), at most 60 s.
  bool ready = false;
  pollfd p{out[0], POLLIN, 0};
  if (poll(&p, 1, 60000) > 0) {
    char c;
    ready = read(out[0], &c, 1) == 1 && c == 'R';
  }
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (ready) {
    // Somewhere in the middle of the transfer.
    absl::SleepFor(absl::Milliseconds(rng_() % 20));
  }
  kill(pid, SIGKILL);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  close(out[0]);
  if (ready && WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) {
    absl::MutexLock lock(&mu_);
    ++row->killed;
    row->ready_ms.push_back(ms);
  } else {
    Fail(row, absl::StrCat(ready ? "" : "never reached the transfer, ",
                           DescribeWait(wstatus)));
  }
}

void Killer::Fail(Row* row, std::string what) {
  std::fprintf(stderr, "soak: UNEXPECTED fault child: %s\n", what.c_str());
  absl::MutexLock lock(&mu_);
  if (row->failures.size() < 5) row->failures.push_back(std::move(what));
}

namespace {
std::atomic<const char*> watchdog_phase{"start"};
std::atomic<int64_t> watchdog_deadline_ns{0};
}  // namespace

std::atomic<pid_t> server_pid{0};

void SetPhase(const char* phase, absl::Duration budget) {
  watchdog_phase = phase;
  watchdog_deadline_ns = absl::ToUnixNanos(absl::Now() + budget);
}

void Watchdog() {
  for (;;) {
    absl::SleepFor(absl::Seconds(1));
    const int64_t deadline = watchdog_deadline_ns.load();
    if (deadline != 0 && absl::ToUnixNanos(absl::Now()) > deadline) {
      std::fprintf(stderr,
                   "soak: FAIL: watchdog: phase '%s' did not finish in its "
                   "time budget; killing the server and exiting\n",
                   watchdog_phase.load());
      if (server_pid.load() > 0) kill(server_pid.load(), SIGKILL);
      std::fflush(stderr);
      _exit(3);
    }
  }
}

v1::ServerStats QueryServerStats(Conn* conn, bool* ok) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  v1::ServerStats stats;
  *ok = conn->rt->GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
            .ok();
  return stats;
}

namespace {

std::string RandomToken() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&token, absl::Hex(device(), absl::kZeroPad8));
  }
  return token;
}

}  // namespace

ServerLog ReadServerLog(const std::string& path, bool tokens) {
  ServerLog log;
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    const size_t at = line.find(" opserver: ");
    std::string kind = "other";
    if (at != std::string::npos) {
      const std::string rest = line.substr(at + 11);
      for (const char* known :
           {"started: ", "call failed: ", "received ", "stopped",
            // Failed calls past the rate limit, summarized (CallLog).
            "suppressed ",
            // Calls refused for their token, the first in full and then a
            // summary every 10 s: only when the server has tokens.
            "rejected "}) {
        if (absl::StartsWith(rest, known)) kind = known;
      }
      if (absl::StartsWith(rest, "session ")) {
        kind = absl::StrContains(rest, "closed: idle") ? "session idle"
               : absl::StrContains(rest, "attached client went away")
                   ? "session attach ended"
                   : "session closed";
      }
      if (kind == "rejected " && !tokens) kind = "other";
      if (kind == "stopped") log.stopped = true;
    }
    ++log.kinds[kind];
    if (kind == "other" && log.odd_lines.size() < 10) {
      log.odd_lines.push_back(line);
    }
  }
  return log;
}

bool MakeSecureSetup(Tenants* tenants, std::string* dir, std::string* error) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/opserver-soak-tls.XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    *error = absl::StrCat("mkdtemp: ", std::strerror(errno));
    return false;
  }
  *dir = pattern;
  // As tests/gen_certs.sh makes them: a CA, and a server certificate it
  // signed for the loopback address the server listens on. openssl may
  // want a random seed file under $HOME; keep it in the directory.
  const std::string script = absl::StrCat(
      "set -e; cd '", *dir, "'; export RANDFILE=\"$PWD/.rnd\"; ",
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 ",
      "-subj '/CN=opserver soak CA' -keyout ca.key -out ca.pem; ",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost ",
      "-keyout server.key -out server.csr; ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n",
      "extendedKeyUsage=serverAuth\\n' >server.ext; ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key ",
      "-CAcreateserial -days 2 -extfile server.ext -out server.pem; ",
      "rm -f server.csr server.ext");
  const std::string command =
      absl::StrCat("(", script, ") >'", *dir, "/openssl.log' 2>&1");
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    std::ifstream log(*dir + "/openssl.log");
    std::stringstream text;
    text << log.rdbuf();
    *error = absl::StrCat("openssl failed (", rc, "): ", text.str());
    return false;
  }
  tenants->alice = RandomToken();
  tenants->bob = RandomToken();
  tenants->mallory = RandomToken();
  tenants->wrong = RandomToken();
  const std::string tokens = absl::StrCat(
      "# The soak's tenants (made for one run).\nalice ", tenants->alice,
      "\nbob ", tenants->bob, "\nmallory ", tenants->mallory, "\n");
  const std::string path = *dir + "/tokens";
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, tokens.data(), tokens.size()) !=
                    static_cast<ssize_t>(tokens.size())) {
    *error = absl::StrCat(path, ": ", std::strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  close(fd);
  return true;
}

void RemoveSecureSetup(const std::string& dir) {
  for (const char* name : {"ca.pem", "ca.key", "ca.srl", "server.pem",
                           "server.key", "tokens", "openssl.log", ".rnd"}) {
    unlink(absl::StrCat(dir, "/", name).c_str());
  }
  rmdir(dir.c_str());
}

}  // namespace opserver::soak
