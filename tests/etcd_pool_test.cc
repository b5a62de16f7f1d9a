// A pool of opservers in a real etcd (Debian's etcd-server, started by the
// test on loopback; docs/pool.md): servers register their devices under a
// lease (--register), clients list them in a stable order and claim free
// ones atomically, a SIGKILLed server and a dead job leave when their
// leases expire, a drain removes the keys at once, a server keeps serving
// through an etcd restart and registers again, and every bad input or
// unreachable etcd is a clear error. Leases are 2 s; every wait on etcd is
// a bounded poll on the condition, never a sleep.
//
// Arguments: the opserver binary, opctl.

#include "client/etcd_pool.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "acl/acl.h"
#include "client/client.h"
#include "client/device_set.h"
#include "common/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/closed_port.h"
#include "testing/etcd_process.h"
#include "testing/metrics_scrape.h"
#include "testing/opserver_process.h"
#include "testing/test_main.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string g_opserver;  // argv[1]
std::string g_opctl;     // argv[2]

ClaimOptions Claim(uint32_t count, absl::Duration wait = absl::ZeroDuration(),
                   int ttl_s = 10) {
  ClaimOptions options;
  options.count = count;
  options.wait = wait;
  options.ttl_s = ttl_s;
  return options;
}

// Polls `done` until it holds, for up to a minute.
template <typename F>
bool WaitUntil(F done) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

class EtcdPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        getenv("TEST_TMPDIR"), "/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(("mkdir -p " + dir_).c_str()), 0);
    absl::StatusOr<process::EtcdProcess> etcd = process::StartEtcd(dir_);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *etcd;
    pool_ = absl::StrCat("etcd://", etcd_.endpoint, "/ops/pool");
  }

  void TearDown() override {
    for (pid_t pid : servers_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    process::StopEtcd(etcd_);
  }

  // An opserver registered in the pool, with `flags` added.
  absl::StatusOr<process::OpserverProcess> StartServer(
      std::vector<std::string> flags = {}) {
    process::OpserverLaunch launch;
    launch.binary = g_opserver;
    launch.flags = {"--threads=1", "--register=" + pool_, "--register_ttl_s=2"};
    launch.flags.insert(launch.flags.end(), flags.begin(), flags.end());
    const std::string name = absl::StrCat(dir_, "/server", servers_.size());
    launch.out_path = name + ".out";
    launch.err_path = name + ".err";
    absl::StatusOr<process::OpserverProcess> server =
        process::StartOpserver(launch);
    if (server.ok()) servers_.push_back(server->pid);
    return server;
  }

  void Kill(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    servers_.erase(std::remove(servers_.begin(), servers_.end(), pid),
                   servers_.end());
  }

  // The registered devices as "ADDRESS/INDEX", in the pool's order.
  std::vector<std::string> Registered() {
    absl::StatusOr<PoolResolution> pool = ResolvePool(pool_);
    std::vector<std::string> names;
    if (!pool.ok()) return names;
    for (const PoolDevice& d : pool->devices) {
      names.push_back(absl::StrCat(d.address, "/", d.device));
    }
    return names;
  }

  // Debian's etcdctl (etcd-client) on the test's etcd, as `user` (USER:
  // PASSWORD) when set, its output appended to dir_/etcdctl.log; the exit
  // status.
  int Etcdctl(const std::string& args, const std::string& user = "") {
    const std::string command =
        absl::StrCat("ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=http://",
                     etcd_.endpoint, user.empty() ? "" : " --user=" + user, " ",
                     args, " >>", dir_, "/etcdctl.log 2>&1");
    return system(command.c_str());
  }

  std::unique_ptr<EtcdClient> Etcd(const std::string& prefix = "ops/pool") {
    EtcdAddress address{{etcd_.endpoint}, prefix};
    return *EtcdClient::Connect(address);
  }

  std::string dir_;
  process::EtcdProcess etcd_;
  std::string pool_;
  std::vector<pid_t> servers_;
};

// The ordinals: server addresses in key (string) order, then indexes.
std::vector<std::string> Expected(
    std::vector<std::pair<std::string, int>> servers) {
  std::sort(servers.begin(), servers.end());
  std::vector<std::string> names;
  for (const auto& [address, devices] : servers) {
    for (int i = 0; i < devices; ++i) {
      names.push_back(absl::StrCat(address, "/", i));
    }
  }
  return names;
}

TEST_F(EtcdPoolTest, ServersRegisterAndClientsListTheirDevicesInOrder) {
  auto a = StartServer({"--devices=2"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartServer();
  ASSERT_TRUE(b.ok()) << b.status();
  // Registered before "listening on": no wait.
  const std::vector<std::string> expected =
      Expected({{a->address, 2}, {b->address, 1}});
  EXPECT_EQ(Registered(), expected);

  absl::StatusOr<PoolResolution> pool = ResolvePool(pool_);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->devices.size(), 3u);
  for (const PoolDevice& d : pool->devices) {
    EXPECT_EQ(d.info.address(), d.address);
    EXPECT_EQ(d.info.kind(), "cpu");
    EXPECT_GT(d.info.capacity_bytes(), 0u);
    EXPECT_FALSE(d.info.draining());
  }
  EXPECT_EQ(pool->claim, nullptr);

  // The C++ DeviceSet: the same ordinals, each a working device.
  auto set = remote::DeviceSet::ConnectAddress(pool_);
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ((*set)->size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    auto device = (*set)->device(i);
    ASSERT_TRUE(device.ok());
    EXPECT_EQ(
        absl::StrCat((*set)->addresses()[device->server], "/", device->local),
        expected[i]);
    auto session = (*set)->CreateSession(i, "pool");
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_TRUE((*session)->Malloc(64).ok());
  }
}

TEST_F(EtcdPoolTest, JobsClaimingAtOnceNeverGetTheSameDevice) {
  auto a = StartServer({"--devices=2"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartServer();
  ASSERT_TRUE(b.ok()) << b.status();
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    // Two jobs, released together, each claiming one of three free devices.
    absl::Barrier* start = new absl::Barrier(2);
    absl::StatusOr<PoolResolution> jobs[2] = {absl::UnknownError(""),
                                              absl::UnknownError("")};
    std::vector<std::thread> threads;
    for (int j = 0; j < 2; ++j) {
      threads.emplace_back([&, j] {
        if (start->Block()) delete start;
        jobs[j] = ResolvePool(pool_, Claim(1));
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(jobs[0].ok()) << jobs[0].status();
    ASSERT_TRUE(jobs[1].ok()) << jobs[1].status();
    ASSERT_EQ(jobs[0]->devices.size(), 1u);
    ASSERT_EQ(jobs[1]->devices.size(), 1u);
    EXPECT_NE(
        std::make_pair(jobs[0]->devices[0].address, jobs[0]->devices[0].device),
        std::make_pair(jobs[1]->devices[0].address,
                       jobs[1]->devices[0].device));
    // One device is left: a job asking for two is told so.
    absl::StatusOr<PoolResolution> third = ResolvePool(pool_, Claim(2));
    ASSERT_FALSE(third.ok());
    EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(third.status().message(),
                HasSubstr("claiming 2 devices under etcd prefix /ops/pool/: "
                          "3 registered, 1 free"));
    EXPECT_THAT(third.status().message(), HasSubstr("OPSERVER_CLAIM_WAIT_S"));
    // The claims end with their jobs (destroyed here): all free again.
  }
  absl::StatusOr<PoolResolution> all = ResolvePool(pool_, Claim(3));
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<PoolResolution> none = ResolvePool(pool_, Claim(1));
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("3 registered, 0 free"));
}

TEST_F(EtcdPoolTest, AClaimedDeviceSetHasExactlyItsClaimedDevices) {
  auto a = StartServer({"--devices=3"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto first = remote::DeviceSet::ConnectAddress(pool_, {}, Claim(2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)->size(), 2u);
  auto second = remote::DeviceSet::ConnectAddress(pool_, {}, Claim(1));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ((*second)->size(), 1u);
  EXPECT_EQ((*first)->device(0)->local, 0u);
  EXPECT_EQ((*first)->device(1)->local, 1u);
  EXPECT_EQ((*second)->device(0)->local, 2u);
  auto session = (*second)->CreateSession(0, "claimed");
  ASSERT_TRUE(session.ok()) << session.status();
  // More than there are devices.
  first->reset();
  auto too_many = remote::DeviceSet::ConnectAddress(pool_, {}, Claim(4));
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_many.status().message(),
              HasSubstr("claiming 4 devices under etcd prefix /ops/pool/: 3 "
                        "registered, 2 free"));
}

TEST_F(EtcdPoolTest, AClaimWaitsForADeviceToBeFreed) {
  auto a = StartServer();
  ASSERT_TRUE(a.ok()) << a.status();
  auto holder = std::make_unique<absl::StatusOr<PoolResolution>>(
      ResolvePool(pool_, Claim(1)));
  ASSERT_TRUE(holder->ok()) << holder->status();
  absl::StatusOr<PoolResolution> waiter = absl::UnknownError("");
  absl::Notification waits;
  ClaimOptions options = Claim(1, absl::Minutes(1));
  options.waiting = [&] {
    if (!waits.HasBeenNotified()) waits.Notify();
  };
  std::thread job([&] { waiter = ResolvePool(pool_, options); });
  waits.WaitForNotification();  // It found the device taken.
  holder.reset();               // The first job exits.
  job.join();
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  EXPECT_EQ(waiter->devices.size(), 1u);
}

TEST_F(EtcdPoolTest, ADeadJobsClaimGoesWhenItsLeaseExpires) {
  auto a = StartServer({"--devices=2"});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<PoolResolution> dead =
      ResolvePool(pool_, Claim(2, absl::ZeroDuration(), 2));
  ASSERT_TRUE(dead.ok()) << dead.status();
  dead->claim->AbandonForTest();  // No renewal, no revocation: a dead job.
  EXPECT_FALSE(ResolvePool(pool_, Claim(1)).ok());
  absl::StatusOr<PoolResolution> next = absl::UnknownError("");
  EXPECT_TRUE(WaitUntil([&] {
    next = ResolvePool(pool_, Claim(2));
    return next.ok();
  })) << next.status();
}

TEST_F(EtcdPoolTest, AKilledServerLeavesWhenItsLeaseExpires) {
  auto a = StartServer({"--devices=2"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartServer();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(Registered().size(), 3u);
  Kill(b->pid);
  EXPECT_TRUE(WaitUntil([&] {
    return Registered() == Expected({{a->address, 2}});
  })) << ::testing::PrintToString(Registered());
}

TEST_F(EtcdPoolTest, ADrainRemovesTheKeysAtOnceAndOpenSessionsGoOn) {
  auto a = StartServer({"--drain_s=600"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto client = remote::Client::Connect(a->address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->CreateSession("open");
  ASSERT_TRUE(session.ok()) << session.status();
  kill(a->pid, SIGTERM);
  // Well before the 2 s lease could expire: the drain revoked it. The
  // wait is for the signal to be handled.
  EXPECT_TRUE(WaitUntil([&] { return Registered().empty(); }));
  absl::StatusOr<PoolResolution> empty = ResolvePool(pool_);
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(),
              HasSubstr("no opserver is registered under etcd prefix "
                        "/ops/pool/"));
  EXPECT_EQ(waitpid(a->pid, nullptr, WNOHANG), 0);  // Still serving.
  EXPECT_TRUE((*session)->Malloc(64).ok());
}

TEST_F(EtcdPoolTest, AServerRidesOutAnEtcdRestartAndRegistersAgain) {
  auto a = StartServer({"--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_FALSE(a->metrics.empty());
  ASSERT_EQ(Registered().size(), 1u);
  // /metrics follows the registration: up, and no failure yet.
  auto metric = [&](const std::string& family) {
    const std::string page = scrape::Metrics(a->metrics);
    return page.find(family) == std::string::npos ? -1.0
                                                  : scrape::Sum(page, family);
  };
  EXPECT_EQ(metric("opserver_registration_up"), 1.0);
  EXPECT_EQ(metric("opserver_registration_failures_total"), 0.0);
  process::StopEtcd(etcd_);
  // etcd is gone: clients are told so with gRPC's code and the endpoint.
  absl::StatusOr<PoolResolution> down = ResolvePool(pool_);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(down.status().message(),
              HasSubstr(absl::StrCat("etcd at ", etcd_.endpoint,
                                     " (Range): UNAVAILABLE: ")));
  const std::string log = absl::StrCat(dir_, "/server0.err");
  EXPECT_TRUE(WaitUntil([&] {
    return process::ReadFile(log).find("etcd: the registration is lost") !=
           std::string::npos;
  })) << process::ReadFile(log);
  EXPECT_TRUE(
      WaitUntil([&] { return metric("opserver_registration_up") == 0.0; }));
  EXPECT_GE(metric("opserver_registration_failures_total"), 1.0);
  // The server serves on, and says it is serving.
  auto client = remote::Client::Connect(a->address);
  ASSERT_TRUE(client.ok()) << client.status();
  auto health = (*client)->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
  auto session = (*client)->CreateSession("through the outage");
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(process::RestartEtcd(etcd_).ok());
  EXPECT_TRUE(WaitUntil([&] {
    return process::ReadFile(log).find("etcd: registered again") !=
           std::string::npos;
  })) << process::ReadFile(log);
  EXPECT_EQ(Registered(), Expected({{a->address, 1}}));
  EXPECT_TRUE(
      WaitUntil([&] { return metric("opserver_registration_up") == 1.0; }));
  EXPECT_TRUE((*session)->Malloc(64).ok());
}

TEST_F(EtcdPoolTest, AServerThatCannotReachEtcdExitsWithOneLine) {
  process::OpserverLaunch launch;
  launch.binary = g_opserver;
  const std::string closed = ClosedPortAddress();
  launch.flags = {absl::StrCat("--register=etcd://", closed, "/ops/pool")};
  launch.out_path = dir_ + "/unreachable.out";
  launch.err_path = dir_ + "/unreachable.err";
  absl::StatusOr<process::OpserverProcess> server =
      process::StartOpserver(launch);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("exited before listening"));
  const std::string err = process::ReadFile(launch.err_path);
  EXPECT_THAT(err, HasSubstr(absl::StrCat("error: --register: etcd at ", closed,
                                          " (LeaseGrant): UNAVAILABLE: ")));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST_F(EtcdPoolTest, BadFlagsAreRefusedNamingThem) {
  for (const auto& [flags, message] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--register=etcd://h:1"}, "no /PREFIX"},
           {{"--register=" + pool_, "--register_ttl_s=1"},
            "--register_ttl_s=1: at least 2"},
           {{"--register=" + pool_, "--register_address=h:0"},
            "--register_address=h:0: not HOST:PORT"},
           {{"--register=" + pool_, "--etcd_user=root"},
            "--etcd_user needs --etcd_password_file"},
       }) {
    process::OpserverLaunch launch;
    launch.binary = g_opserver;
    launch.flags = flags;
    launch.out_path = dir_ + "/bad.out";
    launch.err_path = dir_ + "/bad.err";
    ASSERT_FALSE(process::StartOpserver(launch).ok()) << message;
    EXPECT_THAT(process::ReadFile(launch.err_path), HasSubstr(message));
  }
}

// etcd's own authentication, passed through (docs/pool.md): with auth
// on, a server given --etcd_user and --etcd_password_file registers, a
// client with the same user lists its devices, a client without a user
// or with a wrong password gets etcd's reason, and so does a server with a
// wrong password, in its one error line.
TEST_F(EtcdPoolTest, WithEtcdAuthenticationTheUserAndPasswordAreUsed) {
  const std::string password = "pool-test-secret";
  ASSERT_EQ(Etcdctl("user add root:" + password + " --interactive=false"), 0)
      << process::ReadFile(dir_ + "/etcdctl.log");
  ASSERT_EQ(Etcdctl("role add root"), 0);
  ASSERT_EQ(Etcdctl("user grant-role root root"), 0);
  ASSERT_EQ(Etcdctl("auth enable"), 0);
  // Unauthenticated, etcd refuses even a read now.
  ASSERT_NE(Etcdctl("get x"), 0);
  const std::string password_file = dir_ + "/etcd-password";
  const std::string wrong_file = dir_ + "/wrong-password";
  std::ofstream(password_file) << password << "\n";
  std::ofstream(wrong_file) << "wrong\n";

  absl::StatusOr<process::OpserverProcess> server = StartServer(
      {"--etcd_user=root", "--etcd_password_file=" + password_file});
  ASSERT_TRUE(server.ok()) << server.status();
  EtcdCredentials root;
  root.user = "root";
  root.password = password;
  absl::StatusOr<PoolResolution> pool = ResolvePool(pool_, {}, root);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->devices.size(), 1u);
  EXPECT_EQ(pool->devices[0].address, server->address);
  // A claim is a transaction under the job's own lease: allowed too.
  absl::StatusOr<PoolResolution> claimed = ResolvePool(pool_, Claim(1), root);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ(claimed->devices.size(), 1u);

  absl::StatusOr<PoolResolution> anonymous = ResolvePool(pool_);
  ASSERT_FALSE(anonymous.ok());
  EXPECT_THAT(anonymous.status().message(),
              HasSubstr("etcdserver: user name is empty"));
  EtcdCredentials wrong = root;
  wrong.password = "wrong";
  absl::StatusOr<PoolResolution> refused = ResolvePool(pool_, {}, wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("etcdserver: authentication failed, invalid user ID "
                        "or password"));

  process::OpserverLaunch launch;
  launch.binary = g_opserver;
  launch.flags = {"--register=" + pool_, "--etcd_user=root",
                  "--etcd_password_file=" + wrong_file};
  launch.out_path = dir_ + "/wrong.out";
  launch.err_path = dir_ + "/wrong.err";
  ASSERT_FALSE(process::StartOpserver(launch).ok());
  const std::string err = process::ReadFile(launch.err_path);
  EXPECT_THAT(err, HasSubstr("error: --register: "));
  EXPECT_THAT(err, HasSubstr("etcdserver: authentication failed, invalid "
                             "user ID or password"));
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

TEST_F(EtcdPoolTest, ClientsToAnUnreachableEtcdGetItsCode) {
  const std::string closed = ClosedPortAddress();
  absl::StatusOr<PoolResolution> pool =
      ResolvePool(absl::StrCat("etcd://", closed, "/ops/pool"));
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(
      pool.status().message(),
      HasSubstr(absl::StrCat("etcd at ", closed, " (Range): UNAVAILABLE: ")));
  // With a claim, the lease is the first call.
  pool = ResolvePool(absl::StrCat("etcd://", closed, "/ops/pool"), Claim(1));
  EXPECT_THAT(pool.status().message(),
              HasSubstr(absl::StrCat("etcd at ", closed,
                                     " (LeaseGrant): UNAVAILABLE: ")));
  // Two endpoints, both down: both named.
  pool = ResolvePool(absl::StrCat("etcd://", closed, ",", closed, "/p"));
  EXPECT_THAT(pool.status().message(),
              HasSubstr(absl::StrCat("etcd at ", closed, ",", closed)));
  // The first endpoint down, the second up: served by the second.
  auto a = StartServer();
  ASSERT_TRUE(a.ok()) << a.status();
  pool = ResolvePool(
      absl::StrCat("etcd://", closed, ",", etcd_.endpoint, "/ops/pool"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->devices.size(), 1u);
}

TEST_F(EtcdPoolTest, APrefixHoldingOtherKeysIsRefusedNamingTheKey) {
  const struct {
    std::string rest, value, why;
  } cases[] = {
      {"config", "x", "outside devices/ and claims/"},
      {"devices/nonsense", "x", "not ADDRESS/INDEX"},
      {"devices/127.0.0.1:1/00000", "not json",
       "whose value is not a device registration"},
      {"devices/127.0.0.1:1/00000", R"({"address":"127.0.0.1:2","device":0})",
       "whose value names another device than its key"},
      {"devices/127.0.0.1:1/00000", std::string(5000, ' '),
       "whose value is not a device registration"},
      {"claims/127.0.0.1:1/7", "x",
       "the device index is not five decimal digits"},
  };
  int n = 0;
  for (const auto& c : cases) {
    // A prefix of its own per case, holding a good registration too.
    const std::string prefix = absl::StrCat("shared", n++);
    const std::string key = absl::StrCat("/", prefix, "/", c.rest);
    SCOPED_TRACE(key);
    std::unique_ptr<EtcdClient> etcd = Etcd(prefix);
    ASSERT_TRUE(
        etcd->Put(absl::StrCat("/", prefix, "/devices/127.0.0.1:9/00000"),
                  R"({"address":"127.0.0.1:9","device":0})", 0)
            .ok());
    ASSERT_TRUE(etcd->Put(key, c.value, 0).ok());
    for (uint32_t count : {0u, 1u}) {
      absl::StatusOr<PoolResolution> pool = ResolvePool(
          absl::StrCat("etcd://", etcd_.endpoint, "/", prefix), Claim(count));
      ASSERT_FALSE(pool.ok());
      EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(
          pool.status().message(),
          HasSubstr(absl::StrCat("etcd prefix /", prefix, "/ holds the key '",
                                 key, "' ", c.why)));
      EXPECT_THAT(pool.status().message(),
                  HasSubstr("it is not an opserver pool's"));
    }
  }
}

TEST_F(EtcdPoolTest, TheCApiTakesAnEtcdAddressAndAClaim) {
  auto a = StartServer({"--devices=3"});
  ASSERT_TRUE(a.ok()) << a.status();
  setenv("OPSERVER_ADDRESS", pool_.c_str(), 1);
  setenv("OPSERVER_CLAIM", "2", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS) << aclGetRecentErrMsg();
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  EXPECT_EQ(count, 2u);
  ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS) << aclGetRecentErrMsg();
  void* p = nullptr;
  ASSERT_EQ(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetDevice(2), ACL_ERROR_INVALID_DEVICE);
  // Held while this job runs: another job gets the one left, not two.
  EXPECT_FALSE(ResolvePool(pool_, Claim(2)).ok());
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  // Released at aclFinalize.
  EXPECT_TRUE(ResolvePool(pool_, Claim(3)).ok());

  // Too many: aclInit says so.
  setenv("OPSERVER_CLAIM", "4", 1);
  EXPECT_EQ(aclInit(nullptr), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()),
              HasSubstr(absl::StrCat("aclInit: OPSERVER_ADDRESS=", pool_,
                                     ": claiming 4 devices under etcd prefix "
                                     "/ops/pool/: 3 registered, 3 free")));
  setenv("OPSERVER_CLAIM", "two", 1);
  EXPECT_EQ(aclInit(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()),
              HasSubstr("OPSERVER_CLAIM='two': not a device count"));
  unsetenv("OPSERVER_CLAIM");
  setenv("OPSERVER_ADDRESS", "etcd://127.0.0.1:2379", 1);
  EXPECT_EQ(aclInit(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(std::string(aclGetRecentErrMsg()), HasSubstr("no /PREFIX"));
  unsetenv("OPSERVER_ADDRESS");
}

TEST_F(EtcdPoolTest, TheCApisClaimLeaseTakesOpserverClaimTtlS) {
  auto a = StartServer({"--devices=2"});
  ASSERT_TRUE(a.ok()) << a.status();
  setenv("OPSERVER_ADDRESS", pool_.c_str(), 1);
  setenv("OPSERVER_CLAIM", "1", 1);
  // The lease's TTL is what a keep-alive renews it to.
  auto claim_ttl = [&]() -> int64_t {
    std::unique_ptr<EtcdClient> etcd = Etcd();
    auto claims = etcd->List("/ops/pool/claims/");
    if (!claims.ok() || claims->size() != 1) return -1;
    absl::StatusOr<int64_t> ttl = etcd->KeepAlive((*claims)[0].lease);
    return ttl.ok() ? *ttl : -1;
  };
  for (const char* ttl : {"", "7"}) {
    setenv("OPSERVER_CLAIM_TTL_S", ttl, 1);
    ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS) << aclGetRecentErrMsg();
    EXPECT_EQ(claim_ttl(), *ttl == '\0' ? 10 : 7);  // Unset: 10 s.
    ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  }
  for (const char* bad : {"0", "-5", "1", "86401", "ten", "3s"}) {
    setenv("OPSERVER_CLAIM_TTL_S", bad, 1);
    EXPECT_EQ(aclInit(nullptr), ACL_ERROR_INVALID_PARAM) << bad;
    EXPECT_THAT(std::string(aclGetRecentErrMsg()),
                HasSubstr(absl::StrCat("OPSERVER_CLAIM_TTL_S='", bad,
                                       "': not a lease TTL in seconds "
                                       "(2 to 86400)")));
  }
  unsetenv("OPSERVER_CLAIM_TTL_S");
  unsetenv("OPSERVER_CLAIM");
  unsetenv("OPSERVER_ADDRESS");
  // Nothing was claimed by the refused ones.
  EXPECT_TRUE(ResolvePool(pool_, Claim(2)).ok());
}

// opctl's output and exit status for `args`, with `env` ("NAME=VALUE ")
// before it; stderr joins stdout.
int RunOpctl(const std::string& env, const std::string& args,
             std::string* output) {
  const std::string command =
      absl::StrCat(env, " '", g_opctl, "' ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  output->clear();
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), pipe)) > 0)
    output->append(chunk, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_F(EtcdPoolTest, OpctlTakesAnEtcdAddressWithTheCApisOrdinals) {
  auto a = StartServer({"--devices=2"});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = StartServer();
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<std::string> expected =
      Expected({{a->address, 2}, {b->address, 1}});
  const std::string server = "--server=" + pool_;
  std::string out;
  ASSERT_EQ(RunOpctl("", server + " info", &out), 0) << out;
  EXPECT_THAT(out,
              HasSubstr(absl::StrCat("pool:     ", pool_, ", 3 devices\n")));
  for (size_t i = 0; i < expected.size(); ++i) {
    const size_t slash = expected[i].rfind('/');
    EXPECT_THAT(out, HasSubstr(absl::StrCat(
                         "device ", i, ": ", expected[i].substr(0, slash),
                         " device ", expected[i].substr(slash + 1), ": cpu (")))
        << out;
  }
  // --device is the ordinal: whichever server sorts first, ordinals 1 and
  // 2 are device indexes that a wrong mapping would send where the server
  // has no such device.
  for (const char* device : {"1", "2"}) {
    ASSERT_EQ(RunOpctl("",
                       absl::StrCat(server, " run ThresholdBackward",
                                    " --device=", device,
                                    " --threshold=1 --gradOutput=4.5,4.4"
                                    " --self=0.2,1.2"),
                       &out),
              0)
        << out;
    EXPECT_THAT(out, HasSubstr("out = [0, 4.4]"));
  }
  EXPECT_EQ(RunOpctl("",
                     server + " run ThresholdBackward --device=3"
                              " --gradOutput=1 --self=1",
                     &out),
            1);
  EXPECT_THAT(out, HasSubstr(absl::StrCat("--device=3: the pool ", pool_,
                                          " has 3 devices (opctl info lists "
                                          "them)")));
  ASSERT_EQ(RunOpctl("", server + " stats", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("server:       " + a->address + "\n"));
  EXPECT_THAT(out, HasSubstr("server:       " + b->address + "\n"));
  ASSERT_EQ(RunOpctl("", server + " ops", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("ThresholdBackward (aclnnThresholdBackward)"));

  // OPSERVER_CLAIM: exactly the claimed devices, held while opctl runs.
  ASSERT_EQ(RunOpctl("OPSERVER_CLAIM=2", server + " info", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("pool:     ", pool_,
                                          ", 2 devices (claimed)\n")));
  EXPECT_THAT(out, Not(HasSubstr("device 2:")));
  // Released when it exits: all three can be claimed again.
  EXPECT_TRUE(ResolvePool(pool_, Claim(3)).ok());
  EXPECT_EQ(RunOpctl("OPSERVER_CLAIM=4", server + " info", &out), 1);
  EXPECT_THAT(out, HasSubstr("claiming 4 devices under etcd prefix "
                             "/ops/pool/: 3 registered, 3 free"));
  EXPECT_EQ(RunOpctl("OPSERVER_CLAIM_TTL_S=1", server + " info", &out), 1);
  EXPECT_THAT(out, HasSubstr("OPSERVER_CLAIM_TTL_S='1': not a lease TTL in "
                             "seconds (2 to 86400)"));
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  return opserver::test_main::RunWithPaths(
      argc, argv,
      {{"OPSERVER", &opserver::g_opserver}, {"OPCTL", &opserver::g_opctl}});
}
