// The Pipeline channel's reactor (Operators.Pipeline): the transport of the
// command pipeline, whose client end is client/command_channel and whose
// commands runtime/command_pipeline applies.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/task_position.h"
#include "grpcpp/support/byte_buffer.h"
#include "kernels/aclnn_status.h"
#include "runtime/command_pipeline.h"
#include "runtime/log.h"
#include "runtime/pipeline_batch.h"
#include "runtime/session.h"
#include "server/auth.h"
#include "server/call_log.h"
#include "server/grpc_status_util.h"
#include "server/operator_service.h"
#include "server/raw_message.h"
#include "server/routing_key.h"
#include "server/start_read.h"

namespace opserver {

// Pipeline: batches of commands in, acknowledgements and fence results out
// (CommandPipeline applies them). A batch arrives as raw bytes: its size is
// checked on gRPC's thread (--max_pipeline_batch_bytes), and it is parsed
// and applied on the server's workers (WorkPool), in slices of
// kSliceCommands with the session taking turns with other sessions in
// between, so that one client's giant batch costs that client time and
// nobody else's, and never holds the callback threads every call needs.
// One batch is applied at a time, in order; the next is read once it has
// been, so a client that sends faster than the session runs is held back by
// HTTP/2 flow control, and the server keeps one batch per channel, in its
// wire form (at most --max_pipeline_batch_bytes, however long it waits:
// see PipelineBatch). Events coalesce: the acknowledgement and the fence
// results that arrive while a write is in flight go out together in the
// next one, so at most two events exist at once. So do those that arrive
// while a slice runs: a fence the slice answers inline (a replay and its
// synchronize on an idle stream) leaves with the slice's end, in the same
// write as the batch's acknowledgement, not in a write of its own followed
// by another (each write costs a wake-up of gRPC's threads). It waits at
// most the rest of one slice (kSliceCommands).
//
// With one session on the server there is no other tenant for the workers
// to protect, and handing a small batch to a worker and its answer back
// costs more than the batch often does (a replayed step's server CPU, on a
// 2-vCPU VM: 1.5 us per operator through a worker, 1.2 in place; the
// in-process launch is 0.7; BENCHMARKS.md). So a small batch
// (kBatchBytesRunHere) of the server's only session has its first slice
// applied on the callback thread that read it, one such slice at a time
// server-wide, so another callback thread is always free. It runs exactly
// what a worker's slice runs, under the same bounds; a slice that must
// wait, or a batch longer than one slice, goes on on the workers. A second
// session sends every batch after the one running to the workers, whose
// turns and lower priority keep tenants apart.
//
// The channel holds its session only while a slice runs: a closed session
// (CloseSession, the idle timeout, shutdown) ends the channel through
// Session::OpenChannel's callback, and is released at once even if the
// client never reads what the channel wrote.
class OperatorService::Pipeliner final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Commands applied per turn on a worker: about 50-100 us of work, so a
  // session waits at most that per other session with work (4096 left a
  // victim's p99 beside two channels of giant batches at 6.5x its p99
  // alone, 512 at 4-5x; bench/fairness_bench).
  static constexpr size_t kSliceCommands = 512;
  // The largest batch whose first slice may run on the callback thread that
  // read it (see the top of this file): a replay and its fence, a handful
  // of launches or events.
  static constexpr size_t kBatchBytesRunHere = 4096;

  Pipeliner(OperatorService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        binding_(service->authenticator_, context),
        caller_(binding_.caller()),
        limits_(service->sessions_->limits()),
        pipeline_(
            limits_, limits_.max_pending_replies,
            [this](uint64_t id, absl::Status status, std::string data) {
              FenceDone(id, std::move(status), std::move(data));
            },
            service->sessions_->observer(), service->data_transfers_),
        link_(std::make_shared<Link>()) {
    link_->call = this;
    pipeline_.SetCallbackDone([this](uint64_t id, absl::Status status) {
      CallbackDone(id, std::move(status));
    });
    if (!caller_.ok()) {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(ToGrpcStatus(caller_.status(), context));
      return;
    }
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    OperatorService* const service = service_;
    {
      absl::MutexLock lock(&mu_);
      if (!TakeBatchLocked(ok)) return;
      if (!ClaimCallbackThreadLocked()) {
        ScheduleLocked();
        return;
      }
      rerun_ = true;
      scheduled_ = true;  // As on a worker: the call cannot end meanwhile.
    }
    RunSlice();
    service->slice_on_callback_thread_.store(false);
  }

  void OnWriteDone(bool ok) override {
    size_t fences = 0;
    uint64_t data_bytes = 0;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      fences = written_fences_;
      data_bytes = written_data_bytes_;
      written_fences_ = 0;
      written_data_bytes_ = 0;
      if (!ok) {
        failed_ = true;
        fences = SIZE_MAX;  // Nothing more is written: wake a waiting batch.
      } else if (pending_.has_value() && !finished_ && !applying_) {
        WriteLocked();  // A running slice writes it when it ends.
      }
      MaybeFinishLocked();
    }
    // May resume a batch waiting for fence room (outside the lock: the
    // resumption takes it).
    if (fences > 0) pipeline_.FencesWritten(fences, data_bytes);
  }

  // The client went away: a batch waiting for room stops where it is. A
  // read still pending may yet complete with a message (gRPC delivers the
  // two in either order), so the call ends here when nothing else pends.
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      failed_ = true;
      MaybeFinishLocked();
    }
    pipeline_.FencesWritten(SIZE_MAX, 0);
  }

  void OnDone() override {
    // Callbacks queued on the session's streams may be reached later.
    pipeline_.DisconnectCallbacks();
    {
      // The session's close callback no longer reaches this call.
      absl::MutexLock lock(&link_->mu);
      link_->call = nullptr;
    }
    std::shared_ptr<Session> session;
    {
      absl::MutexLock lock(&mu_);  // A FenceDone may be leaving.
      session = std::move(closing_session_);
    }
    session.reset();
    delete this;
  }

 private:
  // What the session's close callback reaches the call through: it may run
  // after the call is gone.
  struct Link {
    absl::Mutex mu;
    Pipeliner* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  // The session was closed (or timed out, or the server is stopping): end
  // the channel now, even when its client reads nothing.
  void SessionClosed() {
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      if (end_status_.ok() && binding_.revoked()) {
        // The revocation ended the call that held the session (an Attach):
        // the token is the cause (Authenticator::SetTokens).
        end_status_ = RevokedError();
      } else if (end_status_.ok()) {
        end_status_ = absl::NotFoundError(absl::StrCat(
            "session ", session_id_, " was closed; the channel ended"));
        session_closed_ = true;
      }
      failed_ = true;
      // A write the client does not read never completes: cancel the call.
      cancel = writing_ && !finished_;
      MaybeFinishLocked();
    }
    if (cancel) context_->TryCancel();
    pipeline_.FencesWritten(SIZE_MAX, 0);
  }

  static absl::Status RevokedError() {
    return absl::UnauthenticatedError("the channel's token was revoked");
  }

  // Ends the call with `status` once nothing of it is pending.
  void EndLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (end_status_.ok()) end_status_ = std::move(status);
    failed_ = true;
    MaybeFinishLocked();
  }

  // The read's batch becomes the one to apply; false when there is none
  // to apply (the client is done, the call is ending, or it is too large,
  // which ends the call).
  bool TakeBatchLocked(bool ok) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ok) {
      reads_done_ = true;
      MaybeFinishLocked();
      return false;
    }
    if (finished_ || failed_) {
      MaybeFinishLocked();  // Whoever failed it may have left it to us.
      return false;
    }
    const size_t bytes = incoming_.Length();
    if (bytes > limits_.max_pipeline_batch_bytes) {
      EndLocked(absl::ResourceExhaustedError(absl::StrCat(
          "a Pipeline batch of ", bytes, " bytes is over the limit of ",
          limits_.max_pipeline_batch_bytes,
          " (--max_pipeline_batch_bytes): send smaller batches")));
      return false;
    }
    batch_bytes_.Swap(&incoming_);
    incoming_.Clear();
    in_batch_ = true;
    batch_.reset();
    return true;
  }

  // Whether the new batch's first slice runs here, on the callback thread
  // that read it (see the top of this file); if so, the thread is claimed
  // until the slice's end.
  bool ClaimCallbackThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (batch_bytes_.Length() > kBatchBytesRunHere ||
        service_->sessions_->session_count() != 1) {
      return false;
    }
    bool idle = false;
    return service_->slice_on_callback_thread_.compare_exchange_strong(idle,
                                                                       true);
  }

  // Has the current batch's next slice run on a worker. A resumption while
  // a slice runs makes that slice go round again.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    rerun_ = true;
    if (scheduled_) return;
    scheduled_ = true;
    // Before its first batch names the session, the channel takes its
    // caller's turn.
    absl::Status queued = service_->workers_->Submit(
        work_owner_.empty() ? *caller_ : work_owner_, [this] { RunSlice(); });
    if (!queued.ok()) {
      scheduled_ = false;
      in_batch_ = false;
      EndLocked(queued);
    }
  }

  // On a worker: parses the batch if it is new, then applies up to
  // kSliceCommands of it.
  void RunSlice() {
    absl::MutexLock lock(&mu_);
    for (;;) {
      rerun_ = false;
      if (binding_.revoked() && end_status_.ok()) {
        // The cancellation is on its way; nothing more of the batch runs.
        end_status_ = RevokedError();
        failed_ = true;
      }
      if (failed_) {
        in_batch_ = false;  // Nobody will hear about the rest of the batch.
        batch_.reset();
        break;
      }
      if (!StartBatchLocked()) break;
      std::shared_ptr<Session> session = session_.lock();
      if (session == nullptr) {
        in_batch_ = false;
        if (end_status_.ok()) session_closed_ = true;
        EndLocked(absl::NotFoundError(
            absl::StrCat("session ", session_id_, " was closed")));
        break;
      }
      applying_ = true;
      mu_.Unlock();
      session->Touch();
      absl::StatusOr<PipelineBatch::Progress> progress =
          batch_->ApplyNext(pipeline_, *session, kSliceCommands, [this] {
            absl::MutexLock lock(&mu_);
            if (in_batch_) ScheduleLocked();
          });
      session.reset();  // Not under mu_: it may be the last reference.
      mu_.Lock();
      applying_ = false;
      if (!progress.ok()) {
        in_batch_ = false;
        batch_.reset();
        EndLocked(progress.status());
        break;
      }
      fences_out_ += static_cast<int64_t>(progress->fences);
      acknowledged_ += progress->applied;
      if (batch_->done()) {
        in_batch_ = false;
        batch_.reset();
        // Before the read: the next batch may arrive (and be scheduled) as
        // soon as it is started, while this slice is still here.
        scheduled_ = false;
        AckLocked();
        if (!failed_) ReadNextLocked();
        MaybeFinishLocked();
        return;
      }
      // What the slice answered leaves now, with its progress.
      FlushLocked();
      if (progress->applied == kSliceCommands) {
        // More to do: take a turn behind the other sessions' work.
        scheduled_ = false;
        ScheduleLocked();
        return;
      }
      // Stopped early: waits for `resume`, unless it came meanwhile.
      if (!rerun_) break;
    }
    scheduled_ = false;
    MaybeFinishLocked();
  }

  // For a slice: opens a new batch (OpenBatch, without mu_ held) and, with
  // the channel's first batch, its session (OpenLocked). False when the
  // call ends instead.
  bool StartBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (batch_.has_value()) return true;
    mu_.Unlock();
    absl::Status opened = OpenBatch();
    mu_.Lock();
    if (opened.ok()) {
      if (RuntimeObserver* observer = service_->sessions_->observer()) {
        observer->PipelineBatch(batch_->size());
      }
      if (session_id_.empty()) opened = OpenLocked();
    }
    if (opened.ok()) return true;
    in_batch_ = false;
    EndLocked(std::move(opened));
    return false;
  }

  // Opens batch_bytes_ as batch_ (off gRPC's threads). The batch stays
  // in its wire form and each slice is parsed as it runs: a batch waiting
  // for room holds no parsed command (PipelineBatch says why).
  absl::Status OpenBatch() {
    std::vector<grpc::Slice> slices;
    std::string wire;
    const bool dumped = batch_bytes_.Dump(&slices).ok();
    wire.reserve(batch_bytes_.Length());
    for (const grpc::Slice& slice : slices) {
      wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    batch_bytes_.Clear();
    slices.clear();
    if (!dumped) {
      return absl::InvalidArgumentError(
          "a Pipeline batch that is not a PipelineRequest");
    }
    ASSIGN_OR_RETURN(PipelineBatch batch,
                     PipelineBatch::Open(std::move(wire),
                                         limits_.max_pipeline_batch_commands));
    batch_.emplace(std::move(batch));
    return absl::OkStatus();
  }

  // The first batch opens the channel on its session.
  absl::Status OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CallLog::NoteSession(context_, batch_->session());
    ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                     service_->sessions_->Get(batch_->session(), *caller_,
                                              SessionRoutingKeyOf(context_)));
    std::shared_ptr<Link> link = link_;
    absl::StatusOr<uint64_t> channel = session->OpenChannel([link] {
      absl::MutexLock lock(&link->mu);
      if (link->call != nullptr) link->call->SessionClosed();
    });
    if (channel.ok()) {
      session_id_ = batch_->session();
      work_owner_ = session->work_owner();
      channel_ = *channel;
      session_ = session;
    }
    mu_.Unlock();
    session.reset();  // Not under mu_: it may be the last reference.
    mu_.Lock();
    return channel.status();
  }

  // Fence results leave with the next event.
  void FenceDone(uint64_t id, absl::Status status, std::string data) {
    absl::MutexLock lock(&mu_);
    --fences_out_;
    v1::FenceResult* result = Pending().add_fences();
    result->set_id(id);
    *result->mutable_data() = std::move(data);
    if (!status.ok()) {
      result->set_code(static_cast<int32_t>(status.code()));
      result->set_aclnn_status(kernels::GetAclnnStatus(status));
      result->set_message(Truncated(status.message(), kMaxErrorMessageBytes));
      result->set_task(TaskPositionOf(status));
    }
    FlushLocked();
    MaybeFinishLocked();
  }

  // Callback notices leave with the next event too; once nothing more is
  // written, they are dropped (the client's channel is gone).
  void CallbackDone(uint64_t id, absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (finished_ || failed_) return;
    v1::CallbackNotice* notice = Pending().add_callbacks();
    notice->set_id(id);
    if (!status.ok()) {
      notice->set_code(static_cast<int32_t>(status.code()));
      notice->set_message(Truncated(status.message(), kMaxErrorMessageBytes));
    }
    FlushLocked();
  }

  v1::PipelineEvent& Pending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!pending_.has_value()) pending_.emplace();
    return *pending_;
  }

  void AckLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Pending().set_acknowledged(acknowledged_);
    FlushLocked();
  }

  // Writes what is pending unless a write is in flight (its completion
  // writes it) or a slice is running (its end does).
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pending_.has_value() && !writing_ && !applying_ && !finished_ &&
        !failed_) {
      WriteLocked();
    }
  }

  void WriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::PipelineEvent event = *std::move(pending_);
    pending_.reset();
    // Later events carry the count too, so a client never sees it go back.
    event.set_acknowledged(acknowledged_);
    // A notice holds a place as a fence result does.
    written_fences_ = event.fences_size() + event.callbacks_size();
    written_data_bytes_ = 0;
    for (const v1::FenceResult& fence : event.fences()) {
      written_data_bytes_ += fence.data().size();
    }
    out_bytes_.Clear();
    if (absl::Status s = SerializeRaw(event, &out_bytes_); !s.ok()) {
      EndLocked(s);
      return;
    }
    writing_ = true;
    StartWrite(&out_bytes_);
  }

  void ReadNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StartReadOutsideLock(*this, &incoming_, mu_, starting_reads_);
  }

  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_ || starting_reads_ > 0 || in_batch_ ||
        scheduled_ || fences_out_ > 0) {
      return;
    }
    if (failed_ || (reads_done_ && !pending_.has_value())) {
      finished_ = true;
      // The channel's place on its session is free before the client hears
      // the call ended (OnDone comes later). The reference taken here is
      // dropped in OnDone, outside every lock: it may be the session's last.
      if (channel_ != 0) {
        closing_session_ = session_.lock();
        if (closing_session_ != nullptr)
          closing_session_->CloseChannel(channel_);
        channel_ = 0;
      }
      // A channel whose session was closed (by its client, mostly) ended
      // normally: its status tells the client, the log says nothing.
      Finish(!end_status_.ok()
                 ? ToGrpcStatus(end_status_, context_,
                                session_closed_ ? FailureLog::kQuiet
                                                : FailureLog::kLog)
             : failed_         ? grpc::Status::CANCELLED
                               : grpc::Status::OK);
    }
  }

  OperatorService* const service_;
  grpc::CallbackServerContext* const context_;
  const TokenBoundCall binding_;  // Revoking the token ends the call.
  // Whose session the channel may name.
  const absl::StatusOr<std::string> caller_;
  const SessionLimits& limits_;
  CommandPipeline pipeline_;
  const std::shared_ptr<Link> link_;
  grpc::ByteBuffer incoming_;     // The read in flight.
  grpc::ByteBuffer batch_bytes_;  // The batch read, until opened.
  // The batch being applied; touched only by the slice that runs.
  std::optional<PipelineBatch> batch_;
  grpc::ByteBuffer out_bytes_;  // The write in flight.
  absl::Mutex mu_;
  std::string session_id_ ABSL_GUARDED_BY(mu_);
  std::string work_owner_ ABSL_GUARDED_BY(mu_);  // The session's.
  std::weak_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  uint64_t channel_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<Session> closing_session_ ABSL_GUARDED_BY(mu_);
  bool in_batch_ ABSL_GUARDED_BY(mu_) = false;
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;
  bool rerun_ ABSL_GUARDED_BY(mu_) = false;
  // A slice is applying commands (without mu_): events wait for its end.
  bool applying_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t acknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fences_out_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::PipelineEvent> pending_ ABSL_GUARDED_BY(mu_);
  size_t written_fences_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_data_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  int starting_reads_ ABSL_GUARDED_BY(mu_) = 0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  // end_status_ says the session was closed.
  bool session_closed_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
OperatorService::Pipeline(grpc::CallbackServerContext* context) {
  return new Pipeliner(this, context);
}

}  // namespace opserver
