// etcd://HOST:PORT[,HOST:PORT...]/PREFIX, the address of a pool of
// opservers registered in etcd (docs/pool.md): the server's --register and
// the clients' OPSERVER_ADDRESS take it. One parser for both ends, and the
// key layout under PREFIX that both ends write and read:
//
//   /PREFIX/devices/ADDRESS/INDEX   a server's device (pool.v1.RegisteredDevice
//                                   as JSON), bound to the server's lease
//   /PREFIX/claims/ADDRESS/INDEX    a job's claim on that device, bound to
//                                   the job's lease
//
// INDEX is the device index in five decimal digits, so that etcd's key order
// is the order of (address, index): the device ordinals clients hand out.
#ifndef OPSERVER_COMMON_ETCD_ADDRESS_H_
#define OPSERVER_COMMON_ETCD_ADDRESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace opserver {

struct EtcdAddress {
  // etcd's client endpoints, HOST:PORT each, in the order given.
  std::vector<std::string> endpoints;
  // The key prefix without slashes at either end, e.g. "opserver/pool1".
  std::string prefix;

  // "/PREFIX/" : every key opserver writes starts with it.
  std::string Root() const;
  std::string DevicesRoot() const;  // "/PREFIX/devices/"
  std::string ClaimsRoot() const;   // "/PREFIX/claims/"
  // "/PREFIX/devices/ADDRESS/00003" and the claim key of the same device.
  std::string DeviceKey(absl::string_view address, uint32_t device) const;
  std::string ClaimKey(absl::string_view address, uint32_t device) const;
};

// Whether `text` starts with "etcd://" (so it is meant as a pool address,
// and parse errors are its errors rather than a HOST:PORT's).
bool IsEtcdAddress(absl::string_view text);

// Parses etcd://HOST:PORT[,HOST:PORT...]/PREFIX. HOST is a name, an IPv4
// address or [IPV6]; PORT 1..65535. PREFIX is one or more segments of
// letters, digits, '.', '_' and '-' separated by single '/'. INVALID_ARGUMENT
// naming what is wrong, with the expected form.
absl::StatusOr<EtcdAddress> ParseEtcdAddress(absl::string_view text);

// The device a key under EtcdAddress::DevicesRoot() or ClaimsRoot() names:
// `rest` is the part after that root ("ADDRESS/00003"). INVALID_ARGUMENT
// for anything else.
struct DeviceKeyParts {
  std::string address;
  uint32_t device = 0;
};
absl::StatusOr<DeviceKeyParts> ParseDeviceKeyRest(absl::string_view rest);

}  // namespace opserver

#endif  // OPSERVER_COMMON_ETCD_ADDRESS_H_
