#include "client/client.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client_calls.h"
#include "client/dial_address.h"
#include "common/data_path.h"
#include "common/event_flags.h"
#include "common/listen_address.h"
#include "common/malloc_tuning.h"
#include "common/op_call.h"
#include "common/session_routing.h"
#include "common/status_macros.h"
#include "common/trailers.h"
#include "common/task_position.h"
#include "grpcpp/grpcpp.h"
#include "kernels/aclnn_status.h"
#include "kernels/validate.h"

namespace opserver {
namespace remote {
namespace {

absl::StatusOr<std::string> ReadFile(absl::string_view what,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits until `channel` is ready; nothing when it is, else why not. It
// stops at the first TRANSIENT_FAILURE rather than at the deadline: gRPC
// reaches it at once for a refused connection or a failed handshake, and
// only retries with backoff from there.
std::optional<std::string> AwaitConnected(grpc::Channel& channel,
                                          const std::string& address,
                                          const ConnectOptions& options,
                                          bool tls) {
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY &&
         state != GRPC_CHANNEL_TRANSIENT_FAILURE) {
    if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) {
      return absl::StrCat("no answer within ",
                          absl::FormatDuration(options.connect_timeout),
                          " (host down, unreachable, or a firewall drops the "
                          "packets)");
    }
    state = channel.GetState(/*try_to_connect=*/true);
  }
  if (state == GRPC_CHANNEL_READY) return std::nullopt;
  // Whether TCP itself fails names the cause: refused, unreachable, a name
  // that does not resolve. When TCP connects, gRPC's handshake failed.
  if (std::optional<ListenAddress> host_port = DialHostPort(address)) {
    if (std::optional<std::string> why = TcpConnectFailure(
            *host_port,
            std::max(deadline - absl::Now(), absl::Milliseconds(100)))) {
      return why;
    }
    return tls ? std::string(
                     "the TLS handshake failed (over TLS: is the server's "
                     "certificate signed by tls_ca_file, does it want a "
                     "client certificate, and does the server use TLS at "
                     "all?)")
               : std::string(
                     "the server closed the connection during the gRPC "
                     "handshake (is it a TLS server? then give the CA file: "
                     "tls_ca_file, OPSERVER_TLS_CA_FILE, --tls_ca_file)");
  }
  return std::string(
      "the connection failed (gRPC channel in "
      "TRANSIENT_FAILURE)");
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile("token file", path));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) return std::string(line);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("token file: ", path, " holds no token"));
}

absl::Status FromGrpcStatus(const grpc::Status& status,
                            const grpc::ClientContext& context,
                            absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  const std::string message = absl::StrCat(what, ": ", status.error_message());
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kAclnnStatusTrailerKey);
  int32_t aclnn = 0;
  if (it != trailers.end() &&
      absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                       &aclnn) &&
      aclnn != 0) {
    // A stream's deferred error may name its task (only reported back).
    uint64_t task = 0;
    auto position = trailers.find(kTaskPositionTrailerKey);
    if (position != trailers.end() &&
        !absl::SimpleAtoi(
            absl::string_view(position->second.data(), position->second.size()),
            &task)) {
      task = 0;
    }
    return WithTaskPosition(kernels::AclnnError(aclnn, code, message), task);
  }
  // No server verdict (the call never reached it, or timed out): derive it.
  absl::Status plain(code, message);
  return kernels::AclnnError(kernels::GetAclnnStatus(plain), code, message);
}

bool IsConnectionLoss(const grpc::Status& status,
                      const grpc::ClientContext& context) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         context.GetServerTrailingMetadata().count(kAclnnStatusTrailerKey) == 0;
}

absl::Status Client::WentAway(absl::string_view detail) const {
  return kernels::AclnnError(
      kernels::kAclnnErrRuntimeError, absl::StatusCode::kUnavailable,
      absl::StrCat("server at ", address_, " went away (", detail, ")"));
}

absl::Status Client::CallStatus(const grpc::Status& status,
                                const grpc::ClientContext& context,
                                absl::string_view what) const {
  if (!IsConnectionLoss(status, context)) {
    return FromGrpcStatus(status, context, what);
  }
  absl::Status lost = WentAway(status.error_message());
  return kernels::AclnnError(kernels::kAclnnErrRuntimeError, lost.code(),
                             absl::StrCat(what, ": ", lost.message()));
}

// ---------------------------------------------------------------- Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& address, const ConnectOptions& options) {
  TuneMallocForStreaming();
  if (options.max_message_bytes == 0 ||
      options.max_message_bytes > uint64_t{std::numeric_limits<int>::max()}) {
    return absl::InvalidArgumentError(
        "max_message_bytes must be between 1 and 2 GiB - 1");
  }
  if (options.transfer_connections < 1 ||
      options.transfer_connections > kMaxTransferConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer_connections must be between 1 and ",
                     kMaxTransferConnections));
  }
  if (options.transfer_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "transfer_idle_timeout must be positive");
  }
  grpc::ChannelArguments args;
  // Download chunks are up to the server's --chunk_bytes (4 MiB by default)
  // plus framing, over gRPC's 4 MiB receive default; nothing the server
  // sends is larger than its --max_message_bytes. The bound keeps a hostile
  // server from making the client allocate without limit.
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(-1);
  const bool tls = !options.tls_ca_file.empty() ||
                   !options.tls_cert_file.empty() ||
                   !options.tls_key_file.empty();
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    for (auto [what, path, pem] :
         {std::tuple<absl::string_view, const std::string&, std::string*>{
              "tls_ca_file", options.tls_ca_file, &ssl.pem_root_certs},
          {"tls_cert_file", options.tls_cert_file, &ssl.pem_cert_chain},
          {"tls_key_file", options.tls_key_file, &ssl.pem_private_key}}) {
      if (path.empty()) continue;
      ASSIGN_OR_RETURN(std::string text, ReadFile(what, path));
      *pem = std::move(text);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  if (absl::Status s = CheckDialAddress(address); !s.ok()) {
    return kernels::AclnnError(kernels::kAclnnErrParamInvalid, s.code(),
                               s.message());
  }
  auto channel = grpc::CreateCustomChannel(address, credentials, args);
  if (std::optional<std::string> why =
          AwaitConnected(*channel, address, options, tls);
      why.has_value()) {
    return kernels::AclnnError(
        kernels::kAclnnErrRuntimeError, absl::StatusCode::kUnavailable,
        absl::StrCat("cannot reach opserver at ", address, ": ", *why));
  }
  std::optional<ListenAddress> dialed = DialHostPort(address);
  // The data path is plain TCP: never beside a TLS channel.
  return std::unique_ptr<Client>(
      new Client(address, std::move(channel), std::move(credentials),
                 std::move(args), options, options.data_path && !tls,
                 dialed.has_value() ? dialed->host : std::string()));
}

bool Client::DataPathOn() const {
  return !data_path_off_.load(std::memory_order_relaxed);
}

void Client::NoteDataPathFallback(const absl::Status& why) {
  if (!data_path_fallback_noted_.exchange(true)) {
    std::fprintf(stderr,
                 "opserver client: a transfer went through gRPC: the server "
                 "kept closing its data-path connection (%s)\n",
                 std::string(why.message()).c_str());
  }
}

void Client::DisableDataPath(const absl::Status& why) {
  if (!data_path_off_.exchange(true)) {
    std::fprintf(stderr,
                 "opserver client: transfers use gRPC from now on, not the "
                 "data path: %s\n",
                 std::string(why.message()).c_str());
  }
}

Client::Client(std::string address, std::shared_ptr<grpc::Channel> channel,
               std::shared_ptr<grpc::ChannelCredentials> credentials,
               grpc::ChannelArguments args, const ConnectOptions& options,
               bool data_path, std::string dialed_host)
    : address_(std::move(address)),
      options_(options),
      credentials_(std::move(credentials)),
      args_(std::move(args)),
      transfer_watchdog_(options.transfer_idle_timeout),
      dialed_host_(std::move(dialed_host)),
      data_path_off_(!data_path),
      channel_(std::move(channel)),
      runtime_(v1::Runtime::NewStub(channel_)),
      operators_(v1::Operators::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

grpc::Channel* Client::TransferChannel(bool upload, size_t i) {
  absl::MutexLock lock(&transfer_mu_);
  std::vector<std::shared_ptr<grpc::Channel>>& made =
      transfer_channels_[upload ? 0 : 1];
  while (made.size() <= i) {
    grpc::ChannelArguments args = args_;
    // Distinct arguments, or gRPC would share channel_'s connection (or
    // the other direction's).
    args.SetString("opserver.transfer_direction",
                   upload ? "upload" : "download");
    args.SetInt("opserver.transfer_connection",
                static_cast<int>(made.size()) + 1);
    made.push_back(grpc::CreateCustomChannel(address_, credentials_, args));
  }
  return made[i].get();
}

absl::StatusOr<std::vector<grpc::Channel*>> Client::TransferChannels(
    bool upload) {
  std::vector<grpc::Channel*> channels;
  for (int i = 0; i < options_.transfer_connections; ++i) {
    grpc::Channel* channel = TransferChannel(upload, static_cast<size_t>(i));
    if (!channel->WaitForConnected(
            absl::ToChronoTime(absl::Now() + options_.connect_timeout))) {
      return absl::UnavailableError(
          absl::StrCat("cannot open ", upload ? "upload" : "download",
                       " connection ", i + 1, " to ", address_));
    }
    channels.push_back(channel);
  }
  return channels;
}

void Client::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + options_.call_timeout));
  Authorize(context);
}

void Client::SetWaitDeadline(grpc::ClientContext* context) const {
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + options_.wait_timeout));
  Authorize(context);
}

void Client::Authorize(grpc::ClientContext* context) const {
  if (!options_.token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.token));
  }
}

absl::StatusOr<v1::GetDeviceInfoResponse> Client::GetDeviceInfo() {
  v1::GetDeviceInfoResponse response;
  RETURN_IF_ERROR(Unary(*this, std::string(), &v1::Runtime::Stub::GetDeviceInfo,
                        v1::GetDeviceInfoRequest(), &response,
                        "GetDeviceInfo"));
  return response;
}

absl::StatusOr<std::string> Client::CheckHealth(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  absl::Status status = CallStatus(health_->Check(&context, request, &response),
                                   context, "Health.Check");
  if (!status.ok()) return status;
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
      response.status());
}

absl::StatusOr<v1::ListOperatorsResponse> Client::ListOperators() {
  v1::ListOperatorsResponse response;
  RETURN_IF_ERROR(
      Unary(*this, std::string(), &v1::Operators::Stub::ListOperators,
            v1::ListOperatorsRequest(), &response, "ListOperators"));
  return response;
}

absl::StatusOr<std::vector<v1::DeviceInfo>> Client::ListDevices() {
  ASSIGN_OR_RETURN(v1::GetDeviceInfoResponse info, GetDeviceInfo());
  if (info.devices_size() > 0) {
    return std::vector<v1::DeviceInfo>(info.devices().begin(),
                                       info.devices().end());
  }
  // A server from before the list: its one device is the top level.
  v1::DeviceInfo only;
  only.set_index(0);
  only.set_kind(info.kind());
  only.set_name(info.name());
  only.set_memory_bytes(info.memory_bytes());
  only.set_threads(info.threads());
  return std::vector<v1::DeviceInfo>{std::move(only)};
}

absl::StatusOr<std::unique_ptr<Session>> Client::CreateSession(
    const std::string& client_name, bool attach, uint32_t device) {
  v1::CreateSessionRequest request;
  request.set_client_name(client_name);
  request.set_device(device);
  v1::CreateSessionResponse response;
  // Chosen before the call, so CreateSession is routed like the rest.
  std::string routing_key = NewSessionRoutingKey();
  absl::Status status =
      Unary(*this, routing_key, &v1::Runtime::Stub::CreateSession, request,
            &response, "CreateSession");
  if (!status.ok()) return status;
  std::unique_ptr<Session> session(
      new Session(this, response.session(), std::move(routing_key)));
  session->device_ = device;
  if (attach) session->StartAttach();
  if (options_.pipeline) {
    absl::StatusOr<std::unique_ptr<CommandChannel>> channel =
        CommandChannel::Open(*this, session->token(), session->routing_key(),
                             options_.pipeline_window);
    if (channel.ok()) {
      session->channel_ = *std::move(channel);
    } else if (!absl::IsUnimplemented(channel.status())) {
      return channel.status();  // The session closes with `session`.
    }
    // A server without the channel: every call stays a unary RPC.
  }
  return session;
}

// ---------------------------------------------------------------- TensorDesc

TensorDesc TensorDesc::Contiguous(uint64_t buffer, kernels::DType dtype,
                                  std::vector<int64_t> shape) {
  TensorDesc desc;
  desc.buffer = buffer;
  desc.dtype = dtype;
  desc.shape = std::move(shape);
  return desc;
}

v1::TensorDesc TensorDesc::ToProto() const {
  v1::TensorDesc desc;
  desc.set_buffer(buffer);
  desc.set_buffer_offset(buffer_offset);
  desc.set_dtype(ToProtoDType(dtype));
  for (int64_t d : shape) desc.add_shape(d);
  for (int64_t s : strides) desc.add_strides(s);
  desc.set_offset(offset);
  for (int64_t d : storage_shape) desc.add_storage_shape(d);
  return desc;
}

// ---------------------------------------------------------------- handles

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Free().IgnoreError();
    session_ = std::exchange(other.session_, nullptr);
    handle_ = std::exchange(other.handle_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Free().IgnoreError(); }

absl::Status DeviceBuffer::Free() {
  if (session_ == nullptr) return absl::OkStatus();
  Session* session = std::exchange(session_, nullptr);
  return session->FreeBuffer(std::exchange(handle_, 0));
}

uint64_t DeviceBuffer::Release() {
  session_ = nullptr;
  return std::exchange(handle_, 0);
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Destroy().IgnoreError();
    session_ = std::exchange(other.session_, nullptr);
    handle_ = std::exchange(other.handle_, 0);
  }
  return *this;
}

Stream::~Stream() { Destroy().IgnoreError(); }

absl::Status Stream::Synchronize() {
  if (session_ == nullptr) {
    return absl::FailedPreconditionError("stream was destroyed");
  }
  return session_->Synchronize(handle_);
}

uint64_t Stream::Release() {
  session_ = nullptr;
  return std::exchange(handle_, 0);
}

absl::Status Stream::Destroy() {
  if (session_ == nullptr) return absl::OkStatus();
  Session* session = std::exchange(session_, nullptr);
  return session->DestroyStream(std::exchange(handle_, 0));
}

Executor& Executor::operator=(Executor&& other) noexcept {
  if (this != &other) {
    Destroy().IgnoreError();
    session_ = std::exchange(other.session_, nullptr);
    handle_ = std::exchange(other.handle_, 0);
    workspace_size_ = std::exchange(other.workspace_size_, 0);
    repeatable_ = std::exchange(other.repeatable_, false);
  }
  return *this;
}

Executor::~Executor() { Destroy().IgnoreError(); }

absl::Status Executor::SetRepeatable() {
  if (session_ == nullptr) {
    return kernels::AclnnError(kernels::kAclnnErrInnerNullptr,
                               absl::StatusCode::kFailedPrecondition,
                               "executor was already consumed or destroyed");
  }
  absl::Status status = session_->SetExecutorRepeatable(handle_);
  if (status.ok()) repeatable_ = true;
  return status;
}

absl::Status Executor::Execute(uint64_t stream, uint64_t workspace,
                               uint64_t workspace_offset) {
  return Execute(stream, workspace, workspace_offset, workspace_size_);
}

absl::Status Executor::Execute(uint64_t stream, uint64_t workspace,
                               uint64_t workspace_offset,
                               uint64_t workspace_size) {
  if (session_ == nullptr) {
    return kernels::AclnnError(kernels::kAclnnErrInnerNullptr,
                               absl::StatusCode::kFailedPrecondition,
                               "executor was already consumed or destroyed");
  }
  absl::Status status = session_->ExecuteHandle(
      handle_, stream, workspace, workspace_offset, workspace_size);
  // A launched single-use executor is consumed by the server.
  if (status.ok() && !repeatable_) session_ = nullptr;
  return status;
}

uint64_t Executor::Release() {
  session_ = nullptr;
  return std::exchange(handle_, 0);
}

absl::Status Executor::Destroy() {
  if (session_ == nullptr) return absl::OkStatus();
  Session* session = std::exchange(session_, nullptr);
  return session->DestroyExecutor(std::exchange(handle_, 0));
}

}  // namespace remote
}  // namespace opserver
