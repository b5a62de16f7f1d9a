#include "testing/etcd_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/etcd_client.h"
#include "testing/opserver_process.h"

extern char** environ;

namespace opserver::process {
namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";

// Two distinct free loopback ports (both bound at once, then closed).
bool PickPorts(int* a, int* b) {
  int fds[2] = {-1, -1};
  int ports[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fds[i] < 0 ||
        bind(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fds[i], reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      break;
    }
    ports[i] = ntohs(addr.sin_port);
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  *a = ports[0];
  *b = ports[1];
  return ports[0] != 0 && ports[1] != 0;
}

bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool up =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return up;
}

// One try: spawn etcd on the chosen ports and wait for it to serve.
// UNAVAILABLE when it exited (a port was taken), so the caller tries again.
absl::Status Launch(EtcdProcess& etcd) {
  const bool tls = !etcd.tls.cert_file.empty();
  const std::string client =
      absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", etcd.client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", etcd.peer_port);
  const std::string log = etcd.dir + "/etcd.log";
  std::vector<std::string> args = {
      kEtcd,
      "--name=test",
      "--data-dir=" + etcd.dir + "/etcd-data",
      "--listen-client-urls=" + client,
      "--advertise-client-urls=" + client,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=test=" + peer,
  };
  if (tls) {
    args.push_back("--cert-file=" + etcd.tls.cert_file);
    args.push_back("--key-file=" + etcd.tls.key_file);
  }
  if (!etcd.tls.client_ca_file.empty()) {
    args.push_back("--client-cert-auth");
    args.push_back("--trusted-ca-file=" + etcd.tls.client_ca_file);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const int spawned =
      posix_spawn(&etcd.pid, kEtcd, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    etcd.pid = 0;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot start ", kEtcd, " (scripts/install-deps.sh installs it)"));
  }
  EtcdAddress address;
  address.endpoints = {absl::StrCat("127.0.0.1:", etcd.client_port)};
  address.prefix = "probe";
  absl::StatusOr<std::unique_ptr<EtcdClient>> connected =
      EtcdClient::Connect(address, etcd.tls.probe, absl::Seconds(1));
  if (!connected.ok()) {
    kill(etcd.pid, SIGKILL);
    waitpid(etcd.pid, nullptr, 0);
    etcd.pid = 0;
    return connected.status();
  }
  std::unique_ptr<EtcdClient> probe = *std::move(connected);
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(etcd.pid, &status, WNOHANG) == etcd.pid) {
      etcd.pid = 0;
      return absl::UnavailableError(
          absl::StrCat("etcd exited (status ", status, "); see ", log));
    }
    // Serving once it answers a read (it has elected itself leader). Asked
    // only once its port accepts connections: a gRPC channel that found
    // the port closed would wait out its reconnection backoff.
    if (Accepts(etcd.client_port) && probe->List("/probe/").ok()) {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  kill(etcd.pid, SIGKILL);
  waitpid(etcd.pid, nullptr, 0);
  etcd.pid = 0;
  return absl::DeadlineExceededError("etcd did not start within a minute");
}

}  // namespace

absl::StatusOr<EtcdProcess> StartEtcd(const std::string& dir,
                                      const EtcdTls& tls) {
  EtcdProcess etcd;
  etcd.dir = dir;
  etcd.tls = tls;
  absl::Status status;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (!PickPorts(&etcd.client_port, &etcd.peer_port)) {
      return absl::InternalError("no free loopback port");
    }
    status = Launch(etcd);
    if (status.ok()) {
      etcd.endpoint = absl::StrCat("127.0.0.1:", etcd.client_port);
      return etcd;
    }
    if (!absl::IsUnavailable(status)) return status;
  }
  return status;
}

void StopEtcd(EtcdProcess& etcd) {
  if (etcd.pid == 0) return;
  kill(etcd.pid, SIGTERM);
  waitpid(etcd.pid, nullptr, 0);
  etcd.pid = 0;
}

absl::Status RestartEtcd(EtcdProcess& etcd) {
  StopEtcd(etcd);
  return Launch(etcd);
}

}  // namespace opserver::process
