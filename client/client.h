#ifndef OPSERVER_CLIENT_CLIENT_H_
#define OPSERVER_CLIENT_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/command_channel.h"
#include "client/connect_options.h"
#include "client/session_handles.h"
#include "client/transfer_watchdog.h"
#include "common/data_path.h"
#include "common/listen_address.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kernels/dtype.h"
#include "kernels/op_signatures.h"
#include "proto/opserver.grpc.pb.h"

// Everything lives in opserver::remote (the server has its own Session,
// Stream and Executor in opserver); Client and ConnectOptions are also
// reachable as opserver::Client and opserver::ConnectOptions.
namespace opserver {
namespace remote {

// A client token file: the token on its first non-blank line, surrounding
// whitespace removed. INVALID_ARGUMENT naming the path when it cannot be
// read or holds no token.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The one place where a grpc::Status becomes an absl::Status: same canonical
// code, the message prefixed with `what`, and the aclnn status from the
// trailing metadata key "opserver-aclnn-status" as the kernels' payload (so
// kernels::GetAclnnStatus() returns the server's exact code; without the key
// it is derived from the canonical code).
absl::Status FromGrpcStatus(const grpc::Status& status,
                            const grpc::ClientContext& context,
                            absl::string_view what);

// Whether a failed call's `status` is the connection's, not a server's
// verdict: UNAVAILABLE without the aclnn trailer every server error carries
// (the server was killed, its host went down, or the network broke).
bool IsConnectionLoss(const grpc::Status& status,
                      const grpc::ClientContext& context);

class Session;

// The C++ thin client of an opserver. Thread-safe.
//
//   auto client = Client::Connect("127.0.0.1:50051");
//   if (!client.ok()) ...;
//   auto info = (*client)->GetDeviceInfo();
//   auto session = (*client)->CreateSession("trainer-3");
class Client {
 public:
  // Dials `address` (HOST:PORT) and waits until the channel is ready.
  // UNAVAILABLE (naming the address) when no server answers in time or the
  // TLS handshake fails; INVALID_ARGUMENT when a TLS file cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& address, const ConnectOptions& options = {});

  const std::string& address() const { return address_; }
  const ConnectOptions& options() const { return options_; }

  absl::StatusOr<v1::GetDeviceInfoResponse> GetDeviceInfo();

  // The server's devices, index 0 first (GetDeviceInfo's list): what
  // CreateSession's `device` may name. A server that predates the list owns
  // one device, built here from GetDeviceInfo's top-level fields.
  absl::StatusOr<std::vector<v1::DeviceInfo>> ListDevices();

  // grpc.health.v1 Check for `service` ("" = the whole server); returns e.g.
  // "SERVING".
  absl::StatusOr<std::string> CheckHealth(const std::string& service = "");

  absl::StatusOr<v1::ListOperatorsResponse> ListOperators();

  // Opens a session on device `device` (an index into ListDevices()):
  // every buffer, stream, launch and transfer of the session is on that
  // device. INVALID_ARGUMENT naming the device and the count when the
  // server has no such device. With `attach`, its life is also bound to an
  // Attach call held open on a background thread, so the server frees
  // everything the session owns when this process dies or loses the
  // connection.
  absl::StatusOr<std::unique_ptr<Session>> CreateSession(
      const std::string& client_name, bool attach = true, uint32_t device = 0);

  // A call's `status` through FromGrpcStatus, with a connection loss said
  // the same way on every surface: "WHAT: server at ADDRESS went away
  // (gRPC's words)", UNAVAILABLE.
  absl::Status CallStatus(const grpc::Status& status,
                          const grpc::ClientContext& context,
                          absl::string_view what) const;
  // UNAVAILABLE "server at ADDRESS went away (DETAIL)", with the aclnn
  // runtime error.
  absl::Status WentAway(absl::string_view detail) const;

  // The stubs, for calls this class does not wrap.
  v1::Runtime::Stub& runtime() { return *runtime_; }
  v1::Operators::Stub& operators() { return *operators_; }
  // The channel, for calls that move raw messages (Session::Upload and
  // Download serialize and parse their data by hand to avoid copies).
  grpc::Channel& channel() { return *channel_; }

  // Sets the per-call deadline (ConnectOptions::call_timeout) on `context`,
  // and the token (see Authorize).
  void SetDeadline(grpc::ClientContext* context) const;
  // Sets ConnectOptions::wait_timeout on `context`, and the token.
  void SetWaitDeadline(grpc::ClientContext* context) const;
  // Adds the "authorization: Bearer TOKEN" metadata when
  // ConnectOptions::token is set. Per call rather than as channel call
  // credentials because gRPC refuses call credentials on plaintext channels,
  // and loopback servers may require tokens too.
  void Authorize(grpc::ClientContext* context) const;

  // Connection `i` (from 0, below transfer_connections) of uploads
  // (`upload`) or of downloads: neither channel() nor the other
  // direction's (see ConnectOptions::transfer_connections). Made on first
  // use; it connects with its first call, which fails as a call on
  // channel() would when the server cannot be reached.
  grpc::Channel* TransferChannel(bool upload, size_t i);
  // All transfer_connections of them, connected, for a split transfer.
  // UNAVAILABLE when one cannot be connected within connect_timeout (the
  // transfer is one call then, and the next one tries again).
  absl::StatusOr<std::vector<grpc::Channel*>> TransferChannels(bool upload);
  // Ends transfer calls that stop moving data
  // (ConnectOptions::transfer_idle_timeout).
  TransferWatchdog& transfer_watchdog() { return transfer_watchdog_; }

  // Whether transfers may try the server's data path: ConnectOptions::
  // data_path on, no TLS, and DisableDataPath not called.
  bool DataPathOn() const;
  // The host of the HOST:PORT this client dialed, where the server's data
  // port is unless the server advertises another address; empty for gRPC's
  // target forms ("dns:///host:port"), which reach the data path only
  // through an advertised address.
  const std::string& DialedHost() const { return dialed_host_; }
  // Transfers stop using the data path, for `why` (printed once).
  void DisableDataPath(const absl::Status& why);
  // One transfer went through gRPC after its data-path connections kept
  // failing, for `why` (printed the first time only); the next transfers
  // still try the data path.
  void NoteDataPathFallback(const absl::Status& why);
  // A data-path connection to `target` that an earlier transfer kept
  // (ConnectOptions::keep_data_connections), or an invalid one when none
  // is left open: one the server has closed meanwhile is dropped here.
  UniqueFd TakeDataConnection(const ListenAddress& target);
  // Keeps `connection` (to `target`, with no transfer on it) for the next
  // transfer; closed instead when kMaxKeptDataConnections are kept.
  void KeepDataConnection(const ListenAddress& target, UniqueFd connection);
  static constexpr size_t kMaxKeptDataConnections = 4;
  // Where the data path's connections go, once a transfer kept one (the
  // address a pipelined data_transfer's connection must reach); unset
  // before.
  std::optional<ListenAddress> KeptDataTarget();
  void NoteKeptDataTarget(const ListenAddress& target);

 private:
  Client(std::string address, std::shared_ptr<grpc::Channel> channel,
         std::shared_ptr<grpc::ChannelCredentials> credentials,
         grpc::ChannelArguments args, const ConnectOptions& options,
         bool data_path, std::string dialed_host);

  const std::string address_;
  const ConnectOptions options_;
  // What channel_ was made with, for the transfer connections.
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const grpc::ChannelArguments args_;
  absl::Mutex transfer_mu_;
  // Uploads' [0], downloads' [1].
  std::vector<std::shared_ptr<grpc::Channel>> transfer_channels_[2]
      ABSL_GUARDED_BY(transfer_mu_);
  TransferWatchdog transfer_watchdog_;
  const std::string dialed_host_;
  std::atomic<bool> data_path_off_;
  std::atomic<bool> data_path_fallback_noted_{false};
  absl::Mutex kept_mu_;
  // Idle data connections and where each goes ("HOST:PORT"), oldest first.
  std::vector<std::pair<std::string, UniqueFd>> kept_data_connections_
      ABSL_GUARDED_BY(kept_mu_);
  std::optional<ListenAddress> kept_target_ ABSL_GUARDED_BY(kept_mu_);
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Runtime::Stub> runtime_;
  std::unique_ptr<v1::Operators::Stub> operators_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

// A session on the server: owns every buffer, stream and executor made
// through it. Destroying it closes the session (freeing all of them on the
// server). It must not outlive its Client, and the RAII handles made through
// it must not outlive it. Thread-safe.
class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& token() const { return token_; }
  // The session's routing key (common/session_routing.h): chosen here
  // before CreateSession and sent with every call made for the session, so
  // a proxy in front of several servers keeps them on one.
  const std::string& routing_key() const { return routing_key_; }
  // Adds the routing key to `context` (for calls made on the session
  // outside this class, e.g. the C API's GetServerStats).
  void Route(grpc::ClientContext* context) const;
  Client& client() { return *client_; }
  // The device the session was created on (Client::CreateSession).
  uint32_t device() const { return device_; }

  // Closes the session now (idempotent). Pipelined: what was queued is
  // delivered first, and a deferred error still pending is returned.
  absl::Status Close();
  // Pipelined: waits until everything queued has run and returns the
  // session's pending deferred error (commands without a stream: frees,
  // executor calls, plans never launched). OK when not pipelined.
  absl::Status Flush();

  // OK unless the session's Attach call ended without Close(): the server
  // then freed the session and everything in it (it restarted, closed the
  // session, or the connection broke), and NOT_FOUND says so. Calls are not
  // checked against it; callers that want a clear error ask first.
  absl::Status Lost() const;

  absl::StatusOr<v1::SessionStats> Stats();

  // Device memory.
  absl::StatusOr<DeviceBuffer> Malloc(uint64_t size);
  absl::Status FreeBuffer(uint64_t buffer);

  // Streams.
  absl::StatusOr<Stream> CreateStream();
  absl::Status DestroyStream(uint64_t stream);
  // Pipelined: no round trip when only transfers ran on the stream since a
  // synchronize of it succeeded (no command queued work on it since), and
  // every one has ended well: their own calls reported their end, so the
  // stream is idle with no error to report, as aclrtStreamQuery already
  // answers locally. A synchronize with nothing since still asks the server
  // (it may be asked for a failure the server found without any work: the
  // session closed).
  absl::Status Synchronize(uint64_t stream = 0);
  // Whether `stream` has work queued or running on the server
  // (aclrtStreamQuery). Pipelined: no round trip when the stream is known
  // idle (a synchronize or query of it found it idle, no command queued
  // work on it since, and no UploadAsync or DownloadAsync on it is moving),
  // else one (a query fence). Otherwise two (a record of the stream's probe
  // event and its query).
  absl::StatusOr<bool> StreamBusy(uint64_t stream);
  // Waits until the work queued on `stream` so far has run, at most
  // `timeout` (DEADLINE_EXCEEDED then, the work still queued and running):
  // a record of the stream's probe event, waited for. It takes no deferred
  // error: Synchronize, called next, returns it.
  absl::Status WaitStream(uint64_t stream, absl::Duration timeout);

  // Streams `size` bytes from `data` into buffer[offset, offset + size) in
  // chunks of ConnectOptions::upload_chunk_bytes, after the work queued on
  // `stream`. The chunks go to the socket straight from `data` (no copy);
  // nothing refers to `data` once this returns. Large uploads go over
  // several connections (ConnectOptions::transfer_connections), the extra
  // parts on short-lived streams of their own, with the same ordering: no
  // byte lands before the work queued on `stream` is done.
  absl::Status Upload(uint64_t buffer, uint64_t offset, const void* data,
                      uint64_t size, uint64_t stream = 0);
  // Streams buffer[offset, offset + size) into `data`, each chunk copied
  // once, from the received message straight to its place, after the work
  // queued on `stream`. INTERNAL when the server sends more or fewer bytes
  // than asked for, or a message that is not a DownloadResponse; `data` may
  // then hold part of the range. Large downloads are split like uploads.
  absl::Status Download(uint64_t buffer, uint64_t offset, void* data,
                        uint64_t size, uint64_t stream = 0);

  // Small transfers that cost no round trip of their own: on a pipelined
  // session, `size` up to kMaxPipelinedBytes travels on the command
  // channel, in order with the launches around it.
  //
  // WriteAsync copies `data` and returns at once; the bytes land in
  // buffer[offset, offset + size) after the work queued on `stream` before
  // it. Errors only the server finds are the stream's deferred errors.
  // Larger writes, or any on a session that is not pipelined, are Uploads
  // (and wait).
  absl::Status WriteAsync(uint64_t buffer, uint64_t offset, const void* data,
                          uint64_t size, uint64_t stream = 0);
  // Queues a read of buffer[offset, offset + size) into `data` after the
  // work queued on `stream`, and returns at once; PendingRead::Wait() waits
  // for the bytes and reports the stream's deferred error (consuming it, as
  // Synchronize does). `data` must stay valid until Wait() returns or the
  // PendingRead is gone. Larger reads, or any on a session that is not
  // pipelined, are downloads made here, after the work queued on `stream`
  // only (not, as Download, after the whole session's): Wait() returns
  // their status, and a deferred error of the stream stays for its next
  // Synchronize.
  absl::StatusOr<PendingRead> ReadAsync(uint64_t buffer, uint64_t offset,
                                        void* data, uint64_t size,
                                        uint64_t stream = 0);
  // An upload that returns once the server has ordered it on `stream`,
  // before its bytes move: over the data path, the bytes then go on a
  // thread of their own, read from `data` until the returned copy's Wait()
  // returns (or the copy is dropped, which cancels what is left of it).
  // Wait() gives the transfer's status. Where the data path cannot be used
  // (off, below ConnectOptions::data_path_bytes, refused, unreachable) this
  // is Upload, done before it returns. Errors the server finds at once
  // (ranges, handles) are returned here.
  absl::StatusOr<PendingRead> UploadAsync(uint64_t buffer, uint64_t offset,
                                          const void* data, uint64_t size,
                                          uint64_t stream = 0);
  // The other way: a download into `data` that returns once the server has
  // ordered it on `stream`, its bytes written into `data` on a thread of
  // their own until Wait() returns (dropped, the copy is cancelled: `data`
  // may hold part of the bytes, and nothing is written after the drop).
  // Where the data path cannot be used, a download done before it returns.
  absl::StatusOr<PendingRead> DownloadAsync(uint64_t buffer, uint64_t offset,
                                            void* data, uint64_t size,
                                            uint64_t stream = 0);

  // Device memory operations executed on the server, ordered on `stream`
  // (aclrtMemsetAsync, device-to-device aclrtMemcpyAsync): no bytes travel.
  // Pipelined: checked here against the buffers and streams this session
  // made (NOT_FOUND, OUT_OF_RANGE at once), queued, and returned at once;
  // what only the server finds is the stream's deferred error. Otherwise
  // the unary call, which returns once queued. Memset sets buffer[offset,
  // offset + size) to `value`; CopyOnDevice copies src_buffer[src_offset,
  // + size) to dst_buffer[dst_offset, + size), the ranges may overlap.
  absl::Status Memset(uint64_t buffer, uint64_t offset, uint64_t size,
                      uint8_t value, uint64_t stream = 0);
  absl::Status CopyOnDevice(uint64_t dst_buffer, uint64_t dst_offset,
                            uint64_t src_buffer, uint64_t src_offset,
                            uint64_t size, uint64_t stream = 0);

  // Events (aclrtEvent; see Runtime.CreateEvent in proto/opserver.proto).
  // Pipelined, CreateEvent, DestroyEvent, RecordEvent, StreamWaitEvent and
  // ResetEvent cost no round trip: the event id is chosen here, handle
  // errors this session can see are immediate (an unknown event or stream:
  // NOT_FOUND; unknown flag bits: INVALID_ARGUMENT), and the rest is the
  // deferred error of the stream (record, wait, reset) or the session
  // (create, destroy). Not pipelined, each is its unary call.
  //
  // `flags`: CANN's ACL_EVENT_* bits (runtime/event.h).
  absl::StatusOr<uint64_t> CreateEvent(uint32_t flags = 0);
  absl::Status DestroyEvent(uint64_t event);
  // The event captures the work queued on `stream` so far.
  absl::Status RecordEvent(uint64_t event, uint64_t stream = 0);
  // Work queued on `stream` after this waits for the event's most recent
  // record (issued before this call) to complete; no thread waits.
  absl::Status StreamWaitEvent(uint64_t stream, uint64_t event);
  absl::Status ResetEvent(uint64_t event, uint64_t stream = 0);
  // True once the most recent record completed (or the event is not
  // recorded). Waits until the channel's commands took effect first.
  absl::StatusOr<bool> QueryEvent(uint64_t event);
  // Blocks until the event's most recent record has completed.
  absl::Status SynchronizeEvent(uint64_t event);
  // The same, giving up after `timeout` (DEADLINE_EXCEEDED; the record
  // stays in force).
  absl::Status SynchronizeEventFor(uint64_t event, absl::Duration timeout);
  // Milliseconds between the completions of `start`'s and `end`'s most
  // recent records, measured by the server. FAILED_PRECONDITION with aclnn
  // status 107006 when either has not completed a record.
  absl::StatusOr<float> EventElapsedMs(uint64_t start, uint64_t end);

  // Host callbacks (aclrtLaunchCallback; see CallbackCommand in
  // proto/opserver.proto): queues a callback on `stream` and returns its id
  // at once; `reached(id, status)` is called once, on the channel's
  // reader thread, when the server says the stream reached it (OK) or
  // that it never will (the error). With `block`, the stream waits for
  // ReleaseCallback(id) (or the server's time-out). Pipelined sessions
  // only: FAILED_PRECONDITION otherwise (a unary session has nobody to
  // hear the server; Operators.LaunchCallback is there for people).
  absl::StatusOr<uint64_t> LaunchCallback(
      uint64_t stream, bool block,
      std::function<void(uint64_t, absl::Status)> reached);
  absl::Status ReleaseCallback(uint64_t id);

  // aclrtSetStreamFailureMode (`stop`: ACL_STOP_ON_FAILURE) and the
  // session's operator time-outs in milliseconds (0: none), as
  // StreamFailureModeCommand and OpTimeoutsCommand in proto/opserver.proto
  // say: queued on the command channel in order with the work around
  // them, no round trip; what only the server finds is the session's
  // deferred error. Pipelined sessions only: FAILED_PRECONDITION otherwise.
  absl::Status SetStreamFailureMode(uint64_t stream, bool stop);
  absl::Status SetOpTimeouts(uint64_t execute_ms, uint64_t wait_ms);

  // Typed values (converted by the server). ReadValues returns exactly
  // `count` values, or INTERNAL when the server sent another number.
  absl::Status WriteValues(uint64_t buffer, uint64_t offset,
                           kernels::DType dtype,
                           const std::vector<double>& values,
                           uint64_t stream = 0);
  absl::StatusOr<std::vector<double>> ReadValues(uint64_t buffer,
                                                 uint64_t offset,
                                                 kernels::DType dtype,
                                                 uint64_t count,
                                                 uint64_t stream = 0);

  // Phase one of each operator in OPSERVER_OPERATORS (op_signatures.h):
  // checks the arguments and returns the plan. The arguments are aclnn's,
  // in its order; a FLOAT or DOUBLE parameter is a double, SCALAR a
  // ScalarValue, BOOL a bool:
  //   ThresholdBackward(grad_output, self, threshold, out)
  //   SoftshrinkBackward(grad_output, self, lambd, grad_input)
  //   HardswishBackward(grad_output, self, out)
  //   LeakyReluBackward(grad_output, self, negative_slope, self_is_result,
  //                     out)
  //   DropoutBackward(grad_output, mask, scale, out)
  // Failures carry the aclnn status (kernels::GetAclnnStatus).
  // (The parameter macros stay defined: client.cc's definitions use them.)
#define OPSERVER_SESSION_PARAM_FLOAT double
#define OPSERVER_SESSION_PARAM_DOUBLE double
#define OPSERVER_SESSION_PARAM_BOOL bool
#define OPSERVER_SESSION_PARAM_SCALAR const ScalarValue&
#define OPSERVER_SESSION_PARAM(KIND, aclnn_name, field) \
  , OPSERVER_SESSION_PARAM_##KIND field
#define OPSERVER_SESSION_OP(Name, in0, in1, out, PARAMS)    \
  absl::StatusOr<Executor> Name(                            \
      const TensorDesc& in0,                                \
      const TensorDesc& in1 PARAMS(OPSERVER_SESSION_PARAM), \
      const TensorDesc& out);
  OPSERVER_OPERATORS(OPSERVER_SESSION_OP)
#undef OPSERVER_SESSION_OP

  // Any operator by name, tensors by argument name (as ListOperators gives).
  absl::StatusOr<Executor> GetWorkspaceSize(
      const std::string& op, const v1::OpParams& params,
      const std::map<std::string, TensorDesc>& tensors);

  // Whether this session's calls go through the command channel (see
  // ConnectOptions::pipeline).
  bool pipelined() const { return channel_ != nullptr; }

  // Graphs (the server side of aclmdlRI capture; DefineGraphCommand in
  // proto/opserver.proto). Pipelined sessions only: FAILED_PRECONDITION
  // otherwise.
  //
  // The command ExecuteHandle, Memset, CopyOnDevice, WriteAsync (at most
  // kMaxPipelinedBytes), RecordEvent and StreamWaitEvent would send,
  // checked and accounted for here exactly as those calls do (a launch
  // consumes its single-use executor, as if launched), but returned
  // instead of sent: a recorder keeps them as a graph's tasks. A launch
  // command that is never defined into a graph leaves its executor on the
  // server until the session ends.
  absl::StatusOr<v1::PipelineCommand> LaunchCommand(uint64_t executor,
                                                    uint64_t stream,
                                                    uint64_t workspace,
                                                    uint64_t workspace_offset,
                                                    uint64_t workspace_size);
  absl::StatusOr<v1::PipelineCommand> MemsetCommand(uint64_t buffer,
                                                    uint64_t offset,
                                                    uint64_t size,
                                                    uint8_t value,
                                                    uint64_t stream);
  absl::StatusOr<v1::PipelineCommand> CopyCommand(
      uint64_t dst_buffer, uint64_t dst_offset, uint64_t src_buffer,
      uint64_t src_offset, uint64_t size, uint64_t stream);
  absl::StatusOr<v1::PipelineCommand> WriteCommand(uint64_t buffer,
                                                   uint64_t offset,
                                                   const void* data,
                                                   uint64_t size,
                                                   uint64_t stream);
  absl::StatusOr<v1::PipelineCommand> RecordEventCommand(uint64_t event,
                                                         uint64_t stream);
  absl::StatusOr<v1::PipelineCommand> WaitEventCommand(uint64_t stream,
                                                       uint64_t event);
  // Chooses the graph's id from the counter executor and event ids come
  // from and sends define_graph with `tasks`, under one lock: the server
  // takes client-chosen ids only in increasing order, so the id is chosen
  // when the definition is sent, not when a capture begins. Returns the
  // id at once; what only the server finds (a handle gone meanwhile, its
  // graph limits) is the session's deferred error (Flush), and the graph
  // then does not exist. INVALID_ARGUMENT for an empty list or a task of
  // another kind; RESOURCE_EXHAUSTED when the definition is larger than
  // kMaxGraphDefinitionBytes.
  absl::StatusOr<uint64_t> DefineGraph(std::vector<v1::PipelineCommand> tasks);
  // Queues one replay of `graph` on `stream` (no round trip); NOT_FOUND at
  // once for a graph or stream this session does not know. Errors during
  // the replay are `stream`'s deferred error (Synchronize).
  absl::Status ReplayGraph(uint64_t graph, uint64_t stream = 0);
  // ReplayGraph, then Synchronize(stream), sent to the server together in
  // one Pipeline message (CommandChannel::SendThenFence): a step that
  // replays and waits costs the server one read. The same errors as the
  // two calls: the replay's at once (nothing is sent then), then the
  // stream's deferred error.
  absl::Status ReplayGraphAndSynchronize(uint64_t graph, uint64_t stream = 0);
  // Releases `graph` once the replays already queued have run; NOT_FOUND
  // for a graph this session does not know (or destroyed).
  absl::Status DestroyGraph(uint64_t graph);

  // Handle-level executor calls (the RAII Executor uses these).
  absl::Status ExecuteHandle(uint64_t executor, uint64_t stream,
                             uint64_t workspace, uint64_t workspace_offset,
                             uint64_t workspace_size);
  absl::Status SetExecutorRepeatable(uint64_t executor);
  absl::Status DestroyExecutor(uint64_t executor);

 private:
  friend class Client;
  Session(Client* client, std::string token, std::string routing_key);
  friend class PendingRead;
  void StartAttach();
  // NOT_FOUND / OUT_OF_RANGE unless buffer[offset, offset + size) is in a
  // buffer this session allocated, and `stream` one it created (pipelined
  // sessions, which know them).
  absl::Status CheckLocalRange(uint64_t buffer, uint64_t offset, uint64_t size,
                               uint64_t stream);
  // FAILED_PRECONDITION naming `what` unless the session is pipelined.
  absl::Status CheckPipelined(absl::string_view what) const;
  // The replay_graph command of ReplayGraph, after its local checks.
  absl::StatusOr<v1::PipelineCommand> ReplayCommand(uint64_t graph,
                                                    uint64_t stream);
  // Pipelined: waits until the channel's commands took effect, so the
  // unary call that follows sees them (calls take effect in issue order).
  absl::Status Ordered();
  // Pipelined phase one: the server's checks run here; the plan is queued
  // under an id this session chooses.
  absl::StatusOr<Executor> PlanLocally(v1::GetWorkspaceSizeRequest request);
  // When a transfer call counts as stalled, for the transfer watchdog
  // (ConnectOptions::transfer_idle_timeout). A call first waits, on the
  // server, for the work queued on its stream before it, for as long as
  // that work takes, and moves nothing meanwhile; only a split transfer's
  // parts never do (its barrier did that waiting), and a download has
  // done with it once its first message came.
  enum class IdleWatch {
    kNever,              // Bounded by wait_timeout alone.
    kAfterFirstMessage,  // Downloads; an upload cannot tell (kNever).
    kFromTheStart,       // A split transfer's parts.
  };
  // One Upload call on `channel`.
  absl::Status UploadCall(grpc::Channel* channel, uint64_t buffer,
                          uint64_t offset, const char* data, uint64_t size,
                          uint64_t stream, IdleWatch idle_watch);
  // Download without its session-wide fence: ordered on `stream` by the
  // server, after the commands the caller has made sure were delivered.
  absl::Status StreamDownload(uint64_t buffer, uint64_t offset, void* data,
                              uint64_t size, uint64_t stream);
  // One Download call on `channel`.
  absl::Status DownloadCall(grpc::Channel* channel, uint64_t buffer,
                            uint64_t offset, char* data, uint64_t size,
                            uint64_t stream, IdleWatch idle_watch);
  // The whole transfer over the server's data path; nullopt when it cannot
  // be used or its connections kept being closed (then the caller uses
  // Upload/Download: nothing was queued, or the call was cancelled and the
  // server orders what comes next on the stream after it). `upload`:
  // `data` is read, else written.
  std::optional<absl::Status> DataPathTransfer(bool upload, uint64_t buffer,
                                               uint64_t offset, char* data,
                                               uint64_t size, uint64_t stream);
  // A data-path transfer the server has ordered on its stream (its ticket
  // came) and whose first connection is open (transfers.cc).
  struct DataPathCall;
  // DataPathTransfer's first half: the call, its ticket and its first
  // connection. nullptr when the data path cannot be used (nothing was
  // queued: the caller uses gRPC); an error when the server refused it.
  absl::StatusOr<std::shared_ptr<DataPathCall>> OpenDataPath(
      bool upload, uint64_t buffer, uint64_t offset, char* data,
      uint64_t size, uint64_t stream);
  // The same as a data_transfer command on the channel, over a kept
  // connection (ConnectOptions::pipelined_data_transfers); nullptr when
  // that cannot be used (the caller opens a call then).
  absl::StatusOr<std::shared_ptr<DataPathCall>> OpenPipelinedDataPath(
      bool upload, uint64_t buffer, uint64_t offset, char* data, uint64_t size,
      uint64_t stream);
  // The second half: moves the bytes (trying the ticket again on a new
  // connection when the server closed one before taking it) and ends the
  // call. nullopt when the connections kept being closed and
  // `may_fall_back`: the call is then cancelled and the caller uses gRPC;
  // without it, that is UNAVAILABLE.
  std::optional<absl::Status> CompleteDataPath(DataPathCall& call,
                                               bool may_fall_back);
  // CompleteDataPath(call, false) on a thread of its own (here, when no
  // thread can be started), as a PendingRead; Close() waits for it.
  PendingRead CompleteInBackground(std::shared_ptr<DataPathCall> call,
                                   uint64_t stream);
  // UploadAsync's and DownloadAsync's end, after CopyStarted(stream): the
  // opened `call` completed in the background, or, when there is no data
  // path, `without_data_path` done here; CopyEnded once the bytes moved.
  absl::StatusOr<PendingRead> StartCopy(
      uint64_t stream, absl::StatusOr<std::shared_ptr<DataPathCall>> call,
      absl::FunctionRef<absl::Status()> without_data_path);
  // One data-path connection's try at a transfer: `moved` is how the bytes
  // went on it; `dropped`, that the server closed it in a way that says it
  // may never have taken the ticket (so the same ticket may be tried again).
  // `reusable`: the transfer ended on it as one kept ends (the upload's
  // acknowledgement came, or every byte of the download), so the
  // connection may carry the next one once the call has ended OK.
  struct DataPathAttempt {
    absl::Status moved;
    bool dropped = false;
    bool reusable = false;
  };
  // `keep`: the server keeps the connection (the request's
  // keep_connection, agreed to).
  static DataPathAttempt MoveOverDataPath(int fd, const std::string& ticket,
                                          bool upload, bool keep, char* data,
                                          uint64_t size, const char* what);
  // The end of an upload on a kept connection: the server's one-byte
  // acknowledgement of its last byte.
  static DataPathAttempt AwaitUploadAck(int fd, const char* what);
  // UploadAsync's and DownloadAsync's call: OpenPipelinedDataPath, else
  // OpenDataPath once the channel's commands are in (Ordered).
  absl::StatusOr<std::shared_ptr<DataPathCall>> OpenAsyncDataPath(
      bool upload, uint64_t buffer, uint64_t offset, char* data, uint64_t size,
      uint64_t stream);
  // CompleteDataPath's end for a pipelined transfer, after its last
  // `attempt` on `connection` (kept for the next one if it ended well).
  absl::Status EndPipelined(const DataPathCall& call,
                            const DataPathAttempt& attempt,
                            UniqueFd connection);
  // One call of a transfer: `size` bytes at `offset` + `at`, over
  // `channel`, ordered on `stream` (size 0: the barrier of a split one).
  using TransferPart =
      std::function<absl::Status(grpc::Channel* channel, uint64_t at,
                                 uint64_t size, uint64_t stream, IdleWatch)>;
  // Moves buffer[offset, offset + size) to (`upload`) or from `data`: over
  // the data path (DataPathTransfer) where it can, else Split (below), or
  // else as one call on the first of its direction's transfer connections
  // (Client::TransferChannel). Between CopyStarted and CopyEnded.
  absl::Status Transfer(bool upload, uint64_t buffer, uint64_t offset,
                        char* data, uint64_t size, uint64_t stream,
                        const TransferPart& part);
  // A transfer of buffer[offset, offset + size) split over the client's
  // transfer connections (see ConnectOptions::transfer_connections): first
  // `part(channel, 0, 0, stream)`, which the server answers once the work
  // queued on `stream` is done, then every part at once, the extra ones on
  // short-lived streams. nullopt when this transfer is not split.
  std::optional<absl::Status> Split(bool upload, uint64_t buffer,
                                    uint64_t offset, uint64_t size,
                                    uint64_t stream, const TransferPart& part);

  Client* const client_;
  const std::string token_;
  const std::string routing_key_;
  // Set by Client::CreateSession once, before the session is handed out.
  uint32_t device_ = 0;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status lost_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::ClientContext> attach_context_;
  std::thread attach_thread_;
  // UploadAsync and DownloadAsync copies whose thread still uses this
  // session: Close() waits for none to be left.
  int background_copies_ ABSL_GUARDED_BY(mu_) = 0;

  // Pipelined sessions only: the channel, and what the client must know to
  // check commands before queueing them (the sizes of its buffers, its
  // streams and the executors it planned).
  std::unique_ptr<CommandChannel> channel_;
  struct LocalExecutor {
    uint64_t workspace_size = 0;
    bool repeatable = false;
  };
  mutable absl::Mutex handles_mu_;
  absl::flat_hash_map<uint64_t, uint64_t> buffer_sizes_
      ABSL_GUARDED_BY(handles_mu_);
  absl::flat_hash_set<uint64_t> streams_ ABSL_GUARDED_BY(handles_mu_);
  absl::flat_hash_map<uint64_t, LocalExecutor> executors_
      ABSL_GUARDED_BY(handles_mu_);
  absl::flat_hash_set<uint64_t> events_ ABSL_GUARDED_BY(handles_mu_);
  // Graphs defined and not destroyed (DefineGraph).
  absl::flat_hash_set<uint64_t> graphs_ ABSL_GUARDED_BY(handles_mu_);
  // NOT_FOUND (prefixed with `what`) unless `event` is one of this
  // session's events and `stream` (if given) one of its streams.
  absl::Status CheckLocalEvent(absl::string_view what, uint64_t event,
                               std::optional<uint64_t> stream);
  // NOT_FOUND (prefixed with `what`) unless `stream` is 0 or one of this
  // session's streams (pipelined sessions, which know them).
  absl::Status CheckLocalStream(absl::string_view what, uint64_t stream);
  // Pipelined: `stream` was found idle by a fence or call ordered after
  // the first `issued` commands sent; `clean`: by a synchronize, which also
  // took its deferred error (a query takes none).
  void NoteIdle(uint64_t stream, uint64_t issued, bool clean = false);
  // Pipelined: no command queued work on `stream` since it was found idle
  // (with `clean`: since a synchronize found it so), and no async copy on
  // it is moving.
  bool KnownIdle(uint64_t stream, bool clean = false);
  // A transfer ordered on `stream` (UploadAsync, DownloadAsync, Transfer)
  // starts, or ends (`ok`: it moved every byte). Its bytes are work on the
  // stream the channel does not count: the stream is not known idle while
  // they move, nor clean after they failed (the server may hold the
  // failure for the stream).
  void CopyStarted(uint64_t stream);
  void CopyEnded(uint64_t stream, bool ok);
  // The event StreamBusy (unpipelined) and WaitStream record on `stream`,
  // made on first use and destroyed with the stream.
  absl::StatusOr<uint64_t> Probe(uint64_t stream);
  // What the session knows of a stream without asking the server.
  struct StreamMarks {
    // The commands sent before it was last found idle, and before a
    // synchronize last found it so; unset: never.
    std::optional<uint64_t> idle_at;
    std::optional<uint64_t> clean_at;
    int copies_moving = 0;
    // A copy on it ended well since its last synchronize.
    bool copied_since_sync = false;
  };
  absl::flat_hash_map<uint64_t, StreamMarks> marks_
      ABSL_GUARDED_BY(handles_mu_);
  absl::flat_hash_map<uint64_t, uint64_t> probes_ ABSL_GUARDED_BY(handles_mu_);
  // Client-chosen ids (executors and events) are never reused.
  uint64_t next_executor_ ABSL_GUARDED_BY(handles_mu_) = kClientExecutorBase;
};

}  // namespace remote

using remote::Client;
using remote::ConnectOptions;

}  // namespace opserver

#endif  // OPSERVER_CLIENT_CLIENT_H_
