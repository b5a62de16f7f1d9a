// The devices of several opservers as one list of ordinals, the way the C
// API reads OPSERVER_ADDRESS=host1:port,host2:port (and remote-GPU systems
// map many hosts: rCUDA's per-device hosts, ggml-rpc's server list): the
// ordinals count each server's devices in the order the servers are listed.
// Each server has its own Client (its own channel, health and name
// resolution, e.g. "dns:///host:port"); a session is opened on one ordinal
// and runs on that server's device.
//
//   auto devices = DeviceSet::Connect({"10.0.0.1:50051", "10.0.0.2:50051"});
//   for (uint32_t d = 0; d < (*devices)->size(); ++d) {
//     auto session = (*devices)->CreateSession(d, "trainer");
//     ...  // (*session)->Malloc(...), launches, as with one server
//   }
#ifndef OPSERVER_CLIENT_DEVICE_SET_H_
#define OPSERVER_CLIENT_DEVICE_SET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/etcd_pool.h"
#include "proto/opserver.pb.h"

namespace opserver {
namespace remote {

class DeviceSet {
 public:
  // One ordinal: device `local` of server `server` (an index into the
  // address list).
  struct Device {
    size_t server = 0;
    uint32_t local = 0;
    v1::DeviceInfo info;
  };

  // "host1:port,host2:port" as a list; INVALID_ARGUMENT for an empty entry.
  static absl::StatusOr<std::vector<std::string>> ParseAddresses(
      absl::string_view list);

  // Connects to every server (each with `options`) and lists its devices.
  // The first server that cannot be reached fails the call, naming it: the
  // ordinals after its devices could not be known.
  static absl::StatusOr<std::unique_ptr<DeviceSet>> Connect(
      const std::vector<std::string>& addresses,
      const ConnectOptions& options = {});

  // What OPSERVER_ADDRESS names: a list as above, or
  // etcd://HOST:PORT/PREFIX, whose ordinals are the devices registered
  // there in key order (server address, then index), or with `claim.count`
  // exactly the devices claimed, held until the set is destroyed
  // (client/etcd_pool.h; ResolvePool's errors).
  static absl::StatusOr<std::unique_ptr<DeviceSet>> ConnectAddress(
      const std::string& address, const ConnectOptions& options = {},
      const ClaimOptions& claim = {}, const EtcdCredentials& etcd = {});

  size_t size() const { return devices_.size(); }
  const std::vector<std::string>& addresses() const { return addresses_; }
  // INVALID_ARGUMENT (naming the count) past the last ordinal.
  absl::StatusOr<Device> device(uint32_t ordinal) const;

  // A session on device `ordinal`, on its server's current client. It must
  // not outlive this set. Errors of an unreachable server name it.
  absl::StatusOr<std::unique_ptr<Session>> CreateSession(
      uint32_t ordinal, const std::string& client_name, bool attach = true);

  // A new connection to the server of `ordinal`, for a server that went
  // away and is back (the old channel may be waiting out its reconnection
  // backoff). Sessions made before keep their old client, which stays
  // alive with this set; they are the lost server's and fail.
  absl::Status Reconnect(uint32_t ordinal);

  // Ends the etcd claim now rather than with the set (a Python pool's
  // close()): its devices are free for other jobs, sessions already open
  // go on. A no-op without a claim.
  void ReleaseClaim();

 private:
  DeviceSet(std::vector<std::string> addresses, ConnectOptions options)
      : addresses_(std::move(addresses)), options_(std::move(options)) {}

  // Connects to every server and keeps device `pool[i].device` of server
  // `pool[i].address` as ordinal i.
  static absl::StatusOr<std::unique_ptr<DeviceSet>> ConnectPool(
      PoolResolution pool, const ConnectOptions& options);

  const std::vector<std::string> addresses_;
  const ConnectOptions options_;
  // The etcd claim on the devices, if any: released with the set.
  std::vector<Device> devices_;  // Fixed at Connect.
  mutable absl::Mutex mu_;
  std::unique_ptr<PoolClaim> claim_ ABSL_GUARDED_BY(mu_);
  // The current client of each server; every client ever made stays alive
  // (sessions point at theirs).
  std::vector<std::shared_ptr<Client>> clients_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Client>> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_DEVICE_SET_H_
