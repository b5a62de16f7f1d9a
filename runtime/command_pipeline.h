// The Pipeline channel's commands applied to a session, in order, without
// the transport (see Operators.Pipeline in proto/opserver.proto): the gRPC
// reactor reads batches of commands, hands them here and writes back the
// acknowledgements and fence results.
//
// Nothing a command does is answered by itself. A command the server
// refuses becomes a deferred error, exactly as a launch failing on the
// device does: a launch's, on its stream (Stream::Fail, reported by the
// next synchronize of that stream); a free's, an executor call's or an
// unlaunched plan's, on the session (reported by the next session fence).
// A refused plan stays in the session (Session::AddRefusedPlan, charged as
// a handle) until its id is destroyed: each launch of it is not run and
// fails its stream with the plan's error; if none was launched by the next
// session fence, that fence reports it, once. Event commands (record, wait,
// reset) and memsets and copies are charged to their stream like launches;
// create_event and destroy_event to the session. A callback is answered by
// its notice (CallbackDone), which carries its refusal too; a refused one
// is also its stream's deferred error.
#ifndef OPSERVER_RUNTIME_COMMAND_PIPELINE_H_
#define OPSERVER_RUNTIME_COMMAND_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/opserver.pb.h"
#include "runtime/data_transfers.h"
#include "runtime/event.h"
#include "runtime/observer.h"
#include "runtime/session.h"
#include "runtime/stream.h"

namespace opserver {

class CommandPipeline {
 public:
  // Called once per fence command, on any thread (also inside Apply), with
  // its id, the deferred error it reports (OK if none) and, for a read
  // fence without error, the bytes read.
  using FenceDone =
      std::function<void(uint64_t id, absl::Status status, std::string data)>;
  // Called once per callback command (CallbackCommand), on any thread (also
  // inside Apply), with its id and OK when its stream reached it, or the
  // error that means it never will (refused, or its stream cancelled).
  using CallbackDone = std::function<void(uint64_t id, absl::Status status)>;
  // Called when a command that had to wait may be retried: once per Apply
  // that stopped early, on any thread (also inside that Apply).
  using Resume = std::function<void()>;

  // At most `max_fences` fences are held at once (answered or not) until
  // released with FencesWritten: a client that sends fences and never reads
  // their results stops being served instead of growing memory.
  // `observer` (may be null) is told the commands and deferred errors.
  // `data_transfers` (may be null: the server has no data path; must
  // outlive the pipeline) moves the bytes of data_transfer commands.
  CommandPipeline(const SessionLimits& limits, size_t max_fences,
                  FenceDone fence_done, RuntimeObserver* observer = nullptr,
                  DataTransfers* data_transfers = nullptr);
  ~CommandPipeline();

  // Where callback notices go; until set, and after DisconnectCallbacks,
  // they are dropped. A callback holds one of the `max_fences` places
  // from the command until its notice is written (FencesWritten counts
  // notices with fence results).
  void SetCallbackDone(CallbackDone done);
  // No notice reaches the CallbackDone once this returns (one being
  // delivered now is waited for): the channel is ending, while callbacks
  // queued on its streams may be reached much later.
  void DisconnectCallbacks();

  // Applies commands[from, min(to, size)) in order to `session`; returns
  // the index of the first command not applied (min(to, size) when all
  // were). It stops before a launch whose stream is full (it waits for the
  // stream, never failing a launch only because the client is fast) and
  // before a fence beyond max_fences; `resume` says when to call again.
  // `to` lets a caller apply a long batch in slices.
  size_t Apply(
      Session& session,
      const google::protobuf::RepeatedPtrField<v1::PipelineCommand>& commands,
      size_t from, size_t to, const Resume& resume);

  // `count` fence results carrying `data_bytes` of read data have left
  // (were written to the client). SIZE_MAX: nothing more will be written;
  // every command waiting for room is let go.
  void FencesWritten(size_t count, uint64_t data_bytes);

  // The largest write or read one command may carry, and the most read
  // bytes held (read, not yet written) and write bytes held (received,
  // not yet copied) per channel, beyond which its commands wait.
  static constexpr uint64_t kMaxCommandBytes = 1 << 20;
  static constexpr uint64_t kMaxHeldBytes = 8 << 20;

 private:
  // Applies one command: one call per kind below, each returning false
  // when the command must wait (then `resume` is arranged) and true when
  // it was applied (its failure, if any, deferred).
  bool ApplyOne(Session& session, const v1::PipelineCommand& command,
                const Resume& resume);
  bool Plan(Session& session, const v1::PlanCommand& plan);
  bool Launch(Session& session, const v1::ExecuteRequest& launch,
              const Resume& resume);
  bool DestroyExecutor(Session& session, uint64_t id);
  bool SetRepeatable(Session& session, uint64_t id);
  bool Free(Session& session, uint64_t buffer);
  bool Fence(Session& session, const v1::FenceCommand& fence,
             const Resume& resume);
  bool Write(Session& session, const v1::WriteCommand& write,
             const Resume& resume);
  bool CreateEvent(Session& session, const v1::CreateEventCommand& create);
  bool RecordEvent(Session& session, const v1::RecordEventRequest& record);
  bool WaitEvent(Session& session, const v1::StreamWaitEventRequest& wait);
  bool ResetEvent(Session& session, const v1::ResetEventRequest& reset);
  bool DestroyEvent(Session& session, uint64_t id);
  bool Memset(Session& session, const v1::MemsetRequest& memset,
              const Resume& resume);
  bool Copy(Session& session, const v1::CopyDeviceToDeviceRequest& copy,
            const Resume& resume);
  // Graphs (runtime/graph.h): a refused definition or destroy is the
  // session's error, a refused replay its stream's.
  bool DefineGraph(Session& session, const v1::DefineGraphCommand& define);
  bool ReplayGraph(Session& session, const v1::ReplayGraphRequest& replay,
                   const Resume& resume);
  bool DestroyGraph(Session& session, uint64_t id);
  bool Callback(Session& session, const v1::CallbackCommand& callback,
                const Resume& resume);
  bool ReleaseCallback(Session& session, uint64_t id);
  bool StreamFailureMode(Session& session,
                         const v1::StreamFailureModeCommand& mode);
  bool OpTimeouts(Session& session, const v1::OpTimeoutsCommand& timeouts);
  // A refused one is its stream's error (the session's, for an unknown
  // stream), and its ticket is refused (DataTransfers::Refuse).
  bool DataTransfer(Session& session, const v1::DataTransferCommand& transfer,
                    const Resume& resume);
  bool CancelDataTransfer(Session& session, const std::string& ticket);
  absl::Status StartDataTransfer(Session& session,
                                 const std::shared_ptr<Stream>& stream,
                                 const v1::DataTransferCommand& transfer);

  // Takes one of the max_fences places (and `read` bytes of read room)
  // for a fence or callback; false when there is none: `resume` is called
  // once there is.
  bool TakeReplyRoom(uint64_t read, const Resume& resume);

  // True when stream `stream_id` is full: then `resume` is called once it
  // has run what it holds. An unknown stream is not full (the command
  // reports it).
  bool StreamFull(Session& session, uint64_t stream_id, const Resume& resume);
  // A memset or copy: waits for room, then `queue` on the stream; an
  // unknown stream is the session's error, `queue`'s the stream's. `what`
  // names the command in them.
  bool OnStream(Session& session, uint64_t stream_id, absl::string_view what,
                const Resume& resume,
                const std::function<absl::Status(Stream&)>& queue);
  // The four kinds of fence, once the channel has room for them.
  void QueryFence(Session& session, const v1::FenceCommand& fence);
  void EventFence(Session& session, uint64_t id, uint64_t event_id);
  void StreamFence(Session& session, const v1::FenceCommand& fence);
  void SessionFence(Session& session, uint64_t id);
  void QueueWrite(Session& session, const v1::WriteCommand& write);
  // A failed `status` becomes the session's error (if it has none yet),
  // named by StrCat(context...).
  template <typename... Context>
  void DeferToSession(const absl::Status& status, const Context&... context);
  // A read fence's copy, on its stream's thread once the stream reached it.
  void FinishRead(uint64_t id, absl::Status status,
                  const std::shared_ptr<Buffer>& buffer,
                  const std::shared_ptr<Stream>& stream, uint64_t offset,
                  uint64_t size);
  // record_event, wait_event and reset_event: `apply` on the event and the
  // stream, whose errors (an unknown event among them) become the stream's
  // deferred error; an unknown stream's, the session's. `what` names the
  // command in them.
  void OnEvent(Session& session, uint64_t event_id, uint64_t stream_id,
               absl::string_view what,
               const std::function<absl::Status(Event&, Stream&)>& apply);
  // buffer[offset, offset + size) of `session`, checked (size at most
  // kMaxCommandBytes); `what` names the command in errors.
  static absl::StatusOr<std::shared_ptr<Buffer>> CheckRange(
      Session& session, uint64_t buffer, uint64_t offset, uint64_t size,
      absl::string_view what);
  // Charges `error` to the session (the first one is kept until a session
  // fence reports it).
  void FailSession(absl::Status error);
  // The same with the error `make()` returns, called only when no error is
  // kept yet: only the first is reported, and a hostile batch can fail
  // tens of thousands of commands, each of whose messages would be
  // formatted for nothing.
  template <typename Make>
  void FailSessionLazily(const Make& make) {
    {
      absl::MutexLock lock(&mu_);
      if (!session_error_.ok()) return;
    }
    FailSession(make());
  }
  absl::Status TakeSessionError();

  // Fences waiting for a stream or an event record, which may take as long
  // as whatever holds the stream (an upload that stalls): a channel that
  // ends stops waiting for them at once (ForgetWaits), so its call and
  // what the fences hold go now, not when the record completes.
  // AddWait registers fence `id` before its wait starts and returns a key;
  // the wait's `done` calls DropWait(key) first; SetForget then gives the
  // way to stop the wait (null when `done` ran already), which returns
  // whether it stopped it before `done` was called.
  uint64_t AddWait(uint64_t id, uint64_t read_size);
  void DropWait(uint64_t key);
  void SetForget(uint64_t key, std::function<bool()> forget);
  void ForgetWaits();
  // A forgotten fence's answer (CANCELLED), its read bytes returned.
  void AnswerForgotten(uint64_t id, uint64_t read_size);

  const SessionLimits& limits_;
  const size_t max_fences_;
  const FenceDone fence_done_;
  RuntimeObserver* const observer_;
  DataTransfers* const data_transfers_;

  absl::Mutex mu_;
  absl::Status session_error_ ABSL_GUARDED_BY(mu_);
  size_t fences_held_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t read_bytes_held_ ABSL_GUARDED_BY(mu_) = 0;
  Resume fence_waiter_ ABSL_GUARDED_BY(mu_);

  struct Wait {
    uint64_t id = 0;
    uint64_t read_size = 0;
    std::function<bool()> forget;  // Null until SetForget.
  };
  absl::Mutex waits_mu_;
  uint64_t next_wait_ ABSL_GUARDED_BY(waits_mu_) = 0;
  bool forgetting_ ABSL_GUARDED_BY(waits_mu_) = false;
  absl::flat_hash_map<uint64_t, Wait> waits_ ABSL_GUARDED_BY(waits_mu_);

  // Bytes of writes queued on streams and not yet copied: shared with the
  // queued copies, which may run after this pipeline is gone.
  struct WriteBudget {
    absl::Mutex mu;
    uint64_t held ABSL_GUARDED_BY(mu) = 0;
    Resume waiter ABSL_GUARDED_BY(mu);
    // Returns `bytes` and wakes the waiting batch, if any.
    void Release(uint64_t bytes);
  };
  const std::shared_ptr<WriteBudget> writes_ = std::make_shared<WriteBudget>();

  // Where callback notices go: shared with the callbacks queued on
  // streams, which may be reached after this pipeline is gone.
  struct CallbackSink {
    absl::Mutex mu;
    CallbackDone done ABSL_GUARDED_BY(mu);
    void Notify(uint64_t id, absl::Status status);
  };
  const std::shared_ptr<CallbackSink> callbacks_ =
      std::make_shared<CallbackSink>();
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_COMMAND_PIPELINE_H_
