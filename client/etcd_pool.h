// The client's side of a pool in etcd (OPSERVER_ADDRESS=etcd://HOST:PORT/
// PREFIX; docs/pool.md): the devices servers registered (--register), in a
// stable order, and claims that give a job devices no other job holds.
//
//   auto pool = ResolvePool("etcd://127.0.0.1:2379/ops", {.count = 2});
//   for (const PoolDevice& d : pool->devices) ...  // exactly the 2 claimed
//   // pool->claim keeps them; destroying it (or the job's death) frees them
//
// A claim is one etcd transaction that creates /PREFIX/claims/ADDRESS/INDEX
// for every chosen device if none of them exists yet, bound to the job's
// own lease: of two jobs that choose the same free device at once, one
// transaction fails and that job chooses again. The lease is renewed on a
// thread every third of its TTL; when the job exits the lease is revoked,
// when it dies the lease expires and the claims go with it.
#ifndef OPSERVER_CLIENT_ETCD_POOL_H_
#define OPSERVER_CLIENT_ETCD_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/etcd_address.h"
#include "common/etcd_client.h"
#include "proto/pool.pb.h"

namespace opserver {

struct PoolDevice {
  std::string address;  // The server, HOST:PORT.
  uint32_t device = 0;  // Its index on that server.
  pool::v1::RegisteredDevice info;
};

// Everything under the prefix, checked: registered devices in key order
// (address, then index) and the keys of those claimed.
struct PoolListing {
  std::vector<PoolDevice> devices;
  std::vector<std::string> claimed;  // Claim keys, in key order.
};

// Reads and checks the prefix. A key under it that opserver does not write,
// or a registration that does not parse or names another device than its
// key, is FAILED_PRECONDITION naming the key: the prefix is shared with
// another program, and what it holds cannot be trusted as devices.
absl::StatusOr<PoolListing> ReadPool(EtcdClient& etcd,
                                     const EtcdAddress& address);

struct ClaimOptions {
  // Devices to claim; 0: no claim, every registered device is the job's.
  uint32_t count = 0;
  // How long to wait for enough free devices (OPSERVER_CLAIM_WAIT_S);
  // zero: fail at once.
  absl::Duration wait = absl::ZeroDuration();
  // The claim lease's time to live: how long a dead job's claims last
  // (OPSERVER_CLAIM_TTL_S).
  int ttl_s = 10;
  // Called each time the claim found too few free devices and waits, for
  // tests that must act only once it waits.
  std::function<void()> waiting;
};

// A job's claim; it lasts until destroyed.
class PoolClaim {
 public:
  ~PoolClaim();  // Revokes the lease: the devices are free again.
  PoolClaim(const PoolClaim&) = delete;
  PoolClaim& operator=(const PoolClaim&) = delete;

  // Stops renewing without revoking, as a job that died: the claims stay
  // until the lease expires. For tests of that expiry.
  void AbandonForTest();

 private:
  friend absl::StatusOr<std::unique_ptr<PoolClaim>> ClaimDevices(
      std::shared_ptr<EtcdClient>, const EtcdAddress&, const ClaimOptions&,
      std::vector<PoolDevice>*);
  PoolClaim(std::shared_ptr<EtcdClient> etcd, int64_t lease, int ttl_s)
      : etcd_(std::move(etcd)), lease_(lease), ttl_s_(ttl_s) {}
  void Renew();
  void Stop(bool revoke);

  const std::shared_ptr<EtcdClient> etcd_;
  const int64_t lease_;
  const int ttl_s_;
  std::thread thread_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// Claims `options.count` free devices (registered, not draining, not
// claimed) and stores them in `claimed`, the first free ones in key order.
// RESOURCE_EXHAUSTED saying how many are registered, free and asked for
// when too few are free once `options.wait` has passed.
absl::StatusOr<std::unique_ptr<PoolClaim>> ClaimDevices(
    std::shared_ptr<EtcdClient> etcd, const EtcdAddress& address,
    const ClaimOptions& options, std::vector<PoolDevice>* claimed);

// The devices a job gets from an etcd:// address: every registered device
// (count 0), or the ones it claimed, with the claim that holds them.
struct PoolResolution {
  std::vector<PoolDevice> devices;
  std::unique_ptr<PoolClaim> claim;
};
// INVALID_ARGUMENT for a malformed address, etcd's error (its gRPC code,
// naming the endpoint) when it cannot be reached, NOT_FOUND when no device
// is registered, and ReadPool's and ClaimDevices' errors.
absl::StatusOr<PoolResolution> ResolvePool(
    const std::string& address, const ClaimOptions& options = {},
    const EtcdCredentials& credentials = {});

// The bounds of a claim's settings, the same from every surface.
inline constexpr int64_t kMaxClaim = 4096;
inline constexpr int64_t kMaxClaimWaitS = 7 * 24 * 3600;
// etcd rounds a shorter lease up to its own minimum; one renewed every
// third of its TTL needs whole seconds to spare.
inline constexpr int64_t kMinClaimTtlS = 2;
inline constexpr int64_t kMaxClaimTtlS = 24 * 3600;

// Check one setting and store it in `options`; INVALID_ARGUMENT starting
// with `shown` (how the caller spelled it: "OPSERVER_CLAIM='x'",
// "claim=-1") and giving the range. Every surface (the environment,
// Python's connect, opctl) sets claims through these.
absl::Status SetClaimCount(int64_t count, absl::string_view shown,
                           ClaimOptions* options);
absl::Status SetClaimWait(double seconds, absl::string_view shown,
                          ClaimOptions* options);
absl::Status SetClaimTtl(int64_t seconds, absl::string_view shown,
                         ClaimOptions* options);

// ClaimOptions from OPSERVER_CLAIM (a count), OPSERVER_CLAIM_WAIT_S
// (seconds) and OPSERVER_CLAIM_TTL_S (the claim lease's seconds, default
// 10), but for the variables named in `skip` (set another way);
// INVALID_ARGUMENT naming the variable for a malformed value.
absl::StatusOr<ClaimOptions> ClaimOptionsFromEnv(
    const std::vector<std::string>& skip = {});
// EtcdCredentials from OPSERVER_ETCD_CA_FILE, OPSERVER_ETCD_CERT_FILE,
// OPSERVER_ETCD_KEY_FILE, OPSERVER_ETCD_USER and OPSERVER_ETCD_PASSWORD.
EtcdCredentials EtcdCredentialsFromEnv();

}  // namespace opserver

#endif  // OPSERVER_CLIENT_ETCD_POOL_H_
