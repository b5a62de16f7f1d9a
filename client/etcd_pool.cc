#include "client/etcd_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "google/protobuf/util/json_util.h"

namespace opserver {
namespace {

// A registration is a few hundred bytes; a bigger value is not one.
constexpr size_t kMaxValueBytes = 4096;
// How often a claim that waits for free devices looks again.
constexpr absl::Duration kClaimPoll = absl::Milliseconds(200);
// Lost races a claim retries at once before it counts as not free: other
// jobs claiming at the same time.
constexpr int kMaxRaces = 64;

// A key from etcd, printable and short, for messages.
std::string Shown(absl::string_view key) {
  return absl::CEscape(key.substr(0, 120));
}

absl::Status Foreign(const EtcdAddress& address, absl::string_view key,
                     absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "etcd prefix ", address.Root(), " holds the key '", Shown(key), "' ", why,
      ": it is not an opserver pool's (use a prefix of its own)"));
}

absl::StatusOr<PoolDevice> ParseDevice(const EtcdAddress& address,
                                       const EtcdClient::Entry& entry,
                                       absl::string_view rest) {
  absl::StatusOr<DeviceKeyParts> parts = ParseDeviceKeyRest(rest);
  if (!parts.ok()) return Foreign(address, entry.key, parts.status().message());
  PoolDevice device{parts->address, parts->device, {}};
  google::protobuf::util::JsonParseOptions json;
  json.ignore_unknown_fields = true;  // Fields of a newer server.
  if (entry.value.size() > kMaxValueBytes ||
      !google::protobuf::util::JsonStringToMessage(entry.value, &device.info,
                                                   json)
           .ok()) {
    return Foreign(address, entry.key,
                   "whose value is not a device registration");
  }
  if (device.info.address() != device.address ||
      device.info.device() != device.device) {
    return Foreign(address, entry.key,
                   "whose value names another device than its key");
  }
  return device;
}

}  // namespace

absl::StatusOr<PoolListing> ReadPool(EtcdClient& etcd,
                                     const EtcdAddress& address) {
  ASSIGN_OR_RETURN(std::vector<EtcdClient::Entry> entries,
                   etcd.List(address.Root()));
  PoolListing listing;
  const std::string devices = address.DevicesRoot();
  const std::string claims = address.ClaimsRoot();
  for (const EtcdClient::Entry& entry : entries) {
    absl::string_view rest = entry.key;
    if (absl::ConsumePrefix(&rest, devices)) {
      ASSIGN_OR_RETURN(PoolDevice device, ParseDevice(address, entry, rest));
      listing.devices.push_back(std::move(device));
    } else if (absl::ConsumePrefix(&rest, claims)) {
      absl::StatusOr<DeviceKeyParts> parts = ParseDeviceKeyRest(rest);
      if (!parts.ok()) {
        return Foreign(address, entry.key, parts.status().message());
      }
      listing.claimed.push_back(entry.key);
    } else {
      return Foreign(address, entry.key, "outside devices/ and claims/");
    }
  }
  return listing;
}

PoolClaim::~PoolClaim() { Stop(/*revoke=*/true); }

void PoolClaim::AbandonForTest() { Stop(/*revoke=*/false); }

void PoolClaim::Stop(bool revoke) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // An etcd out of reach lets the lease expire instead.
  if (revoke) etcd_->Revoke(lease_).IgnoreError();
}

void PoolClaim::Renew() {
  const absl::Duration period = absl::Seconds(ttl_s_) / 3;
  bool lost = false;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) return;
    }
    absl::StatusOr<int64_t> renewed = etcd_->KeepAlive(lease_);
    if (!renewed.ok() && !lost) {
      // Said once: the job goes on with its sessions, but other jobs may
      // claim its devices once the lease has expired.
      std::fprintf(stderr, "opserver: the device claim was not renewed (%s)\n",
                   std::string(renewed.status().message()).c_str());
    }
    lost = !renewed.ok();
  }
}

absl::StatusOr<std::unique_ptr<PoolClaim>> ClaimDevices(
    std::shared_ptr<EtcdClient> etcd, const EtcdAddress& address,
    const ClaimOptions& options, std::vector<PoolDevice>* claimed) {
  if (options.count == 0) {
    return absl::InvalidArgumentError("a claim of 0 devices");
  }
  if (options.ttl_s < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim lease TTL ", options.ttl_s, " s: at least 2"));
  }
  ASSIGN_OR_RETURN(int64_t lease, etcd->Grant(options.ttl_s));
  // Revokes the lease on every way out but success.
  std::unique_ptr<PoolClaim> claim(new PoolClaim(etcd, lease, options.ttl_s));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string holder = absl::StrCat("host=", host, " pid=", getpid());
  const absl::Time deadline = absl::Now() + options.wait;
  int races = 0;
  for (;;) {
    ASSIGN_OR_RETURN(PoolListing listing, ReadPool(*etcd, address));
    const std::set<std::string> taken(listing.claimed.begin(),
                                      listing.claimed.end());
    std::vector<PoolDevice> free;
    for (PoolDevice& device : listing.devices) {
      if (device.info.draining() ||
          taken.count(address.ClaimKey(device.address, device.device)) > 0) {
        continue;
      }
      free.push_back(std::move(device));
    }
    if (free.size() >= options.count) {
      free.resize(options.count);
      std::vector<std::string> keys;
      for (const PoolDevice& device : free) {
        keys.push_back(address.ClaimKey(device.address, device.device));
      }
      ASSIGN_OR_RETURN(bool created, etcd->CreateAll(keys, holder, lease));
      if (created) {
        *claimed = std::move(free);
        break;
      }
      // Another job claimed one of them first: choose again at once.
      if (++races < kMaxRaces) continue;
    }
    if (absl::Now() >= deadline) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "claiming ", options.count, " device", options.count == 1 ? "" : "s",
          " under etcd prefix ", address.Root(), ": ", listing.devices.size(),
          " registered, ", free.size(),
          " free (the others are claimed by other jobs or draining)",
          options.wait > absl::ZeroDuration()
              ? absl::StrCat(" after waiting ",
                             absl::FormatDuration(options.wait))
              : std::string("; OPSERVER_CLAIM_WAIT_S=SECONDS waits for them")));
    }
    if (options.waiting) options.waiting();
    absl::SleepFor(std::min(kClaimPoll, deadline - absl::Now()));
  }
  absl::StatusOr<std::thread> thread = StartThread(
      "the device claim's renewal thread", [c = claim.get()] { c->Renew(); });
  if (!thread.ok()) return thread.status();  // The claim revokes its lease.
  claim->thread_ = *std::move(thread);
  return claim;
}

absl::StatusOr<PoolResolution> ResolvePool(const std::string& text,
                                           const ClaimOptions& options,
                                           const EtcdCredentials& credentials) {
  ASSIGN_OR_RETURN(EtcdAddress address, ParseEtcdAddress(text));
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> connected,
                   EtcdClient::Connect(address, credentials));
  std::shared_ptr<EtcdClient> etcd = std::move(connected);
  PoolResolution resolution;
  if (options.count > 0) {
    ASSIGN_OR_RETURN(std::unique_ptr<PoolClaim> claim,
                     ClaimDevices(etcd, address, options, &resolution.devices));
    resolution.claim = std::move(claim);
    return resolution;
  }
  ASSIGN_OR_RETURN(PoolListing listing, ReadPool(*etcd, address));
  if (listing.devices.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no opserver is registered under etcd prefix ", address.Root(), " at ",
        etcd->endpoints(), " (servers register with --register=", text, ")"));
  }
  resolution.devices = std::move(listing.devices);
  return resolution;
}

absl::Status SetClaimCount(int64_t count, absl::string_view shown,
                           ClaimOptions* options) {
  if (count < 0 || count > kMaxClaim) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": not a device count (0 to ", kMaxClaim, ")"));
  }
  options->count = static_cast<uint32_t>(count);
  return absl::OkStatus();
}

absl::Status SetClaimWait(double seconds, absl::string_view shown,
                          ClaimOptions* options) {
  // Written so that NaN fails too.
  if (!(seconds >= 0 && seconds <= kMaxClaimWaitS)) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": not seconds (0 to ", kMaxClaimWaitS, ")"));
  }
  options->wait = absl::Seconds(seconds);
  return absl::OkStatus();
}

absl::Status SetClaimTtl(int64_t seconds, absl::string_view shown,
                         ClaimOptions* options) {
  if (seconds < kMinClaimTtlS || seconds > kMaxClaimTtlS) {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": not a lease TTL in seconds (", kMinClaimTtlS,
                     " to ", kMaxClaimTtlS, ")"));
  }
  options->ttl_s = static_cast<int>(seconds);
  return absl::OkStatus();
}

absl::StatusOr<ClaimOptions> ClaimOptionsFromEnv(
    const std::vector<std::string>& skip) {
  ClaimOptions options;
  // Each variable: unset or empty keeps the default; anything but an
  // integer in range is refused, naming the variable and its value.
  using Setter = absl::Status (*)(int64_t, absl::string_view, ClaimOptions*);
  const std::pair<const char*, Setter> variables[] = {
      {"OPSERVER_CLAIM", &SetClaimCount},
      {"OPSERVER_CLAIM_WAIT_S",
       [](int64_t s, absl::string_view shown, ClaimOptions* o) {
         return SetClaimWait(static_cast<double>(s), shown, o);
       }},
      {"OPSERVER_CLAIM_TTL_S", &SetClaimTtl},
  };
  for (const auto& [name, set] : variables) {
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') continue;
    const std::string shown = absl::StrCat(name, "='", Shown(text), "'");
    int64_t value;
    // Garbage reads as -1: out of every range, so refused with the range.
    if (!absl::SimpleAtoi(text, &value)) value = -1;
    RETURN_IF_ERROR(set(value, shown, &options));
  }
  return options;
}

EtcdCredentials EtcdCredentialsFromEnv() {
  auto get = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value == nullptr ? "" : value);
  };
  EtcdCredentials credentials;
  credentials.ca_file = get("OPSERVER_ETCD_CA_FILE");
  credentials.cert_file = get("OPSERVER_ETCD_CERT_FILE");
  credentials.key_file = get("OPSERVER_ETCD_KEY_FILE");
  credentials.user = get("OPSERVER_ETCD_USER");
  credentials.password = get("OPSERVER_ETCD_PASSWORD");
  return credentials;
}

}  // namespace opserver
