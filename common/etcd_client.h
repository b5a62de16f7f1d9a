// A small client of etcd's v3 gRPC API (proto/etcd_kv.proto) for the pool
// (docs/pool.md): leases, keys under a prefix, and the one transaction
// claims need. Spoken through the project's own gRPC rather than etcd's
// JSON gateway: the channel, TLS and deadlines are the ones the rest of
// opserver uses, and no HTTP client joins the dependencies.
//
//   auto etcd = EtcdClient::Connect(*ParseEtcdAddress(text));
//   int64_t lease = *(*etcd)->Grant(10);
//   (*etcd)->Put("/p/devices/h:1/00000", value, lease);
//   (*etcd)->KeepAlive(lease);  // every few seconds
//
// Every error keeps gRPC's code and names the endpoint and the call:
// "etcd at 127.0.0.1:2379 (Range): UNAVAILABLE: ...", and, when etcd could
// not be reached, the transport used ("; plaintext ..." or "; TLS with the
// CA file ...").
#ifndef OPSERVER_COMMON_ETCD_CLIENT_H_
#define OPSERVER_COMMON_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/etcd_address.h"
#include "grpcpp/grpcpp.h"
#include "proto/etcd_kv.grpc.pb.h"

namespace opserver {

// etcd's own security options, passed through: TLS to etcd (a CA, and a
// client certificate when etcd asks for one) and etcd's user/password
// authentication.
struct EtcdCredentials {
  std::string ca_file;    // PEM CA; set: TLS to every endpoint.
  std::string cert_file;  // PEM client certificate and key (both or neither).
  std::string key_file;
  std::string user;  // Set: Authenticate first, send its token after.
  std::string password;
};

class EtcdClient {
 public:
  struct Entry {
    std::string key;
    std::string value;
    int64_t lease = 0;
  };
  // At most this many keys are read under one prefix: a pool is far
  // smaller, and a prefix full of other keys must not cost unbounded
  // memory (RESOURCE_EXHAUSTED beyond it).
  static constexpr int64_t kMaxKeys = 4096;

  // Builds the channels (one per endpoint; nothing is dialed yet) and
  // reads the credential files. INVALID_ARGUMENT for an unreadable file or
  // half a certificate pair.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(
      const EtcdAddress& address, const EtcdCredentials& credentials = {},
      absl::Duration call_timeout = absl::Seconds(5));

  // A lease of `ttl_s` seconds; its id.
  absl::StatusOr<int64_t> Grant(int64_t ttl_s);
  // Renews `lease`; its new TTL. NOT_FOUND when it has expired (or was
  // revoked): its keys are gone.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  // Ends `lease` and deletes its keys.
  absl::Status Revoke(int64_t lease);
  absl::Status Put(const std::string& key, const std::string& value,
                   int64_t lease);
  // Every key starting with `prefix`, in key order.
  absl::StatusOr<std::vector<Entry>> List(const std::string& prefix);
  // Creates every one of `keys` with `value`, bound to `lease`, if none of
  // them exists, in one transaction; false (and nothing written) when one
  // does.
  absl::StatusOr<bool> CreateAll(const std::vector<std::string>& keys,
                                 const std::string& value, int64_t lease);

  // "HOST:PORT,HOST:PORT" of the endpoints, for messages.
  std::string endpoints() const;

 private:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  using Rpc = std::function<grpc::Status(Endpoint&, grpc::ClientContext&)>;

  EtcdClient() = default;
  // Runs `rpc` on the endpoint that answered last, then on the others in
  // turn while they are unreachable; authenticates first when a user is
  // set (and again once when the token has expired).
  absl::Status Call(const char* method, const Rpc& rpc);
  grpc::Status CallOnce(Endpoint& endpoint, const Rpc& rpc);
  grpc::Status Authenticate(Endpoint& endpoint);
  // Appended to an unreachable endpoint's error: plaintext, or TLS with
  // which CA and client certificate.
  std::string TransportNote() const;

  std::vector<Endpoint> endpoints_;
  EtcdCredentials credentials_;
  absl::Duration call_timeout_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// `prefix` with its last byte incremented: the end of etcd's range of keys
// that start with `prefix`.
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace opserver

#endif  // OPSERVER_COMMON_ETCD_CLIENT_H_
