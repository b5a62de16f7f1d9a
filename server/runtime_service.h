#ifndef OPSERVER_SERVER_RUNTIME_SERVICE_H_
#define OPSERVER_SERVER_RUNTIME_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "devices/device.h"
#include "proto/opserver.grpc.pb.h"
#include "runtime/byte_range.h"  // CheckRange, for the services
#include "runtime/data_transfers.h"
#include "runtime/event.h"
#include "runtime/session.h"
#include "runtime/session_manager.h"
#include "runtime/work_pool.h"
#include "server/auth.h"
#include "server/call_log.h"
#include "server/data_listener.h"
#include "server/routing_key.h"

namespace opserver {

// Transfer and value limits of the Runtime service (server flags).
// The largest --staging_chunk_bytes: a transfer then holds 3 GiB of
// page-locked memory.
inline constexpr uint64_t kMaxStagingChunkBytes = 1ull << 30;

struct TransferLimits {
  // Download chunk size; uploads may use any chunk up to the message limit.
  // Also the staging chunk of gRPC transfers on a device the host cannot
  // address (DeviceStream::StageUpload).
  uint64_t chunk_bytes = 4ull << 20;
  // The staging chunk of data-path transfers on a device the host cannot
  // address: one device copy per chunk, and each transfer holds at most
  // three chunks of page-locked host memory while it runs (one data-path
  // transfer per stream at a time). Each copy costs a fixed time beside its bytes
  // (through the chain, one whole transfer to the backend), but larger
  // chunks overlap less and fault in more memory per transfer: 32 MiB
  // measured no faster than 4 MiB on a loaded machine (BENCHMARKS.md).
  // From 1 to kMaxStagingChunkBytes.
  uint64_t staging_chunk_bytes = 4ull << 20;
  uint64_t max_message_bytes = 64ull << 20;
  // Most values one WriteValues/ReadValues/Evaluate tensor may carry.
  uint32_t max_values = 1u << 20;
  // An Upload or Download that moves no data for this long (its client
  // neither sends nor reads) is ended with DEADLINE_EXCEEDED, so a stalled
  // client cannot hold its stream, buffer and session.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Starts the thread that moves a data-path transfer's bytes. Like
  // std::thread, it throws std::system_error when no thread can be started
  // (RLIMIT_NPROC, a container's pids limit). Empty: a detached
  // std::thread; tests replace it to make thread creation fail.
  std::function<void(std::function<void()>)> start_thread;
  // For tests: runs at the start of every Download's and OpenDataTransfer's
  // reaction to a completed write, before it takes the call's lock, so a
  // test can delay that reaction as a loaded machine may. Empty: nothing.
  std::function<void()> before_write_done;
  // For tests: runs in a data-path mover once it has reported its result
  // to the transfer's call (which may then end), before it counts itself
  // out, so a test can see what a slow mover still holds then. Empty:
  // nothing.
  std::function<void()> after_mover_report;
  // For tests: called once CreateSession has made its session, with its
  // id; true holds the reply until the call is cancelled (the client's
  // cancel or its deadline), so a test can make the reply undeliverable
  // for certain. Empty: the reply goes at once.
  std::function<bool(const std::string& session)> hold_create_session_reply;
};

// Upload and Download are served on raw gRPC byte buffers: the data field
// is copied straight between the wire slices and device memory (and sent
// from host-addressable device memory without any copy), which is what gets
// transfers close to the socket's speed. Every other method uses the
// generated message types.
using RuntimeServiceBase = v1::Runtime::WithRawCallbackMethod_Upload<
    v1::Runtime::WithRawCallbackMethod_Download<v1::Runtime::CallbackService>>;

// The error of a copy through a stream without a device stream (only a
// session built without one: see Session's constructor); shared by
// runtime_service.cc and data_transfer.cc.
absl::Status NoDeviceStream();

// opserver.v1.Runtime: device info, sessions, streams, memory, transfers.
// `sessions` (and its devices) must outlive the service. Each session's
// calls use its own device (SessionManager::device); GetDeviceInfo and
// GetServerStats describe all of them.
class RuntimeService final : public RuntimeServiceBase, public DataTransfers {
 public:
  // `authenticator` (null without tokens) resolves callers' identities.
  // `data_listener` (null: no data path; must outlive the service) takes
  // the connections of OpenDataTransfer calls.
  // `workers` (null: gRPC's threads) clear and populate large new buffers,
  // so a client allocating gigabytes costs its own turns, not the callback
  // threads every call needs.
  RuntimeService(SessionManager* sessions, TransferLimits limits,
                 const Authenticator* authenticator = nullptr,
                 DataListener* data_listener = nullptr,
                 WorkPool* workers = nullptr);
  ~RuntimeService() override;

  // Ends every Attach stream (without closing its session) so the server's
  // shutdown does not wait on them. Idempotent. Transfers in flight may
  // finish within the shutdown grace; gRPC cancels the rest.
  void Shutdown();

  // The server is draining (Server::BeginDrain): CreateSession is refused
  // with UNAVAILABLE, every other call is served as before, and
  // GetServerStats reports it. Idempotent.
  void BeginDrain() { draining_.store(true, std::memory_order_relaxed); }

  // The pipelined data_transfer command's transfers (DataTransfers, for
  // the Pipeline channel's CommandPipeline): over the data listener, like
  // OpenDataTransfer's, with the client's ticket.
  absl::Status Start(DataTransfers::Request request) override;
  void Refuse(const std::string& ticket) override;
  // data_transfer commands one session may have in flight (queued on its
  // streams, waiting for their connection or moving); one more is
  // refused with RESOURCE_EXHAUSTED, its stream's error.
  static constexpr size_t kMaxPipelinedTransfersPerSession = 64;
  void Cancel(const void* owner, const std::string& ticket) override;

  grpc::ServerUnaryReactor* GetDeviceInfo(
      grpc::CallbackServerContext* context,
      const v1::GetDeviceInfoRequest* request,
      v1::GetDeviceInfoResponse* response) override;
  grpc::ServerUnaryReactor* CreateSession(
      grpc::CallbackServerContext* context,
      const v1::CreateSessionRequest* request,
      v1::CreateSessionResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(
      grpc::CallbackServerContext* context,
      const v1::CloseSessionRequest* request,
      v1::CloseSessionResponse* response) override;
  grpc::ServerWriteReactor<v1::AttachEvent>* Attach(
      grpc::CallbackServerContext* context,
      const v1::AttachRequest* request) override;
  grpc::ServerUnaryReactor* GetSessionStats(
      grpc::CallbackServerContext* context,
      const v1::GetSessionStatsRequest* request,
      v1::SessionStats* response) override;
  grpc::ServerUnaryReactor* GetServerStats(
      grpc::CallbackServerContext* context,
      const v1::GetServerStatsRequest* request,
      v1::ServerStats* response) override;
  grpc::ServerUnaryReactor* CreateStream(
      grpc::CallbackServerContext* context,
      const v1::CreateStreamRequest* request,
      v1::CreateStreamResponse* response) override;
  grpc::ServerUnaryReactor* DestroyStream(
      grpc::CallbackServerContext* context,
      const v1::DestroyStreamRequest* request,
      v1::DestroyStreamResponse* response) override;
  grpc::ServerUnaryReactor* SynchronizeStream(
      grpc::CallbackServerContext* context,
      const v1::SynchronizeStreamRequest* request,
      v1::SynchronizeStreamResponse* response) override;
  grpc::ServerUnaryReactor* Malloc(grpc::CallbackServerContext* context,
                                   const v1::MallocRequest* request,
                                   v1::MallocResponse* response) override;
  grpc::ServerUnaryReactor* Free(grpc::CallbackServerContext* context,
                                 const v1::FreeRequest* request,
                                 v1::FreeResponse* response) override;
  // Raw forms of Upload(stream UploadRequest) -> UploadResponse and
  // Download(DownloadRequest) -> stream DownloadResponse.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerWriteReactor<v1::OpenDataTransferResponse>* OpenDataTransfer(
      grpc::CallbackServerContext* context,
      const v1::OpenDataTransferRequest* request) override;
  grpc::ServerUnaryReactor* WriteValues(
      grpc::CallbackServerContext* context,
      const v1::WriteValuesRequest* request,
      v1::WriteValuesResponse* response) override;
  grpc::ServerUnaryReactor* ReadValues(
      grpc::CallbackServerContext* context,
      const v1::ReadValuesRequest* request,
      v1::ReadValuesResponse* response) override;

  // Events and the device memory operations, in runtime_events.cc.
  grpc::ServerUnaryReactor* CreateEvent(
      grpc::CallbackServerContext* context,
      const v1::CreateEventRequest* request,
      v1::CreateEventResponse* response) override;
  grpc::ServerUnaryReactor* DestroyEvent(
      grpc::CallbackServerContext* context,
      const v1::DestroyEventRequest* request,
      v1::DestroyEventResponse* response) override;
  grpc::ServerUnaryReactor* RecordEvent(
      grpc::CallbackServerContext* context,
      const v1::RecordEventRequest* request,
      v1::RecordEventResponse* response) override;
  grpc::ServerUnaryReactor* StreamWaitEvent(
      grpc::CallbackServerContext* context,
      const v1::StreamWaitEventRequest* request,
      v1::StreamWaitEventResponse* response) override;
  grpc::ServerUnaryReactor* ResetEvent(
      grpc::CallbackServerContext* context,
      const v1::ResetEventRequest* request,
      v1::ResetEventResponse* response) override;
  grpc::ServerUnaryReactor* QueryEvent(
      grpc::CallbackServerContext* context,
      const v1::QueryEventRequest* request,
      v1::QueryEventResponse* response) override;
  grpc::ServerUnaryReactor* SynchronizeEvent(
      grpc::CallbackServerContext* context,
      const v1::SynchronizeEventRequest* request,
      v1::SynchronizeEventResponse* response) override;
  grpc::ServerUnaryReactor* EventElapsedTime(
      grpc::CallbackServerContext* context,
      const v1::EventElapsedTimeRequest* request,
      v1::EventElapsedTimeResponse* response) override;
  grpc::ServerUnaryReactor* Memset(grpc::CallbackServerContext* context,
                                   const v1::MemsetRequest* request,
                                   v1::MemsetResponse* response) override;
  grpc::ServerUnaryReactor* CopyDeviceToDevice(
      grpc::CallbackServerContext* context,
      const v1::CopyDeviceToDeviceRequest* request,
      v1::CopyDeviceToDeviceResponse* response) override;

  // Completed transfer calls and their bytes, by path (for metrics).
  struct TransferTotals {
    uint64_t data_path_transfers, data_path_bytes, grpc_transfers, grpc_bytes;
  };
  TransferTotals Totals() const {
    return {data_path_count_.transfers.load(), data_path_count_.bytes.load(),
            grpc_count_.transfers.load(), grpc_count_.bytes.load()};
  }

 private:
  class Attacher;
  class SessionCreator;
  struct TransferLink;
  class Transfer;
  class Uploader;
  class Downloader;
  class DataTransfer;
  class PipelinedTransfer;

  // What a transfer touches, resolved and checked: the session, the buffer
  // holding [offset, offset + size), and the stream it is ordered on.
  struct TransferTarget {
    std::shared_ptr<Session> session;
    std::shared_ptr<Buffer> buffer;
    std::shared_ptr<Stream> stream;
  };
  absl::StatusOr<TransferTarget> ResolveTransfer(
      absl::string_view session, uint64_t buffer, uint64_t offset,
      uint64_t size, uint64_t stream, absl::string_view what,
      const absl::StatusOr<std::string>& caller,
      std::optional<absl::string_view> routing_key);

  void RemoveAttacher(Attacher* attacher);

  // Event `event` of the session `id` names, when the call's identity owns
  // it; with `stream`, stream `stream_id` of that session too (the
  // arguments of RecordEvent, StreamWaitEvent and ResetEvent).
  struct EventTarget {
    std::shared_ptr<Session> session;
    std::shared_ptr<Event> event;
    std::shared_ptr<Stream> stream;
  };
  absl::StatusOr<EventTarget> ResolveEvent(
      const grpc::ServerContextBase* context, absl::string_view id,
      uint64_t event, std::optional<uint64_t> stream_id) const;

  // The identity whose sessions the call may name (CallerIdentity):
  // UNAUTHENTICATED when the call has no single token in force.
  absl::StatusOr<std::string> Caller(
      const grpc::ServerContextBase* context) const {
    return CallerIdentity(context, authenticator_);
  }
  // Session `id` when the call's identity owns it and the call's routing
  // key, if it carries one, is the session's (SessionManager::Get).
  absl::StatusOr<std::shared_ptr<Session>> SessionOf(
      const grpc::ServerContextBase* context, absl::string_view id) const {
    CallLog::NoteSession(context, id);
    return sessions_->GetForCaller(id, Caller(context),
                                   SessionRoutingKeyOf(context));
  }

  // Registers a live Upload/Download (through the link by which it can be
  // ended) for the idle watchdog; RemoveTransfer from its OnDone.
  void AddTransfer(std::shared_ptr<TransferLink> link);
  void RemoveTransfer(const std::shared_ptr<TransferLink>& link);
  // Ends transfers idle for longer than limits_.idle_timeout; runs on
  // watchdog_ until the service is destroyed.
  void WatchTransfers();

  SessionManager* const sessions_;
  const TransferLimits limits_;
  const Authenticator* const authenticator_;
  DataListener* const data_listener_;
  WorkPool* const workers_;

  absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Attacher*> attachers_ ABSL_GUARDED_BY(mu_);
  std::set<std::shared_ptr<TransferLink>> transfers_ ABSL_GUARDED_BY(mu_);
  bool destroying_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> draining_{false};
  std::thread watchdog_;
  // Completed transfers and their bytes, for GetServerStats.
  struct TransferCount {
    std::atomic<uint64_t> transfers{0};
    std::atomic<uint64_t> bytes{0};
    void Add(uint64_t n) {
      transfers.fetch_add(1, std::memory_order_relaxed);
      bytes.fetch_add(n, std::memory_order_relaxed);
    }
  };
  TransferCount data_path_count_;
  TransferCount grpc_count_;

  // The threads moving data-path bytes; the destructor waits for them.
  struct DataMovers {
    absl::Mutex mu;
    int count ABSL_GUARDED_BY(mu) = 0;
  };
  const std::shared_ptr<DataMovers> movers_ = std::make_shared<DataMovers>();
  // Counts a data-path mover in and runs `move` on a thread of its own
  // (TransferLimits::start_thread, if set); once it has returned (and what
  // it holds is gone) and after_mover_report has run, counts it out.
  // RESOURCE_EXHAUSTED, counted out, when no thread can be started.
  absl::Status StartMover(std::function<void()> move);
  // Ends every data_transfer command's transfer in flight with `why`
  // (Shutdown: no call of theirs is cancelled by the server's shutdown).
  void AbortPipelinedTransfers(const absl::Status& why);
  // The data_transfer commands' transfers not yet ended, by ticket (for
  // cancel_data_transfer and Shutdown).
  absl::Mutex pipelined_mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<PipelinedTransfer>> pipelined_
      ABSL_GUARDED_BY(pipelined_mu_);
  // How many each session (DataTransfers::Request::owner) holds; at most
  // kMaxPipelinedTransfersPerSession.
  absl::flat_hash_map<const void*, size_t> pipelined_per_owner_
      ABSL_GUARDED_BY(pipelined_mu_);
  // One of `owner`'s transfers has ended (or never started).
  void ReleasePipelinedLocked(const void* owner)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pipelined_mu_);
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_RUNTIME_SERVICE_H_
