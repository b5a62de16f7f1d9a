#include "common/etcd_client.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace opserver {
namespace {

// The largest reply accepted from etcd: kMaxKeys keys of a pool's size fit
// many times over; anything bigger is refused by gRPC, not buffered.
constexpr int kMaxReplyBytes = 16 << 20;

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd ", what, " file '", path, "' cannot be read"));
  }
  if (text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd ", what, " file '", path, "' cannot be read or is empty"));
  }
  return text.str();
}

bool Unreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(end.back() + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd's "to the end of the keyspace".
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    const EtcdAddress& address, const EtcdCredentials& credentials,
    absl::Duration call_timeout) {
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials =
      grpc::InsecureChannelCredentials();
  if (credentials.cert_file.empty() != credentials.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate needs both its certificate and key files");
  }
  if (!credentials.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    ASSIGN_OR_RETURN(std::string ca, ReadPem(credentials.ca_file, "CA"));
    ssl.pem_root_certs = ca;
    if (!credentials.cert_file.empty()) {
      ASSIGN_OR_RETURN(std::string cert,
                       ReadPem(credentials.cert_file, "certificate"));
      ASSIGN_OR_RETURN(std::string key, ReadPem(credentials.key_file, "key"));
      ssl.pem_cert_chain = cert;
      ssl.pem_private_key = key;
    }
    channel_credentials = grpc::SslCredentials(ssl);
  } else if (!credentials.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate needs the CA file too (TLS)");
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient());
  client->credentials_ = credentials;
  client->call_timeout_ = call_timeout;
  for (const std::string& endpoint : address.endpoints) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxReplyBytes);
    // Each client of the pool has its own connection: a server's
    // registration must not share a subchannel's backoff with anything.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    Endpoint e;
    e.address = endpoint;
    e.channel = grpc::CreateCustomChannel(endpoint, channel_credentials, args);
    e.kv = etcdserverpb::KV::NewStub(e.channel);
    e.lease = etcdserverpb::Lease::NewStub(e.channel);
    e.auth = etcdserverpb::Auth::NewStub(e.channel);
    client->endpoints_.push_back(std::move(e));
  }
  if (client->endpoints_.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoint");
  }
  return client;
}

std::string EtcdClient::endpoints() const {
  std::vector<std::string> names;
  for (const Endpoint& e : endpoints_) names.push_back(e.address);
  return absl::StrJoin(names, ",");
}

grpc::Status EtcdClient::Authenticate(Endpoint& endpoint) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  etcdserverpb::AuthenticateRequest request;
  request.set_name(credentials_.user);
  request.set_password(credentials_.password);
  etcdserverpb::AuthenticateResponse response;
  grpc::Status status =
      endpoint.auth->Authenticate(&context, request, &response);
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    token_ = response.token();
  }
  return status;
}

grpc::Status EtcdClient::CallOnce(Endpoint& endpoint, const Rpc& rpc) {
  const bool authenticated = !credentials_.user.empty();
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  if (authenticated && token.empty()) {
    grpc::Status status = Authenticate(endpoint);
    if (!status.ok()) return status;
    absl::MutexLock lock(&mu_);
    token = token_;
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  if (authenticated) context.AddMetadata("token", token);
  grpc::Status status = rpc(endpoint, context);
  // etcd's tokens expire (its --auth-token-ttl): once, a fresh one.
  if (authenticated &&
      status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    {
      absl::MutexLock lock(&mu_);
      token_.clear();
    }
    grpc::Status again = Authenticate(endpoint);
    if (!again.ok()) return again;
    grpc::ClientContext retry;
    retry.set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
    {
      absl::MutexLock lock(&mu_);
      token = token_;
    }
    retry.AddMetadata("token", token);
    status = rpc(endpoint, retry);
  }
  return status;
}

absl::Status EtcdClient::Call(const char* method, const Rpc& rpc) {
  size_t first;
  {
    absl::MutexLock lock(&mu_);
    first = current_;
  }
  grpc::Status status;
  std::string address;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t index = (first + i) % endpoints_.size();
    Endpoint& endpoint = endpoints_[index];
    status = CallOnce(endpoint, rpc);
    address = endpoint.address;
    if (Unreachable(status)) continue;
    absl::MutexLock lock(&mu_);
    current_ = index;
    break;
  }
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  return absl::Status(
      code,
      absl::StrCat(
          "etcd at ",
          Unreachable(status) && endpoints_.size() > 1 ? endpoints() : address,
          " (", method, "): ", absl::StatusCodeToString(code), ": ",
          status.error_message(), Unreachable(status) ? TransportNote() : ""));
}

std::string EtcdClient::TransportNote() const {
  // etcd refusing a client's certificate (or plaintext, or the lack of a
  // certificate) closes the connection after the handshake, which gRPC
  // reports as a closed socket or a failed read: the settings used say why.
  if (credentials_.ca_file.empty()) {
    return "; plaintext (an etcd that serves TLS closes such connections; "
           "its CA goes in OPSERVER_ETCD_CA_FILE or --etcd_ca_file)";
  }
  if (credentials_.cert_file.empty()) {
    return absl::StrCat("; TLS with the CA file '", credentials_.ca_file,
                        "' and no client certificate (an etcd with "
                        "--client-cert-auth closes such connections)");
  }
  return absl::StrCat("; TLS with the CA file '", credentials_.ca_file,
                      "' and the client certificate '", credentials_.cert_file,
                      "' (an etcd with --client-cert-auth closes the "
                      "connection when its --trusted-ca-file did not sign it)");
}

absl::StatusOr<int64_t> EtcdClient::Grant(int64_t ttl_s) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse response;
  absl::Status status =
      Call("LeaseGrant", [&](Endpoint& e, grpc::ClientContext& context) {
        return e.lease->LeaseGrant(&context, request, &response);
      });
  if (!status.ok()) return status;
  if (!response.error().empty() || response.id() == 0) {
    return absl::InternalError(
        absl::StrCat("etcd at ", endpoints(),
                     " (LeaseGrant): no lease: ", response.error()));
  }
  return response.id();
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  // One renewal per stream: the stream is opened, used once and ended, so
  // a lost etcd shows as this call's error and not as a stream that hangs.
  absl::Status status =
      Call("LeaseKeepAlive", [&](Endpoint& e, grpc::ClientContext& context) {
        auto stream = e.lease->LeaseKeepAlive(&context);
        if (!stream->Write(request) || !stream->Read(&response)) {
          return stream->Finish();
        }
        context.TryCancel();
        stream->Finish();  // CANCELLED, by the line above.
        return grpc::Status::OK;
      });
  if (!status.ok()) return status;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd at ", endpoints(), ": lease ",
                                            lease, " has expired"));
  }
  return response.ttl();
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return Call("LeaseRevoke", [&](Endpoint& e, grpc::ClientContext& context) {
    return e.lease->LeaseRevoke(&context, request, &response);
  });
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value,
                             int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  return Call("Put", [&](Endpoint& e, grpc::ClientContext& context) {
    return e.kv->Put(&context, request, &response);
  });
}

absl::StatusOr<std::vector<EtcdClient::Entry>> EtcdClient::List(
    const std::string& prefix) {
  etcdserverpb::RangeRequest request;
  request.set_key(prefix);
  request.set_range_end(PrefixRangeEnd(prefix));
  request.set_limit(kMaxKeys);
  request.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
  request.set_sort_target(etcdserverpb::RangeRequest::KEY);
  etcdserverpb::RangeResponse response;
  absl::Status status =
      Call("Range", [&](Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Range(&context, request, &response);
      });
  if (!status.ok()) return status;
  if (response.more() || response.kvs_size() > kMaxKeys) {
    return absl::ResourceExhaustedError(absl::StrCat("etcd at ", endpoints(),
                                                     ": more than ", kMaxKeys,
                                                     " keys under ", prefix));
  }
  std::vector<Entry> entries;
  entries.reserve(response.kvs_size());
  for (etcdserverpb::KeyValue& kv : *response.mutable_kvs()) {
    entries.push_back(Entry{std::move(*kv.mutable_key()),
                            std::move(*kv.mutable_value()), kv.lease()});
  }
  return entries;
}

absl::StatusOr<bool> EtcdClient::CreateAll(const std::vector<std::string>& keys,
                                           const std::string& value,
                                           int64_t lease) {
  etcdserverpb::TxnRequest request;
  for (const std::string& key : keys) {
    etcdserverpb::Compare* absent = request.add_compare();
    absent->set_key(key);
    absent->set_target(etcdserverpb::Compare::CREATE);
    absent->set_result(etcdserverpb::Compare::EQUAL);
    absent->set_create_revision(0);
    etcdserverpb::PutRequest* put =
        request.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    put->set_lease(lease);
  }
  etcdserverpb::TxnResponse response;
  absl::Status status =
      Call("Txn", [&](Endpoint& e, grpc::ClientContext& context) {
        return e.kv->Txn(&context, request, &response);
      });
  if (!status.ok()) return status;
  return response.succeeded();
}

}  // namespace opserver
