// A server's registration in etcd (--register=etcd://HOST:PORT/PREFIX;
// docs/pool.md): one key per device under PREFIX/devices/, bound to a lease
// the server keeps alive, so that clients find the server's devices while it
// runs and lose them when it drains, exits or dies (the lease expires
// --register_ttl_s after the last renewal).
//
//   auto registration = EtcdRegistration::Start(options, describe);
//   ...                              // renewed on its own thread
//   (*registration)->Withdraw();     // drain or exit: the keys go now
//
// Losing etcd later does not stop the server: the thread says so once on
// the log, retries with backoff (from half a second up to the TTL), and on
// reaching etcd again takes a new lease and writes the keys again, saying
// so too. /metrics follows it (opserver_registration_up,
// opserver_registration_failures_total).
#ifndef OPSERVER_SERVER_ETCD_REGISTRATION_H_
#define OPSERVER_SERVER_ETCD_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/etcd_address.h"
#include "common/etcd_client.h"
#include "proto/pool.pb.h"
#include "server/server.h"

namespace opserver {

struct RegistrationOptions {
  EtcdAddress etcd;
  EtcdCredentials credentials;
  // HOST:PORT clients dial to reach this server (--register_address, or
  // the listen address).
  std::string address;
  // The lease's time to live, in seconds (--register_ttl_s).
  int ttl_s = 10;
  // Called after the first registration and after each later attempt to
  // renew or redo it, with whether it succeeded (the server's /metrics);
  // on the registration's thread. May be empty.
  std::function<void(bool succeeded)> attempted;
};

class EtcdRegistration {
 public:
  // The devices as they are now (free memory, draining), device i at index
  // i; called on the registration's thread.
  using Describe = std::function<std::vector<pool::v1::RegisteredDevice>()>;

  // Takes a lease and writes every device's key. etcd's error (UNAVAILABLE
  // naming the endpoint) when it cannot be reached now: a server that is
  // to be found must not start unfound.
  static absl::StatusOr<std::unique_ptr<EtcdRegistration>> Start(
      const RegistrationOptions& options, Describe describe);

  ~EtcdRegistration();  // Withdraw().
  EtcdRegistration(const EtcdRegistration&) = delete;
  EtcdRegistration& operator=(const EtcdRegistration&) = delete;

  // Stops renewing and revokes the lease, which deletes the keys (a
  // revocation etcd does not get lets them expire). Idempotent.
  void Withdraw();

  // Whether the keys are in etcd as far as the last renewal knows.
  bool registered() const;

 private:
  EtcdRegistration(RegistrationOptions options, Describe describe,
                   std::unique_ptr<EtcdClient> etcd)
      : options_(std::move(options)),
        describe_(std::move(describe)),
        etcd_(std::move(etcd)) {}

  // A new lease and every key bound to it.
  absl::Status Register();
  // Writes every device's key under `lease`.
  absl::Status WriteKeys(int64_t lease);
  void Run();

  const RegistrationOptions options_;
  const Describe describe_;
  const std::unique_ptr<EtcdClient> etcd_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool withdrawn_ ABSL_GUARDED_BY(mu_) = false;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none held.
};

// main()'s flags for the registration, as given.
struct RegisterFlags {
  std::string etcd;     // --register
  int ttl_s = 10;       // --register_ttl_s
  std::string address;  // --register_address
  std::string ca_file;  // --etcd_ca_file, --etcd_cert_file, --etcd_key_file
  std::string cert_file;
  std::string key_file;
  std::string user;           // --etcd_user
  std::string password_file;  // --etcd_password_file
};

// Registers `server`'s devices as the flags ask: its kind, name, capacity,
// free memory and drain state, under the address clients dial.
// INVALID_ARGUMENT naming the flag for a bad one; etcd's error when it
// cannot be reached.
// Each attempt is counted in the server's /metrics when it has them.
absl::StatusOr<std::unique_ptr<EtcdRegistration>> RegisterServer(
    const RegisterFlags& flags, Server& server);

}  // namespace opserver

#endif  // OPSERVER_SERVER_ETCD_REGISTRATION_H_
