#include "client/device_set.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace opserver {
namespace remote {
namespace {

// `status` with the server named, its code kept.
absl::Status Naming(const absl::Status& status, const std::string& address) {
  return absl::Status(status.code(), absl::StrCat("opserver at ", address, ": ",
                                                  status.message()));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> DeviceSet::ParseAddresses(
    absl::string_view list) {
  std::vector<std::string> addresses;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", list, "' has an empty entry (HOST:PORT[,HOST:PORT...])"));
    }
    addresses.emplace_back(entry);
  }
  return addresses;
}

absl::StatusOr<std::unique_ptr<DeviceSet>> DeviceSet::Connect(
    const std::vector<std::string>& addresses, const ConnectOptions& options) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError("DeviceSet: no server addresses");
  }
  std::unique_ptr<DeviceSet> set(new DeviceSet(addresses, options));
  absl::MutexLock lock(&set->mu_);
  for (size_t server = 0; server < addresses.size(); ++server) {
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(addresses[server], options);
    if (!client.ok()) return client.status();  // Names the address.
    absl::StatusOr<std::vector<v1::DeviceInfo>> listed =
        (*client)->ListDevices();
    if (!listed.ok()) return Naming(listed.status(), addresses[server]);
    for (uint32_t local = 0; local < listed->size(); ++local) {
      set->devices_.push_back(Device{server, local, (*listed)[local]});
    }
    set->clients_.push_back(std::shared_ptr<Client>(*std::move(client)));
  }
  return set;
}

absl::StatusOr<std::unique_ptr<DeviceSet>> DeviceSet::ConnectAddress(
    const std::string& address, const ConnectOptions& options,
    const ClaimOptions& claim, const EtcdCredentials& etcd) {
  if (!IsEtcdAddress(address)) {
    ASSIGN_OR_RETURN(std::vector<std::string> list, ParseAddresses(address));
    return Connect(list, options);
  }
  ASSIGN_OR_RETURN(PoolResolution pool, ResolvePool(address, claim, etcd));
  return ConnectPool(std::move(pool), options);
}

absl::StatusOr<std::unique_ptr<DeviceSet>> DeviceSet::ConnectPool(
    PoolResolution pool, const ConnectOptions& options) {
  std::vector<std::string> addresses;
  for (const PoolDevice& device : pool.devices) {
    if (std::find(addresses.begin(), addresses.end(), device.address) ==
        addresses.end()) {
      addresses.push_back(device.address);
    }
  }
  std::unique_ptr<DeviceSet> set(new DeviceSet(addresses, options));
  std::vector<std::vector<v1::DeviceInfo>> listed(addresses.size());
  absl::MutexLock lock(&set->mu_);
  set->claim_ = std::move(pool.claim);
  for (size_t server = 0; server < addresses.size(); ++server) {
    ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                     Client::Connect(addresses[server], options));
    absl::StatusOr<std::vector<v1::DeviceInfo>> devices = client->ListDevices();
    if (!devices.ok()) return Naming(devices.status(), addresses[server]);
    listed[server] = *std::move(devices);
    set->clients_.push_back(std::shared_ptr<Client>(std::move(client)));
  }
  for (const PoolDevice& device : pool.devices) {
    const size_t server =
        std::find(addresses.begin(), addresses.end(), device.address) -
        addresses.begin();
    if (device.device >= listed[server].size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd registers device ", device.device, " of the opserver at ",
          device.address, ", which has ", listed[server].size(), " devices"));
    }
    set->devices_.push_back(
        Device{server, device.device, listed[server][device.device]});
  }
  return set;
}

absl::StatusOr<DeviceSet::Device> DeviceSet::device(uint32_t ordinal) const {
  if (ordinal >= devices_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device ", ordinal, " does not exist: the ", addresses_.size(),
        " servers have ", devices_.size(), " devices"));
  }
  return devices_[ordinal];
}

absl::StatusOr<std::unique_ptr<Session>> DeviceSet::CreateSession(
    uint32_t ordinal, const std::string& client_name, bool attach) {
  ASSIGN_OR_RETURN(Device found, device(ordinal));
  std::shared_ptr<Client> client;
  {
    absl::MutexLock lock(&mu_);
    client = clients_[found.server];
  }
  absl::StatusOr<std::unique_ptr<Session>> session =
      client->CreateSession(client_name, attach, found.local);
  if (!session.ok()) {
    return Naming(session.status(), addresses_[found.server]);
  }
  return session;
}

absl::Status DeviceSet::Reconnect(uint32_t ordinal) {
  ASSIGN_OR_RETURN(Device found, device(ordinal));
  ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                   Client::Connect(addresses_[found.server], options_));
  absl::MutexLock lock(&mu_);
  retired_.push_back(std::move(clients_[found.server]));
  clients_[found.server] = std::shared_ptr<Client>(std::move(client));
  return absl::OkStatus();
}

void DeviceSet::ReleaseClaim() {
  std::unique_ptr<PoolClaim> claim;
  {
    absl::MutexLock lock(&mu_);
    claim = std::move(claim_);
  }
  // Revoked outside the lock: it is a call to etcd.
  claim.reset();
}

}  // namespace remote
}  // namespace opserver
