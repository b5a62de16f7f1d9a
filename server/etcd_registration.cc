#include "server/etcd_registration.h"

#include <algorithm>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/listen_address.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/log.h"

namespace opserver {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(500);

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdRegistration>> EtcdRegistration::Start(
    const RegistrationOptions& options, Describe describe) {
  if (options.ttl_s < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--register_ttl_s=", options.ttl_s,
                     ": at least 2 (the lease is renewed every third of it)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                   EtcdClient::Connect(options.etcd, options.credentials));
  std::unique_ptr<EtcdRegistration> registration(
      new EtcdRegistration(options, std::move(describe), std::move(etcd)));
  RETURN_IF_ERROR(registration->Register());
  if (options.attempted) options.attempted(true);
  absl::StatusOr<std::thread> thread = StartThread(
      "the etcd registration thread", [r = registration.get()] { r->Run(); });
  if (!thread.ok()) return thread.status();  // The destructor revokes.
  registration->thread_ = *std::move(thread);
  return registration;
}

EtcdRegistration::~EtcdRegistration() { Withdraw(); }

absl::Status EtcdRegistration::WriteKeys(int64_t lease) {
  for (pool::v1::RegisteredDevice& device : describe_()) {
    device.set_address(options_.address);
    std::string value;
    if (!google::protobuf::util::MessageToJsonString(device, &value).ok()) {
      return absl::InternalError("cannot write a device's registration");
    }
    RETURN_IF_ERROR(
        etcd_->Put(options_.etcd.DeviceKey(options_.address, device.device()),
                   value, lease));
  }
  return absl::OkStatus();
}

absl::Status EtcdRegistration::Register() {
  ASSIGN_OR_RETURN(int64_t lease, etcd_->Grant(options_.ttl_s));
  {
    absl::MutexLock lock(&mu_);
    lease_ = lease;
  }
  return WriteKeys(lease);
}

void EtcdRegistration::Run() {
  const absl::Duration period = absl::Seconds(options_.ttl_s) / 3;
  absl::Duration backoff = kFirstBackoff;
  bool lost = false;
  for (;;) {
    int64_t lease;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               lost ? backoff : period)) {
        return;
      }
      lease = lease_;
    }
    absl::Status status;
    if (lease == 0) {
      status = Register();
    } else {
      status = etcd_->KeepAlive(lease).status();
      // The free memory as it is now (and the keys back if something
      // deleted them).
      if (status.ok()) status = WriteKeys(lease);
    }
    if (options_.attempted) options_.attempted(status.ok());
    if (status.ok()) {
      if (lost) {
        LogLine(absl::StrCat("etcd: registered again at ", etcd_->endpoints(),
                             " under /", options_.etcd.prefix));
      }
      lost = false;
      backoff = kFirstBackoff;
      continue;
    }
    if (absl::IsNotFound(status)) {
      // The lease expired while etcd was out of reach: its keys are gone;
      // a new lease takes their place.
      absl::MutexLock lock(&mu_);
      lease_ = 0;
    }
    if (!lost) {
      LogLine(absl::StrCat("etcd: the registration is lost (", status.message(),
                           "); retrying, open sessions are served as before"));
    }
    lost = true;
    backoff = std::min(backoff * 2, absl::Seconds(options_.ttl_s));
  }
}

void EtcdRegistration::Withdraw() {
  {
    absl::MutexLock lock(&mu_);
    if (withdrawn_) return;
    withdrawn_ = true;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_;
    lease_ = 0;
  }
  if (lease == 0) return;
  if (absl::Status revoked = etcd_->Revoke(lease); !revoked.ok()) {
    LogLine(absl::StrCat("etcd: the keys could not be removed (",
                         revoked.message(), "); they expire with the lease"));
  }
}

bool EtcdRegistration::registered() const {
  absl::MutexLock lock(&mu_);
  return lease_ != 0;
}

namespace {

// The address clients dial: --register_address, or the listen address when
// it names a host (a wildcard listens everywhere but is nowhere to dial).
absl::StatusOr<std::string> DialAddress(const RegisterFlags& flags,
                                        const Server& server) {
  if (!flags.address.empty()) {
    absl::StatusOr<ListenAddress> parsed = ParseListenAddress(flags.address);
    if (!parsed.ok() || parsed->port == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--register_address=", flags.address,
                       ": not HOST:PORT with a port other than 0"));
    }
    return parsed->ToString();
  }
  absl::StatusOr<ListenAddress> listen = ParseListenAddress(server.address());
  if (!listen.ok() || listen->host.empty() || listen->host == "0.0.0.0" ||
      listen->host == "::") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the server listens on ", server.address(),
        ", which clients cannot dial: set --register_address=HOST:PORT"));
  }
  return server.address();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdRegistration>> RegisterServer(
    const RegisterFlags& flags, Server& server) {
  ASSIGN_OR_RETURN(EtcdAddress etcd, ParseEtcdAddress(flags.etcd));
  RegistrationOptions options;
  options.etcd = std::move(etcd);
  options.ttl_s = flags.ttl_s;
  ASSIGN_OR_RETURN(std::string address, DialAddress(flags, server));
  options.address = std::move(address);
  options.credentials.ca_file = flags.ca_file;
  options.credentials.cert_file = flags.cert_file;
  options.credentials.key_file = flags.key_file;
  options.credentials.user = flags.user;
  if (!flags.user.empty()) {
    std::ifstream in(flags.password_file);
    if (flags.password_file.empty() ||
        !std::getline(in, options.credentials.password)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--etcd_user needs --etcd_password_file (a readable file): '",
          flags.password_file, "'"));
    }
  }
  if (Metrics* metrics = server.metrics(); metrics != nullptr) {
    options.attempted = [metrics](bool succeeded) {
      metrics->RegistrationAttempt(succeeded);
    };
  }
  Server* s = &server;
  return EtcdRegistration::Start(options, [s] {
    std::vector<pool::v1::RegisteredDevice> devices;
    SessionManager& sessions = s->sessions();
    for (uint32_t i = 0; i < sessions.device_count(); ++i) {
      const Device* device = sessions.device(i);
      const DeviceDescription description = device->Describe();
      pool::v1::RegisteredDevice& d = devices.emplace_back();
      d.set_device(i);
      d.set_kind(description.kind);
      d.set_soc_name(description.name);
      d.set_capacity_bytes(description.memory_bytes);
      d.set_free_bytes(device->FreeBytes());
      d.set_draining(s->draining());
    }
    return devices;
  });
}

}  // namespace opserver
