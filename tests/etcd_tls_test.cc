// etcd's TLS, run for real (docs/pool.md, "etcd's security"): Debian's etcd
// serving its clients over TLS only, with throwaway certificates made under
// TEST_TMPDIR by tests/gen_certs.sh; a server registers through
// --register=etcd://... with --etcd_ca_file (and a client certificate when
// etcd asks for one), a program finds it through
// OPSERVER_ADDRESS=etcd://... with OPSERVER_ETCD_CA_FILE (and
// OPSERVER_ETCD_CERT_FILE/KEY_FILE) and launches an operator on it. And the
// errors, each with gRPC's code and etcd's endpoint: a CA that did not sign
// etcd's certificate, plaintext to a TLS etcd, no client certificate or
// one of another CA when etcd requires one, and unreadable or half-given
// credential files.
//
// Arguments: the opserver binary.

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "acl/acl.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "client/etcd_pool.h"
#include "common/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/etcd_process.h"
#include "testing/opserver_process.h"
#include "testing/test_main.h"

namespace opserver {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string g_opserver;  // argv[1]

std::string CertDir() { return absl::StrCat(getenv("TEST_TMPDIR"), "/certs"); }
std::string Pem(const std::string& name) {
  return absl::StrCat(CertDir(), "/", name, ".pem");
}
std::string Key(const std::string& name) {
  return absl::StrCat(CertDir(), "/", name, ".key");
}

// Trusting `ca`'s certificates, presenting `client`'s when set.
EtcdCredentials Trusting(const std::string& ca,
                         const std::string& client = "") {
  EtcdCredentials credentials;
  credentials.ca_file = Pem(ca);
  if (!client.empty()) {
    credentials.cert_file = Pem(client);
    credentials.key_file = Key(client);
  }
  return credentials;
}

// The handshake's own words when the CA does not vouch for etcd's
// certificate (after etcd's endpoint, the call and the code).
constexpr char kUntrustedServer[] =
    "Ssl handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
    "routines::certificate verify failed";
// When etcd refuses the client's certificate, or its lack of one, gRPC
// sees only a connection closed after the handshake ("Endpoint read
// failed"): the message says which TLS settings were used and what such
// an etcd does.
std::string TlsNote(const std::string& ca, const std::string& client = "") {
  return client.empty()
             ? absl::StrCat("; TLS with the CA file '", Pem(ca),
                            "' and no client certificate (an etcd with "
                            "--client-cert-auth closes such connections)")
             : absl::StrCat("; TLS with the CA file '", Pem(ca),
                            "' and the client certificate '", Pem(client),
                            "' (an etcd with --client-cert-auth closes the "
                            "connection when its --trusted-ca-file did not "
                            "sign it)");
}

// What a plaintext client is told when etcd serves TLS only.
constexpr char kPlaintextNote[] =
    "; plaintext (an etcd that serves TLS closes such "
    "connections; its CA goes in OPSERVER_ETCD_CA_FILE or --etcd_ca_file)";

// `text` as the server's log writes it (quotes escaped).
std::string Logged(const std::string& text) {
  return absl::StrReplaceAll(text, {{"'", "\\'"}});
}

class EtcdTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A CA, etcd's certificate for 127.0.0.1 signed by it, client
    // certificates, and an unrelated CA with a client of its own.
    const std::string command = "tests/gen_certs.sh " + CertDir();
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }

  void TearDown() override {
    aclFinalize();  // After a failure between aclInit and aclFinalize.
    for (pid_t pid : servers_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    process::StopEtcd(etcd_);
    for (const char* name :
         {"OPSERVER_ADDRESS", "OPSERVER_ETCD_CA_FILE",
          "OPSERVER_ETCD_CERT_FILE", "OPSERVER_ETCD_KEY_FILE"}) {
      unsetenv(name);
    }
  }

  // etcd over TLS with the server certificate of tests/gen_certs.sh's CA;
  // requiring a client certificate of that CA when `client_certificates`.
  void StartTlsEtcd(bool client_certificates) {
    dir_ = absl::StrCat(
        getenv("TEST_TMPDIR"), "/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(system(("mkdir -p " + dir_).c_str()), 0);
    process::EtcdTls tls;
    tls.cert_file = Pem("server");
    tls.key_file = Key("server");
    tls.probe = Trusting("ca", client_certificates ? "client" : "");
    if (client_certificates) tls.client_ca_file = Pem("ca");
    absl::StatusOr<process::EtcdProcess> etcd = process::StartEtcd(dir_, tls);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *etcd;
    pool_ = absl::StrCat("etcd://", etcd_.endpoint, "/ops/pool");
  }

  process::OpserverLaunch Launch(std::vector<std::string> flags) {
    process::OpserverLaunch launch;
    launch.binary = g_opserver;
    launch.flags = {"--threads=1", "--register=" + pool_};
    launch.flags.insert(launch.flags.end(), flags.begin(), flags.end());
    const std::string name = absl::StrCat(dir_, "/server", launches_++);
    launch.out_path = name + ".out";
    launch.err_path = name + ".err";
    return launch;
  }

  // An opserver registered in the pool with `flags` (its etcd options).
  absl::StatusOr<process::OpserverProcess> StartServer(
      std::vector<std::string> flags) {
    absl::StatusOr<process::OpserverProcess> server =
        process::StartOpserver(Launch(std::move(flags)));
    if (server.ok()) servers_.push_back(server->pid);
    return server;
  }

  // A server with `flags` that must exit at start with the usage status;
  // its one error line, which is its last (gRPC's own lines about a failed
  // handshake may come before it).
  std::string RefusedServer(std::vector<std::string> flags) {
    const process::OpserverLaunch launch = Launch(std::move(flags));
    absl::StatusOr<process::OpserverProcess> server =
        process::StartOpserver(launch);
    if (server.ok()) {
      servers_.push_back(server->pid);
      ADD_FAILURE() << "the server started";
      return "";
    }
    // waitpid's status of exit(2), opserver's usage error
    // (common/cli_flags.h).
    EXPECT_THAT(server.status().message(),
                HasSubstr(absl::StrCat("exited before listening (status ",
                                       2 << 8, ")")));
    const std::string err = process::ReadFile(launch.err_path);
    const std::vector<std::string> lines =
        absl::StrSplit(absl::StripSuffix(err, "\n"), '\n');
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
      EXPECT_THAT(lines[i], HasSubstr(" opserver: grpc ")) << err;
    }
    EXPECT_THAT(lines.back(), HasSubstr(" opserver: error: --register: "));
    return lines.back();
  }

  // How every refused connection to this etcd is reported, up to gRPC's
  // own words: "etcd at 127.0.0.1:PORT (`call`): UNAVAILABLE: failed to
  // connect to all addresses; last error: ".
  std::string Unavailable(const char* call) const {
    return absl::StrCat("etcd at ", etcd_.endpoint, " (", call,
                        "): UNAVAILABLE: failed to connect to all addresses; "
                        "last error: ");
  }

  // The refusal of a connection whose handshake failed here, with
  // gRPC's words.
  std::string HandshakeFailed(const char* call, const std::string& words,
                              const std::string& note) const {
    return absl::StrCat(Unavailable(call), "UNKNOWN: ipv4:", etcd_.endpoint,
                        ": ", words, note);
  }

  // A message's part before gRPC's transport words, for connections etcd
  // closed after the handshake (gRPC reads that as a failed read, or a
  // closed socket, depending on timing).
  std::string ClosedByEtcd(const char* call) const {
    return absl::StrCat(Unavailable(call), "UNAVAILABLE: ipv4:", etcd_.endpoint,
                        ": ");
  }

  // The C API's aclInit with OPSERVER_ADDRESS=pool_ and `env` (the etcd
  // variables).
  aclError Init(const std::vector<std::pair<const char*, std::string>>& env) {
    setenv("OPSERVER_ADDRESS", pool_.c_str(), 1);
    for (const auto& [name, value] : env) setenv(name, value.c_str(), 1);
    return aclInit(nullptr);
  }

  std::string dir_;
  process::EtcdProcess etcd_;
  std::string pool_;
  std::vector<pid_t> servers_;
  int launches_ = 0;
};

aclTensor* Tensor(void* data, int64_t n) {
  const int64_t shape[] = {n};
  return aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, shape,
                         1, data);
}

void* Device(const std::vector<float>& values) {
  void* data = nullptr;
  const size_t bytes = values.size() * sizeof(float);
  EXPECT_EQ(aclrtMalloc(&data, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  EXPECT_EQ(
      aclrtMemcpy(data, bytes, values.data(), bytes, ACL_MEMCPY_HOST_TO_DEVICE),
      ACL_SUCCESS)
      << aclGetRecentErrMsg();
  return data;
}

// After a successful aclInit on a pool of one device: ThresholdBackward on
// it (gradOutput where self > 1, else 0), read back, then aclFinalize.
void LaunchOnTheOnlyDevice() {
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  ASSERT_EQ(count, 1u);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << aclGetRecentErrMsg();
  void* grad = Device({4.5f, 4.4f});
  void* self = Device({0.2f, 1.2f});
  void* out = Device({-1.0f, -1.0f});
  aclTensor* g = Tensor(grad, 2);
  aclTensor* s = Tensor(self, 2);
  aclTensor* o = Tensor(out, 2);
  float threshold = 1.0f;
  aclScalar* t = aclCreateScalar(&threshold, ACL_FLOAT);
  uint64_t workspace = 0;
  aclOpExecutor* executor = nullptr;
  ASSERT_EQ(
      aclnnThresholdBackwardGetWorkspaceSize(g, s, t, o, &workspace, &executor),
      ACL_SUCCESS)
      << aclGetRecentErrMsg();
  ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, executor, nullptr), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << aclGetRecentErrMsg();
  std::vector<float> result(2);
  ASSERT_EQ(aclrtMemcpy(result.data(), 8, out, 8, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS)
      << aclGetRecentErrMsg();
  EXPECT_EQ(result, (std::vector<float>{0.0f, 4.4f}));
  aclDestroyTensor(g);
  aclDestroyTensor(s);
  aclDestroyTensor(o);
  aclDestroyScalar(t);
  for (void* p : {grad, self, out}) EXPECT_EQ(aclrtFree(p), ACL_SUCCESS);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
}

TEST_F(EtcdTlsTest, AServerRegistersOverTlsAndAProgramFindsItAndLaunches) {
  ASSERT_NO_FATAL_FAILURE(StartTlsEtcd(/*client_certificates=*/false));
  absl::StatusOr<process::OpserverProcess> server =
      StartServer({"--etcd_ca_file=" + Pem("ca")});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<PoolResolution> pool = ResolvePool(pool_, {}, Trusting("ca"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->devices.size(), 1u);
  EXPECT_EQ(pool->devices[0].address, server->address);
  ASSERT_EQ(Init({{"OPSERVER_ETCD_CA_FILE", Pem("ca")}}), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  LaunchOnTheOnlyDevice();
}

TEST_F(EtcdTlsTest, WithClientCertificatesBothEndsPresentTheirs) {
  ASSERT_NO_FATAL_FAILURE(StartTlsEtcd(/*client_certificates=*/true));
  absl::StatusOr<process::OpserverProcess> server = StartServer(
      {"--etcd_ca_file=" + Pem("ca"), "--etcd_cert_file=" + Pem("client"),
       "--etcd_key_file=" + Key("client")});
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<PoolResolution> pool =
      ResolvePool(pool_, {}, Trusting("ca", "client2"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->devices.size(), 1u);
  EXPECT_EQ(pool->devices[0].address, server->address);
  ASSERT_EQ(Init({{"OPSERVER_ETCD_CA_FILE", Pem("ca")},
                  {"OPSERVER_ETCD_CERT_FILE", Pem("client2")},
                  {"OPSERVER_ETCD_KEY_FILE", Key("client2")}}),
            ACL_SUCCESS)
      << aclGetRecentErrMsg();
  LaunchOnTheOnlyDevice();
}

// The server's error line without its timestamp.
std::string Untimed(const std::string& line) {
  const size_t at = line.find(" opserver: ");
  return at == std::string::npos ? line : line.substr(at + 11);
}

TEST_F(EtcdTlsTest, ACaThatDidNotSignEtcdsCertificateIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartTlsEtcd(/*client_certificates=*/false));
  absl::StatusOr<PoolResolution> pool =
      ResolvePool(pool_, {}, Trusting("other_ca"));
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pool.status().message(),
            HandshakeFailed("Range", kUntrustedServer, TlsNote("other_ca")));

  EXPECT_EQ(Untimed(RefusedServer({"--etcd_ca_file=" + Pem("other_ca")})),
            Logged("error: --register: " +
                   HandshakeFailed("LeaseGrant", kUntrustedServer,
                                   TlsNote("other_ca"))));

  EXPECT_EQ(Init({{"OPSERVER_ETCD_CA_FILE", Pem("other_ca")}}),
            ACL_ERROR_RT_FAILURE);
  EXPECT_EQ(std::string(aclGetRecentErrMsg()),
            absl::StrCat("aclInit: OPSERVER_ADDRESS=", pool_, ": ",
                         HandshakeFailed("Range", kUntrustedServer,
                                         TlsNote("other_ca"))));
}

TEST_F(EtcdTlsTest, PlaintextToATlsEtcdIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartTlsEtcd(/*client_certificates=*/false));
  absl::StatusOr<PoolResolution> pool = ResolvePool(pool_);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(pool.status().message()),
              StartsWith(ClosedByEtcd("Range")));
  EXPECT_THAT(std::string(pool.status().message()), EndsWith(kPlaintextNote));
  const std::string err = Untimed(RefusedServer({}));
  EXPECT_THAT(err,
              StartsWith("error: --register: " + ClosedByEtcd("LeaseGrant")));
  EXPECT_THAT(err, EndsWith(Logged(kPlaintextNote)));
}

TEST_F(EtcdTlsTest, EtcdRequiringAClientCertificateRefusesOthers) {
  ASSERT_NO_FATAL_FAILURE(StartTlsEtcd(/*client_certificates=*/true));
  // None, and one signed by a CA etcd does not trust.
  for (const std::string& client :
       {std::string(), std::string("other_client")}) {
    SCOPED_TRACE(client);
    absl::StatusOr<PoolResolution> pool =
        ResolvePool(pool_, {}, Trusting("ca", client));
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(pool.status().message()),
                StartsWith(ClosedByEtcd("Range")));
    EXPECT_THAT(std::string(pool.status().message()),
                EndsWith(TlsNote("ca", client)));
  }
  const std::string err =
      Untimed(RefusedServer({"--etcd_ca_file=" + Pem("ca")}));
  EXPECT_THAT(err,
              StartsWith("error: --register: " + ClosedByEtcd("LeaseGrant")));
  EXPECT_THAT(err, EndsWith(Logged(TlsNote("ca"))));

  EXPECT_EQ(Init({{"OPSERVER_ETCD_CA_FILE", Pem("ca")},
                  {"OPSERVER_ETCD_CERT_FILE", Pem("other_client")},
                  {"OPSERVER_ETCD_KEY_FILE", Key("other_client")}}),
            ACL_ERROR_RT_FAILURE);
  const std::string message = aclGetRecentErrMsg();
  EXPECT_THAT(message,
              StartsWith(absl::StrCat("aclInit: OPSERVER_ADDRESS=", pool_, ": ",
                                      ClosedByEtcd("Range"))));
  EXPECT_THAT(message, EndsWith(TlsNote("ca", "other_client")));
}

TEST_F(EtcdTlsTest, UnreadableOrHalfGivenCredentialFilesAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartTlsEtcd(/*client_certificates=*/true));
  const std::string missing = dir_ + "/missing.pem";
  EtcdCredentials half = Trusting("ca");
  half.cert_file = Pem("client");
  const struct {
    EtcdCredentials credentials;
    std::string message;
  } cases[] = {
      {{missing}, "etcd CA file '" + missing + "' cannot be read"},
      {half,
       "etcd: a client certificate needs both its certificate and key files"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<PoolResolution> pool = ResolvePool(pool_, {}, c.credentials);
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pool.status().message(), HasSubstr(c.message));
  }
  EXPECT_EQ(Untimed(RefusedServer({"--etcd_ca_file=" + missing})),
            Logged("error: --register: etcd CA file '" + missing +
                   "' cannot be read"));
  EXPECT_EQ(Untimed(RefusedServer({"--etcd_ca_file=" + Pem("ca"),
                                   "--etcd_cert_file=" + Pem("client")})),
            "error: --register: etcd: a client certificate needs both its "
            "certificate and key files");
  EXPECT_EQ(Init({{"OPSERVER_ETCD_CA_FILE", missing}}),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(
      std::string(aclGetRecentErrMsg()),
      HasSubstr(absl::StrCat("aclInit: OPSERVER_ADDRESS=", pool_,
                             ": etcd CA file '", missing, "' cannot be read")));
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  return opserver::test_main::RunWithPaths(
      argc, argv, {{"OPSERVER", &opserver::g_opserver}});
}
