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

// NOT_FOUND for a handle this session does not have, as the server words
// it; `what` prefixes the message (e.g. "Free: ").
absl::Status UnknownHandle(absl::string_view what, absl::string_view kind,
                           uint64_t handle) {
  return absl::NotFoundError(absl::StrCat(
      what, "no ", kind, " ", handle,
      " in this session (never created, freed, or another session's)"));
}

v1::DataType ToProtoDType(kernels::DType dtype) {
  return static_cast<v1::DataType>(static_cast<int32_t>(dtype));
}

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

v1::Runtime::Stub& StubOf(Client& client, v1::Runtime::Stub*) {
  return client.runtime();
}
v1::Operators::Stub& StubOf(Client& client, v1::Operators::Stub*) {
  return client.operators();
}

// Every unary call of the client: a fresh context with the per-call
// deadline (`wait`: ConnectOptions::wait_timeout, for calls that wait for
// device work) and the token, the call, and its status through
// FromGrpcStatus with `what` naming the call.
// `routing_key` (empty: none) is sent as the session's routing key.
template <typename Stub, typename Request, typename Response>
absl::Status Unary(Client& client, const std::string& routing_key,
                   grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                const Request&, Response*),
                   const Request& request, Response* response,
                   absl::string_view what, bool wait = false,
                   std::optional<absl::Duration> within = std::nullopt) {
  grpc::ClientContext context;
  if (!routing_key.empty()) {
    context.AddMetadata(kSessionRoutingHeader, routing_key);
  }
  if (within.has_value()) {
    // A caller's own time-out (aclrtSynchronizeEventWithTimeout).
    context.set_deadline(absl::ToChronoTime(absl::Now() + *within));
    client.Authorize(&context);
  } else if (wait) {
    client.SetWaitDeadline(&context);
  } else {
    client.SetDeadline(&context);
  }
  return client.CallStatus((StubOf(client, static_cast<Stub*>(nullptr)).*
                            method)(&context, request, response),
                           context, what);
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
      dialed_host_(std::move(dialed_host)),
      data_path_off_(!data_path),
      channel_(std::move(channel)),
      runtime_(v1::Runtime::NewStub(channel_)),
      operators_(v1::Operators::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

absl::StatusOr<std::vector<grpc::Channel*>> Client::TransferChannels() {
  absl::MutexLock lock(&transfer_mu_);
  const size_t want = static_cast<size_t>(options_.transfer_connections - 1);
  while (transfer_channels_.size() < want) {
    grpc::ChannelArguments args = args_;
    // A distinct argument, or gRPC would share channel_'s connection.
    args.SetInt("opserver.transfer_connection",
                static_cast<int>(transfer_channels_.size()) + 1);
    auto channel = grpc::CreateCustomChannel(address_, credentials_, args);
    if (!channel->WaitForConnected(
            absl::ToChronoTime(absl::Now() + options_.connect_timeout))) {
      return absl::UnavailableError(
          absl::StrCat("cannot open transfer connection ",
                       transfer_channels_.size() + 1, " to ", address_));
    }
    transfer_channels_.push_back(std::move(channel));
  }
  std::vector<grpc::Channel*> channels;
  for (size_t i = 0; i < want; ++i)
    channels.push_back(transfer_channels_[i].get());
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

// ---------------------------------------------------------------- Session

Session::Session(Client* client, std::string token, std::string routing_key)
    : client_(client),
      token_(std::move(token)),
      routing_key_(std::move(routing_key)) {}

void Session::Route(grpc::ClientContext* context) const {
  context->AddMetadata(kSessionRoutingHeader, routing_key_);
}

Session::~Session() { Close().IgnoreError(); }

void Session::StartAttach() {
  attach_context_ = std::make_unique<grpc::ClientContext>();
  client_->Authorize(attach_context_.get());  // No deadline: it lasts.
  Route(attach_context_.get());
  v1::AttachRequest request;
  request.set_session(token_);
  // Read on a background thread until the server ends the call or Close()
  // cancels it; nothing else is ever sent.
  attach_thread_ = std::thread([this, request,
                                reader = client_->runtime().Attach(
                                    attach_context_.get(), request)]() mutable {
    v1::AttachEvent event;
    std::string last;
    while (reader->Read(&event)) last = event.event();
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (!status.ok() && IsConnectionLoss(status, *attach_context_)) {
      // Not the server's doing: it (or the way to it) is gone, and the
      // session with it.
      lost_ = client_->WentAway(
          absl::StrCat(status.error_message(),
                       "; the session and everything in it are lost"));
      return;
    }
    // The server freed the session (this went unnoticed
    // and later calls failed with a bare "no session", or not at all).
    std::string why =
        status.ok() ? "the server ended it" : status.error_message();
    if (!last.empty() && last != "attached") why = last;
    if (why.size() > 256) why.resize(256);  // A hostile server's text.
    lost_ = absl::NotFoundError(absl::StrCat(
        "the session was lost: its Attach call ended (", why,
        "), so the server freed the session and everything in it"));
  });
}

absl::Status Session::Lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

absl::Status Session::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
  }
  // Everything queued is delivered, and an error still pending is reported,
  // before the session goes.
  absl::Status deferred = Flush();
  channel_.reset();
  v1::CloseSessionRequest request;
  request.set_session(token_);
  v1::CloseSessionResponse response;
  absl::Status status =
      Unary(*client_, routing_key_, &v1::Runtime::Stub::CloseSession, request,
            &response, "CloseSession");
  if (attach_context_ != nullptr) {
    attach_context_->TryCancel();
    attach_thread_.join();
  }
  return deferred.ok() ? status : deferred;
}

absl::Status Session::Flush() {
  if (channel_ == nullptr) return absl::OkStatus();
  return channel_->Fence(0, /*session=*/true);
}

absl::Status Session::Ordered() {
  if (channel_ == nullptr) return absl::OkStatus();
  return channel_->Drain();
}

absl::StatusOr<Executor> Session::PlanLocally(
    v1::GetWorkspaceSizeRequest request) {
  // Same text as the server's, with the prefix the unary call gets.
  auto fail = [&](const absl::Status& s) {
    return kernels::AclnnError(
        kernels::GetAclnnStatus(s), s.code(),
        absl::StrCat(request.op(), " GetWorkspaceSize: ", s.message()));
  };
  uint64_t id;
  absl::StatusOr<kernels::ValidCall> valid;
  {
    absl::MutexLock lock(&handles_mu_);
    // Buffers are checked by size; the address is a stand-in that nothing
    // dereferences (the views' bounds are all that matter here).
    auto lookup = [&](uint64_t handle) -> absl::StatusOr<DeviceBytes> {
      auto it = buffer_sizes_.find(handle);
      if (it == buffer_sizes_.end()) {
        return UnknownHandle("", "buffer", handle);
      }
      return DeviceBytes{reinterpret_cast<void*>(uintptr_t{1} << 44),
                         it->second};
    };
    absl::StatusOr<kernels::OpCall> call = ToOpCall(request, lookup);
    if (!call.ok()) return fail(call.status());
    valid = kernels::Validate(*call);
    if (!valid.ok()) return fail(valid.status());
    id = next_executor_++;
    v1::PipelineCommand command;
    command.mutable_plan()->set_executor(id);
    request.clear_session();  // The channel's session.
    *command.mutable_plan()->mutable_request() = std::move(request);
    // Queued under the same lock that chose the id: the server accepts ids
    // only in increasing order (so it never has to remember used ones).
    RETURN_IF_ERROR(channel_->Send(std::move(command)));
    executors_[id] = LocalExecutor{valid->workspace_size, false};
  }
  return Executor(this, id, valid->workspace_size);
}

absl::StatusOr<v1::SessionStats> Session::Stats() {
  RETURN_IF_ERROR(Ordered());
  v1::GetSessionStatsRequest request;
  request.set_session(token_);
  v1::SessionStats response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Runtime::Stub::GetSessionStats, request, &response,
                        "GetSessionStats"));
  return response;
}

absl::StatusOr<DeviceBuffer> Session::Malloc(uint64_t size) {
  RETURN_IF_ERROR(Ordered());
  v1::MallocRequest request;
  request.set_session(token_);
  request.set_size(size);
  v1::MallocResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::Malloc,
                        request, &response, "Malloc"));
  if (channel_ != nullptr) {
    absl::MutexLock lock(&handles_mu_);
    buffer_sizes_[response.buffer()] = size;
  }
  return DeviceBuffer(this, response.buffer(), size);
}

absl::Status Session::FreeBuffer(uint64_t buffer) {
  if (channel_ != nullptr) {
    {
      absl::MutexLock lock(&handles_mu_);
      if (buffer_sizes_.erase(buffer) == 0) {
        return UnknownHandle("Free: ", "buffer", buffer);
      }
    }
    v1::PipelineCommand command;
    command.set_free(buffer);
    return channel_->Send(std::move(command));
  }
  v1::FreeRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  v1::FreeResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::Free, request,
               &response, "Free");
}

absl::StatusOr<Stream> Session::CreateStream() {
  RETURN_IF_ERROR(Ordered());
  v1::CreateStreamRequest request;
  request.set_session(token_);
  v1::CreateStreamResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Runtime::Stub::CreateStream, request, &response,
                        "CreateStream"));
  if (channel_ != nullptr) {
    absl::MutexLock lock(&handles_mu_);
    streams_.insert(response.stream());
  }
  return Stream(this, response.stream());
}

absl::Status Session::DestroyStream(uint64_t stream) {
  RETURN_IF_ERROR(Ordered());
  std::optional<uint64_t> probe;
  {
    absl::MutexLock lock(&handles_mu_);
    streams_.erase(stream);
    idle_at_.erase(stream);
    if (channel_ != nullptr) channel_->ForgetStream(stream);
    if (auto it = probes_.find(stream); it != probes_.end()) {
      probe = it->second;
      probes_.erase(it);
    }
  }
  // Its probe goes with it (an error here is the session's, reported by
  // whoever flushes it).
  if (probe.has_value()) DestroyEvent(*probe).IgnoreError();
  v1::DestroyStreamRequest request;
  request.set_session(token_);
  request.set_stream(stream);
  v1::DestroyStreamResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::DestroyStream,
               request, &response, "DestroyStream", /*wait=*/true);
}

absl::Status Session::Synchronize(uint64_t stream) {
  // Every command sent up to now is ordered before the fence or the unary
  // call below (commands other threads send meanwhile may not be).
  const uint64_t issued = channel_ != nullptr ? channel_->Issued() : 0;
  absl::Status status;
  // With nothing in flight on the channel, the unary call is already in
  // order, and it reports the same deferred error (the server keeps it on
  // the stream); it saves the channel's two thread hand-offs (an idle
  // synchronize: 175 -> ~105 us on loopback).
  if (channel_ != nullptr && !channel_->Idle()) {
    status = channel_->Fence(stream, /*session=*/false);
  } else {
    v1::SynchronizeStreamRequest request;
    request.set_session(token_);
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    status =
        Unary(*client_, routing_key_, &v1::Runtime::Stub::SynchronizeStream,
              request, &response, "SynchronizeStream", /*wait=*/true);
    // The stream's deferred error names the stream, as a fence's does; a
    // failed call (lost, timed out) collected nothing.
    if (kernels::GetAclnnStatus(status) != 0 && TaskPositionOf(status) != 0) {
      status = WithDeferredStream(std::move(status), stream);
    }
  }
  if (status.ok()) NoteIdle(stream, issued);
  return status;
}

void Session::NoteIdle(uint64_t stream, uint64_t issued) {
  if (channel_ == nullptr) return;
  absl::MutexLock lock(&handles_mu_);
  if (stream != 0 && !streams_.contains(stream)) return;
  uint64_t& known = idle_at_[stream];
  known = std::max(known, issued);
}

bool Session::KnownIdle(uint64_t stream) {
  uint64_t idle_after;
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = idle_at_.find(stream);
    if (it == idle_at_.end()) return false;
    idle_after = it->second;
  }
  return channel_->LastWorkOn(stream) <= idle_after;
}

absl::Status Session::CheckLocalStream(absl::string_view what,
                                       uint64_t stream) {
  if (channel_ == nullptr || stream == 0) return absl::OkStatus();
  absl::MutexLock lock(&handles_mu_);
  if (!streams_.contains(stream)) {
    return UnknownHandle(absl::StrCat(what, ": "), "stream", stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Session::StreamBusy(uint64_t stream) {
  RETURN_IF_ERROR(CheckLocalStream("StreamQuery", stream));
  if (channel_ != nullptr) {
    if (KnownIdle(stream)) return false;
    const uint64_t issued = channel_->Issued();
    absl::StatusOr<bool> busy = channel_->QueryStream(stream);
    if (busy.ok() && !*busy) NoteIdle(stream, issued);
    return busy;
  }
  // Unpipelined (a debugging mode): a record of the stream's probe event,
  // then its status; two round trips.
  ASSIGN_OR_RETURN(uint64_t probe, Probe(stream));
  RETURN_IF_ERROR(RecordEvent(probe, stream));
  ASSIGN_OR_RETURN(bool complete, QueryEvent(probe));
  return !complete;
}

absl::StatusOr<uint64_t> Session::Probe(uint64_t stream) {
  {
    absl::MutexLock lock(&handles_mu_);
    if (auto it = probes_.find(stream); it != probes_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(uint64_t event, CreateEvent(0));
  absl::MutexLock lock(&handles_mu_);
  // Another thread may have made one meanwhile: either serves, the one
  // kept is destroyed with the stream (the other with the session).
  return probes_.try_emplace(stream, event).first->second;
}

absl::Status Session::WaitStream(uint64_t stream, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckLocalStream("SynchronizeStream", stream));
  ASSIGN_OR_RETURN(uint64_t probe, Probe(stream));
  RETURN_IF_ERROR(RecordEvent(probe, stream));
  return SynchronizeEventFor(probe, timeout);
}

absl::Status Session::SynchronizeEventFor(uint64_t event,
                                          absl::Duration timeout) {
  if (channel_ != nullptr) {
    RETURN_IF_ERROR(CheckLocalEvent("SynchronizeEvent", event, std::nullopt));
    return channel_->FenceEvent(event, timeout);
  }
  // The server drops an abandoned call's wait at once.
  v1::SynchronizeEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::SynchronizeEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::SynchronizeEvent,
               request, &response, "SynchronizeEvent", /*wait=*/true, timeout);
}

absl::Status Session::CheckLocalRange(uint64_t buffer, uint64_t offset,
                                      uint64_t size, uint64_t stream) {
  absl::MutexLock lock(&handles_mu_);
  if (stream != 0 && !streams_.contains(stream)) {
    return UnknownHandle("", "stream", stream);
  }
  auto it = buffer_sizes_.find(buffer);
  if (it == buffer_sizes_.end()) {
    return UnknownHandle("", "buffer", buffer);
  }
  if (offset > it->second || size > it->second - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "[", offset, ", ", offset, " + ", size, ") is outside buffer ", buffer,
        " of ", it->second, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Session::WriteAsync(uint64_t buffer, uint64_t offset,
                                 const void* data, uint64_t size,
                                 uint64_t stream) {
  if (channel_ == nullptr || size > kMaxPipelinedBytes) {
    return Upload(buffer, offset, data, size, stream);
  }
  ASSIGN_OR_RETURN(v1::PipelineCommand command,
                   WriteCommand(buffer, offset, data, size, stream));
  return channel_->Send(std::move(command));
}

absl::StatusOr<PendingRead> Session::ReadAsync(uint64_t buffer, uint64_t offset,
                                               void* data, uint64_t size,
                                               uint64_t stream) {
  if (channel_ == nullptr || size > kMaxPipelinedBytes) {
    return PendingRead(Download(buffer, offset, data, size, stream));
  }
  RETURN_IF_ERROR(CheckLocalRange(buffer, offset, size, stream));
  ASSIGN_OR_RETURN(uint64_t id,
                   channel_->SendRead(stream, buffer, offset, size, data));
  return PendingRead(this, id);
}

PendingRead& PendingRead::operator=(PendingRead&& other) noexcept {
  if (this != &other) {
    if (session_ != nullptr && session_->channel_ != nullptr) {
      session_->channel_->ForgetRead(id_);
    }
    session_ = std::exchange(other.session_, nullptr);
    id_ = std::exchange(other.id_, 0);
    done_ = std::move(other.done_);
  }
  return *this;
}

PendingRead::~PendingRead() {
  if (session_ != nullptr && session_->channel_ != nullptr) {
    session_->channel_->ForgetRead(id_);
  }
}

absl::Status PendingRead::Wait() {
  if (session_ == nullptr) return std::exchange(done_, absl::OkStatus());
  Session* session = std::exchange(session_, nullptr);
  if (session->channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "the session was closed before the read was waited for");
  }
  return session->channel_->WaitRead(id_);
}

absl::Status Session::WriteValues(uint64_t buffer, uint64_t offset,
                                  kernels::DType dtype,
                                  const std::vector<double>& values,
                                  uint64_t stream) {
  RETURN_IF_ERROR(Ordered());
  v1::WriteValuesRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_dtype(ToProtoDType(dtype));
  request.set_stream(stream);
  request.mutable_values()->Add(values.begin(), values.end());
  v1::WriteValuesResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::WriteValues, request,
               &response, "WriteValues");
}

absl::StatusOr<std::vector<double>> Session::ReadValues(uint64_t buffer,
                                                        uint64_t offset,
                                                        kernels::DType dtype,
                                                        uint64_t count,
                                                        uint64_t stream) {
  // Device->host: after all work issued before, reporting the session's
  // deferred errors.
  RETURN_IF_ERROR(Flush());
  v1::ReadValuesRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_dtype(ToProtoDType(dtype));
  request.set_count(count);
  request.set_stream(stream);
  v1::ReadValuesResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::ReadValues,
                        request, &response, "ReadValues"));
  // Callers index the values by what they asked for: a server's other
  // count would have them read past the end, or see too few.
  if (static_cast<uint64_t>(response.values_size()) != count) {
    return absl::InternalError(absl::StrCat("ReadValues: the server sent ",
                                            response.values_size(),
                                            " values for a read of ", count));
  }
  return std::vector<double>(response.values().begin(),
                             response.values().end());
}

absl::StatusOr<Executor> Session::GetWorkspaceSize(
    const std::string& op, const v1::OpParams& params,
    const std::map<std::string, TensorDesc>& tensors) {
  v1::GetWorkspaceSizeRequest request;
  request.set_session(token_);
  request.set_op(op);
  *request.mutable_params() = params;
  for (const auto& [name, desc] : tensors) {
    (*request.mutable_tensors())[name] = desc.ToProto();
  }
  // An operator this client's table does not know goes to the server.
  if (channel_ != nullptr && kernels::FindOp(op) != nullptr) {
    return PlanLocally(std::move(request));
  }
  RETURN_IF_ERROR(Ordered());
  v1::GetWorkspaceSizeResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Operators::Stub::GetWorkspaceSize, request,
                        &response, absl::StrCat(op, " GetWorkspaceSize")));
  return Executor(this, response.executor(), response.workspace_size());
}

// The typed wrappers of op_signatures.h: each sets its parameters and
// names its tensors for GetWorkspaceSize.
#define OPSERVER_SET_PARAM_FLOAT(field) params.set_##field(field);
#define OPSERVER_SET_PARAM_DOUBLE(field) params.set_##field(field);
#define OPSERVER_SET_PARAM_BOOL(field) params.set_##field(field);
#define OPSERVER_SET_PARAM_SCALAR(field)                          \
  params.mutable_##field()->set_dtype(ToProtoDType(field.dtype)); \
  params.mutable_##field()->set_value(field.value);
#define OPSERVER_SET_PARAM(KIND, aclnn_name, field) \
  OPSERVER_SET_PARAM_##KIND(field)
#define OPSERVER_SESSION_OP_DEFINITION(Name, in0, in1, out, PARAMS)   \
  absl::StatusOr<Executor> Session::Name(                             \
      const TensorDesc& in0,                                          \
      const TensorDesc& in1 PARAMS(OPSERVER_SESSION_PARAM),           \
      const TensorDesc& out) {                                        \
    v1::OpParams params;                                              \
    PARAMS(OPSERVER_SET_PARAM)                                        \
    return GetWorkspaceSize(#Name, params,                            \
                            {{#in0, in0}, {#in1, in1}, {#out, out}}); \
  }
OPSERVER_OPERATORS(OPSERVER_SESSION_OP_DEFINITION)
#undef OPSERVER_SESSION_OP_DEFINITION
#undef OPSERVER_SET_PARAM
#undef OPSERVER_SET_PARAM_SCALAR
#undef OPSERVER_SET_PARAM_BOOL
#undef OPSERVER_SET_PARAM_DOUBLE
#undef OPSERVER_SET_PARAM_FLOAT

absl::Status Session::ExecuteHandle(uint64_t executor, uint64_t stream,
                                    uint64_t workspace,
                                    uint64_t workspace_offset,
                                    uint64_t workspace_size) {
  if (channel_ != nullptr && executor >= kClientExecutorBase) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     LaunchCommand(executor, stream, workspace,
                                   workspace_offset, workspace_size));
    return channel_->Send(std::move(command));
  }
  RETURN_IF_ERROR(Ordered());
  v1::ExecuteRequest request;
  request.set_session(token_);
  request.set_executor(executor);
  request.set_workspace_buffer(workspace);
  request.set_workspace_offset(workspace_offset);
  request.set_workspace_size(workspace_size);
  request.set_stream(stream);
  v1::ExecuteResponse response;
  return Unary(*client_, routing_key_, &v1::Operators::Stub::Execute, request,
               &response, "Execute");
}

absl::StatusOr<v1::PipelineCommand> Session::LaunchCommand(
    uint64_t executor, uint64_t stream, uint64_t workspace,
    uint64_t workspace_offset, uint64_t workspace_size) {
  RETURN_IF_ERROR(CheckPipelined("Execute"));
  v1::PipelineCommand command;
  // The channel names the session once, not each launch.
  v1::ExecuteRequest& request = *command.mutable_launch();
  request.set_executor(executor);
  request.set_workspace_buffer(workspace);
  request.set_workspace_offset(workspace_offset);
  request.set_workspace_size(workspace_size);
  request.set_stream(stream);
  // Executors planned by unary calls are not known here: the server checks
  // them.
  if (executor < kClientExecutorBase) return command;
  // The checks the server would make first, so their errors are
  // immediate; the server makes them again.
  absl::MutexLock lock(&handles_mu_);
  if (stream != 0 && !streams_.contains(stream)) {
    return UnknownHandle("Execute: ", "stream", stream);
  }
  auto it = executors_.find(executor);
  if (it == executors_.end()) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr,
        executor < next_executor_ ? absl::StatusCode::kFailedPrecondition
                                  : absl::StatusCode::kNotFound,
        absl::StrCat("Execute: executor ", executor,
                     executor < next_executor_
                         ? " was already consumed by a launch or "
                           "destroyed; call GetWorkspaceSize again, or "
                           "make it repeatable before its first launch"
                         : " was never created in this session"));
  }
  const uint64_t needed = it->second.workspace_size;
  if (needed > 0) {
    if (workspace_size < needed) {
      return kernels::ParamInvalid(absl::StrCat(
          "Execute: workspaceSize ", workspace_size, " is smaller than the ",
          needed, " bytes GetWorkspaceSize reported"));
    }
    auto buffer = buffer_sizes_.find(workspace);
    if (buffer == buffer_sizes_.end()) {
      return kernels::AclnnError(
          kernels::kAclnnErrParamInvalid, absl::StatusCode::kNotFound,
          absl::StrCat("Execute: workspace: no buffer ", workspace,
                       " in this session (never created, freed, or "
                       "another session's)"));
    }
    if (workspace_offset > buffer->second ||
        workspace_size > buffer->second - workspace_offset) {
      return kernels::ParamInvalid(
          absl::StrCat("Execute: workspace: bytes [", workspace_offset, ", +",
                       workspace_size, ") run past the end of its buffer of ",
                       buffer->second, " bytes"));
    }
  }
  if (!it->second.repeatable) executors_.erase(it);
  return command;
}

absl::Status Session::SetExecutorRepeatable(uint64_t executor) {
  if (channel_ != nullptr && executor >= kClientExecutorBase) {
    {
      absl::MutexLock lock(&handles_mu_);
      auto it = executors_.find(executor);
      if (it == executors_.end()) {
        return kernels::AclnnError(
            kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
            absl::StrCat("SetExecutorRepeatable: no executor ", executor,
                         " in this session (never created, already "
                         "consumed, or destroyed)"));
      }
      it->second.repeatable = true;
    }
    v1::PipelineCommand command;
    command.set_set_executor_repeatable(executor);
    return channel_->Send(std::move(command));
  }
  RETURN_IF_ERROR(Ordered());
  v1::SetExecutorRepeatableRequest request;
  request.set_session(token_);
  request.set_executor(executor);
  v1::SetExecutorRepeatableResponse response;
  return Unary(*client_, routing_key_,
               &v1::Operators::Stub::SetExecutorRepeatable, request, &response,
               "SetExecutorRepeatable");
}

absl::Status Session::DestroyExecutor(uint64_t executor) {
  if (channel_ != nullptr && executor >= kClientExecutorBase) {
    {
      absl::MutexLock lock(&handles_mu_);
      if (executors_.erase(executor) == 0) {
        return kernels::AclnnError(
            kernels::kAclnnErrInnerNullptr, absl::StatusCode::kNotFound,
            absl::StrCat("DestroyExecutor: no executor ", executor,
                         " in this session (never created, already "
                         "consumed, or destroyed)"));
      }
    }
    v1::PipelineCommand command;
    command.set_destroy_executor(executor);
    return channel_->Send(std::move(command));
  }
  RETURN_IF_ERROR(Ordered());
  v1::DestroyExecutorRequest request;
  request.set_session(token_);
  request.set_executor(executor);
  v1::DestroyExecutorResponse response;
  return Unary(*client_, routing_key_, &v1::Operators::Stub::DestroyExecutor,
               request, &response, "DestroyExecutor");
}

// ------------------------------------------------- memory ops and events

absl::Status Session::Memset(uint64_t buffer, uint64_t offset, uint64_t size,
                             uint8_t value, uint64_t stream) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     MemsetCommand(buffer, offset, size, value, stream));
    return channel_->Send(std::move(command));
  }
  v1::MemsetRequest request;
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_value(value);
  request.set_stream(stream);
  request.set_session(token_);
  v1::MemsetResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::Memset, request,
               &response, "Memset");
}

absl::Status Session::CopyOnDevice(uint64_t dst_buffer, uint64_t dst_offset,
                                   uint64_t src_buffer, uint64_t src_offset,
                                   uint64_t size, uint64_t stream) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     CopyCommand(dst_buffer, dst_offset, src_buffer, src_offset,
                                 size, stream));
    return channel_->Send(std::move(command));
  }
  v1::CopyDeviceToDeviceRequest request;
  request.set_dst_buffer(dst_buffer);
  request.set_dst_offset(dst_offset);
  request.set_src_buffer(src_buffer);
  request.set_src_offset(src_offset);
  request.set_size(size);
  request.set_stream(stream);
  request.set_session(token_);
  v1::CopyDeviceToDeviceResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::CopyDeviceToDevice,
               request, &response, "CopyDeviceToDevice");
}

absl::Status Session::CheckLocalEvent(absl::string_view what, uint64_t event,
                                      std::optional<uint64_t> stream) {
  absl::MutexLock lock(&handles_mu_);
  if (!events_.contains(event)) {
    return UnknownHandle(absl::StrCat(what, ": "), "event", event);
  }
  if (stream.has_value() && *stream != 0 && !streams_.contains(*stream)) {
    return UnknownHandle(absl::StrCat(what, ": "), "stream", *stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::CreateEvent(uint32_t flags) {
  if (channel_ != nullptr) {
    // The server's rule, so the error is immediate; the server checks
    // again.
    RETURN_IF_ERROR(CheckEventFlags(flags), [](absl::Status s) {
      return absl::Status(s.code(), absl::StrCat("CreateEvent: ", s.message()));
    });
    absl::MutexLock lock(&handles_mu_);
    const uint64_t id = next_executor_++;
    v1::PipelineCommand command;
    command.mutable_create_event()->set_event(id);
    command.mutable_create_event()->set_flags(flags);
    // Sent under the lock that chose the id: the server takes ids only in
    // increasing order (see PlanLocally).
    RETURN_IF_ERROR(channel_->Send(std::move(command)));
    events_.insert(id);
    return id;
  }
  v1::CreateEventRequest request;
  request.set_session(token_);
  request.set_flags(flags);
  v1::CreateEventResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::CreateEvent,
                        request, &response, "CreateEvent"));
  return response.event();
}

absl::Status Session::DestroyEvent(uint64_t event) {
  if (channel_ != nullptr) {
    {
      absl::MutexLock lock(&handles_mu_);
      if (events_.erase(event) == 0) {
        return UnknownHandle("DestroyEvent: ", "event", event);
      }
    }
    v1::PipelineCommand command;
    command.set_destroy_event(event);
    return channel_->Send(std::move(command));
  }
  v1::DestroyEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::DestroyEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::DestroyEvent,
               request, &response, "DestroyEvent");
}

absl::Status Session::RecordEvent(uint64_t event, uint64_t stream) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     RecordEventCommand(event, stream));
    return channel_->Send(std::move(command));
  }
  v1::RecordEventRequest request;
  request.set_event(event);
  request.set_stream(stream);
  request.set_session(token_);
  v1::RecordEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::RecordEvent, request,
               &response, "RecordEvent");
}

absl::Status Session::StreamWaitEvent(uint64_t stream, uint64_t event) {
  if (channel_ != nullptr) {
    ASSIGN_OR_RETURN(v1::PipelineCommand command,
                     WaitEventCommand(stream, event));
    return channel_->Send(std::move(command));
  }
  v1::StreamWaitEventRequest request;
  request.set_stream(stream);
  request.set_event(event);
  request.set_session(token_);
  v1::StreamWaitEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::StreamWaitEvent,
               request, &response, "StreamWaitEvent");
}

absl::Status Session::ResetEvent(uint64_t event, uint64_t stream) {
  v1::ResetEventRequest request;
  request.set_event(event);
  request.set_stream(stream);
  if (channel_ != nullptr) {
    RETURN_IF_ERROR(CheckLocalEvent("ResetEvent", event, stream));
    v1::PipelineCommand command;
    *command.mutable_reset_event() = std::move(request);
    return channel_->Send(std::move(command));
  }
  request.set_session(token_);
  v1::ResetEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::ResetEvent, request,
               &response, "ResetEvent");
}

absl::StatusOr<uint64_t> Session::LaunchCallback(
    uint64_t stream, bool block,
    std::function<void(uint64_t, absl::Status)> reached) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "host callbacks need the command channel (ConnectOptions::pipeline): "
        "the server tells it when a stream reaches one");
  }
  RETURN_IF_ERROR(CheckLocalStream("LaunchCallback", stream));
  return channel_->SendCallback(stream, block, std::move(reached));
}

absl::Status Session::ReleaseCallback(uint64_t id) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "host callbacks need the command channel");
  }
  return channel_->ReleaseCallback(id);
}

absl::Status Session::SetStreamFailureMode(uint64_t stream, bool stop) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "stream failure modes need the command channel "
        "(ConnectOptions::pipeline)");
  }
  RETURN_IF_ERROR(CheckLocalStream("SetStreamFailureMode", stream));
  v1::PipelineCommand command;
  command.mutable_stream_failure_mode()->set_stream(stream);
  command.mutable_stream_failure_mode()->set_stop(stop);
  return channel_->Send(std::move(command));
}

absl::Status Session::SetOpTimeouts(uint64_t execute_ms, uint64_t wait_ms) {
  if (channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "operator time-outs need the command channel "
        "(ConnectOptions::pipeline)");
  }
  if (execute_ms > kMaxOpTimeoutMs || wait_ms > kMaxOpTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "operator time-outs of ", execute_ms, " ms (execute) and ", wait_ms,
        " ms (wait): at most ", kMaxOpTimeoutMs, " ms each (0: none)"));
  }
  v1::PipelineCommand command;
  command.mutable_op_timeouts()->set_execute_timeout_ms(execute_ms);
  command.mutable_op_timeouts()->set_wait_timeout_ms(wait_ms);
  return channel_->Send(std::move(command));
}

absl::StatusOr<bool> Session::QueryEvent(uint64_t event) {
  // The records issued before this call are on the server first.
  RETURN_IF_ERROR(Ordered());
  v1::QueryEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::QueryEventResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::QueryEvent,
                        request, &response, "QueryEvent"));
  return response.complete();
}

absl::Status Session::SynchronizeEvent(uint64_t event) {
  if (channel_ != nullptr) {
    RETURN_IF_ERROR(CheckLocalEvent("SynchronizeEvent", event, std::nullopt));
    return channel_->FenceEvent(event);
  }
  v1::SynchronizeEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::SynchronizeEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::SynchronizeEvent,
               request, &response, "SynchronizeEvent", /*wait=*/true);
}

absl::StatusOr<float> Session::EventElapsedMs(uint64_t start, uint64_t end) {
  RETURN_IF_ERROR(Ordered());
  v1::EventElapsedTimeRequest request;
  request.set_session(token_);
  request.set_start(start);
  request.set_end(end);
  v1::EventElapsedTimeResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Runtime::Stub::EventElapsedTime, request,
                        &response, "EventElapsedTime"));
  return response.ms();
}

// ------------------------------------------------------------------ graphs

absl::Status Session::CheckPipelined(absl::string_view what) const {
  if (channel_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": graphs need a pipelined session (ConnectOptions::pipeline)"));
}

absl::StatusOr<v1::PipelineCommand> Session::MemsetCommand(uint64_t buffer,
                                                           uint64_t offset,
                                                           uint64_t size,
                                                           uint8_t value,
                                                           uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("Memset"));
  if (absl::Status s = CheckLocalRange(buffer, offset, size, stream); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("Memset: ", s.message()));
  }
  v1::PipelineCommand command;
  v1::MemsetRequest& request = *command.mutable_memset();
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_value(value);
  request.set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::CopyCommand(
    uint64_t dst_buffer, uint64_t dst_offset, uint64_t src_buffer,
    uint64_t src_offset, uint64_t size, uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("CopyOnDevice"));
  absl::Status s = CheckLocalRange(src_buffer, src_offset, size, stream);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("CopyOnDevice: source ", s.message()));
  }
  s = CheckLocalRange(dst_buffer, dst_offset, size, stream);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("CopyOnDevice: destination ", s.message()));
  }
  v1::PipelineCommand command;
  v1::CopyDeviceToDeviceRequest& request = *command.mutable_copy();
  request.set_dst_buffer(dst_buffer);
  request.set_dst_offset(dst_offset);
  request.set_src_buffer(src_buffer);
  request.set_src_offset(src_offset);
  request.set_size(size);
  request.set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::WriteCommand(uint64_t buffer,
                                                          uint64_t offset,
                                                          const void* data,
                                                          uint64_t size,
                                                          uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("WriteAsync"));
  if (size > kMaxPipelinedBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteAsync: a pipelined write of ", size,
                     " bytes is over the limit of ", kMaxPipelinedBytes));
  }
  RETURN_IF_ERROR(CheckLocalRange(buffer, offset, size, stream));
  v1::PipelineCommand command;
  v1::WriteCommand& write = *command.mutable_write();
  write.set_buffer(buffer);
  write.set_offset(offset);
  write.set_data(static_cast<const char*>(data), size);
  write.set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::RecordEventCommand(
    uint64_t event, uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("RecordEvent"));
  RETURN_IF_ERROR(CheckLocalEvent("RecordEvent", event, stream));
  v1::PipelineCommand command;
  command.mutable_record_event()->set_event(event);
  command.mutable_record_event()->set_stream(stream);
  return command;
}

absl::StatusOr<v1::PipelineCommand> Session::WaitEventCommand(uint64_t stream,
                                                              uint64_t event) {
  RETURN_IF_ERROR(CheckPipelined("StreamWaitEvent"));
  RETURN_IF_ERROR(CheckLocalEvent("StreamWaitEvent", event, stream));
  v1::PipelineCommand command;
  command.mutable_wait_event()->set_stream(stream);
  command.mutable_wait_event()->set_event(event);
  return command;
}

absl::StatusOr<uint64_t> Session::DefineGraph(
    std::vector<v1::PipelineCommand> tasks) {
  RETURN_IF_ERROR(CheckPipelined("DefineGraph"));
  if (tasks.empty()) {
    return absl::InvalidArgumentError("DefineGraph: a graph has no tasks");
  }
  v1::PipelineCommand command;
  v1::DefineGraphCommand& define = *command.mutable_define_graph();
  define.mutable_tasks()->Reserve(static_cast<int>(tasks.size()));
  for (size_t i = 0; i < tasks.size(); ++i) {
    switch (tasks[i].command_case()) {
      case v1::PipelineCommand::kLaunch:
      case v1::PipelineCommand::kMemset:
      case v1::PipelineCommand::kCopy:
      case v1::PipelineCommand::kWrite:
      case v1::PipelineCommand::kRecordEvent:
      case v1::PipelineCommand::kWaitEvent:
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            "DefineGraph: task ", i + 1, " of ", tasks.size(),
            " is not a launch, memset, copy, write, record_event or "
            "wait_event"));
    }
    *define.add_tasks() = std::move(tasks[i]);
  }
  // Sized with a placeholder id of the same width as the real one.
  define.set_graph(kClientExecutorBase);
  if (const uint64_t bytes = command.ByteSizeLong();
      bytes > kMaxGraphDefinitionBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("DefineGraph: the definition takes ", bytes,
                     " bytes, over the limit of ", kMaxGraphDefinitionBytes,
                     " (fewer or smaller writes, or fewer tasks)"));
  }
  absl::MutexLock lock(&handles_mu_);
  const uint64_t id = next_executor_++;
  define.set_graph(id);
  // Sent under the lock that chose the id (see PlanLocally).
  RETURN_IF_ERROR(channel_->Send(std::move(command)));
  graphs_.insert(id);
  return id;
}

absl::Status Session::ReplayGraph(uint64_t graph, uint64_t stream) {
  RETURN_IF_ERROR(CheckPipelined("ReplayGraph"));
  {
    absl::MutexLock lock(&handles_mu_);
    if (!graphs_.contains(graph)) {
      return UnknownHandle("ReplayGraph: ", "graph", graph);
    }
    if (stream != 0 && !streams_.contains(stream)) {
      return UnknownHandle("ReplayGraph: ", "stream", stream);
    }
  }
  v1::PipelineCommand command;
  command.mutable_replay_graph()->set_graph(graph);
  command.mutable_replay_graph()->set_stream(stream);
  return channel_->Send(std::move(command));
}

absl::Status Session::DestroyGraph(uint64_t graph) {
  RETURN_IF_ERROR(CheckPipelined("DestroyGraph"));
  {
    absl::MutexLock lock(&handles_mu_);
    if (graphs_.erase(graph) == 0) {
      return UnknownHandle("DestroyGraph: ", "graph", graph);
    }
  }
  v1::PipelineCommand command;
  command.set_destroy_graph(graph);
  return channel_->Send(std::move(command));
}

}  // namespace remote
}  // namespace opserver
