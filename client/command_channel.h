// A session's ordered command channel to the server (Operators.Pipeline):
// commands are queued and return at once; a writer thread sends whatever
// has queued up as one message, and a reader thread takes the server's
// acknowledgements and fence results. Nothing waits for the network but
// Drain and Fence, and Send when the window is full.
#ifndef OPSERVER_CLIENT_COMMAND_CHANNEL_H_
#define OPSERVER_CLIENT_COMMAND_CHANNEL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/server_replies.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver {
namespace remote {

class Client;

// Executor ids a client chooses start here (the server's own handles count
// up from 1 and never get there); see PlanCommand in proto/opserver.proto.
inline constexpr uint64_t kClientExecutorBase = uint64_t{1} << 62;

// The most bytes one pipelined write or read carries (the server's
// PipelineCommand limit); larger transfers are Uploads and Downloads.
inline constexpr uint64_t kMaxPipelinedBytes = 1 << 20;

// The largest define_graph command a client sends: one batch holds it,
// and the server's --max_pipeline_batch_bytes is 4 MiB by default.
inline constexpr uint64_t kMaxGraphDefinitionBytes = (4 << 20) - (64 << 10);

// Back-pressure: at most this much is sent and not yet acknowledged.
struct ChannelWindow {
  uint64_t commands = 8192;
  uint64_t bytes = 16ull << 20;
  // Largest message the writer builds (well under the server's message
  // limit).
  uint64_t batch_bytes = 1ull << 20;
};

// Thread-safe.
//
//   auto channel = CommandChannel::Open(client, session_token, {});
//   if (absl::IsUnimplemented(channel.status())) ... use the unary calls;
//   (*channel)->Send(command);                 // returns at once
//   absl::Status deferred = (*channel)->Fence(stream, /*session=*/false);
class CommandChannel {
 public:
  // Opens the channel on `session` and waits (up to the client's call
  // timeout) for the server to accept it. UNIMPLEMENTED from a server
  // without the Pipeline RPC. `routing_key` (empty: none) is sent as the
  // session's routing key (common/session_routing.h).
  static absl::StatusOr<std::unique_ptr<CommandChannel>> Open(
      Client& client, const std::string& session,
      const std::string& routing_key, ChannelWindow window);
  // Ends the call; commands not yet acknowledged may be lost (Drain first).
  ~CommandChannel();

  // Queues `command`, waiting while the window is full. The error that
  // broke the channel, if it broke.
  absl::Status Send(v1::PipelineCommand command);
  // Waits until every command sent before the call took effect on the
  // server, so a unary call made next sees them.
  absl::Status Drain();
  // True when every command sent so far has been acknowledged: a unary
  // call made now is ordered after all of them without waiting.
  bool Idle();
  // Sends a fence (after everything sent before it) and waits for its
  // result: the deferred error of `stream` (session = false) or of the
  // session (session = true), with its aclnn status. A stream's error
  // carries the stream and the failing task's position
  // (common/task_position.h), as WaitRead's does.
  absl::Status Fence(uint64_t stream, bool session);
  // Queues `command`, then a fence on `stream` right behind it, and waits
  // for the fence as Fence(stream, false) does. Both are queued at once, so
  // the writer sends them in one message (unless what was queued before
  // fills the batch): a graph's replay and its synchronize cost the server
  // one read and one wake-up, not two. Sending them with Send and Fence
  // makes two messages whenever the writer takes the first alone.
  absl::Status SendThenFence(v1::PipelineCommand command, uint64_t stream);
  // Sends an event fence and waits until the event's most recent record
  // issued before it has completed (aclrtSynchronizeEvent). Its error:
  // NOT_FOUND for an unknown event, CANCELLED when it is destroyed first;
  // it reports no stream's deferred error.
  absl::Status FenceEvent(uint64_t event);
  // The same, giving up after `timeout` (DEADLINE_EXCEEDED); the event
  // fence carries no deferred error, so nothing is lost by giving up.
  absl::Status FenceEvent(uint64_t event, absl::Duration timeout);
  // Sends a query fence and waits for its answer: true while `stream` has
  // work queued or running on the server (one round trip).
  absl::StatusOr<bool> QueryStream(uint64_t stream);
  // Commands sent so far.
  uint64_t Issued();
  // The number (1 for the first command sent) of the last command sent
  // that queues work on `stream` (a launch, write, read, event operation,
  // memset or copy naming it; not a fence that only waits or asks); 0 when
  // none. A stream found idle by a fence sent after command N stays idle
  // while this is at most N.
  uint64_t LastWorkOn(uint64_t stream);
  // `stream` was destroyed: its entry goes.
  void ForgetStream(uint64_t stream);

  // A fence on `stream` that also reads buffer[offset, offset + size)
  // (size at most kMaxPipelinedBytes) once the stream's work before it has
  // run; returns at once with its id, which WaitRead takes. `data` must
  // stay valid until then.
  absl::StatusOr<uint64_t> SendRead(uint64_t stream, uint64_t buffer,
                                    uint64_t offset, uint64_t size, void* data);
  // Waits for the read `id` and copies its bytes into its `data`; returns
  // the stream's deferred error, as Fence does (the bytes are not copied
  // then).
  absl::Status WaitRead(uint64_t id);
  // Read `id` will not be waited for: its result is dropped when it comes,
  // and its `data` is never written.
  void ForgetRead(uint64_t id);

  // Host callbacks (CallbackCommand). `reached` is called once per
  // callback, with its id: OK once its stream reached it on the server,
  // else why it never will (refused, its stream destroyed, the channel
  // ended). It runs on the channel's reader thread (or the thread that
  // ends the channel), without the channel's lock, and must not block:
  // it hands the callback to whoever runs it.
  using CallbackReached = std::function<void(uint64_t id, absl::Status)>;
  // Queues a callback on `stream` and returns its id at once: the server
  // tells this channel when the stream reaches it, with no fence and no
  // round trip of its own. With `block`, the stream then waits for
  // ReleaseCallback(id). An error means `reached` will not be called.
  absl::StatusOr<uint64_t> SendCallback(uint64_t stream, bool block,
                                        CallbackReached reached);
  // Lets the stream of blocking callback `id` go on (queued like any
  // command; returns at once).
  absl::Status ReleaseCallback(uint64_t id);

  // Fence results received and not yet taken: at most one per fence
  // awaited (a hostile server's replays end the channel instead).
  size_t HeldResults();

 private:
  // Where a read fence puts its bytes.
  struct ReadTarget {
    void* data;
    uint64_t size;
    uint64_t stream;  // Whose deferred error the read reports.
  };

  CommandChannel(Client& client, ChannelWindow window);
  void WriteLoop();
  void ReadLoop();
  // ReadLoop's reading, until the call ended and broken_ says why.
  void ReadUntilEnd();
  // One event from the server: acknowledgements, results and callback
  // notices taken (the callbacks run here, without mu_). False when the
  // event breaks the protocol: broken_ says so and the call is cancelled.
  bool ApplyEvent(const v1::PipelineEvent& event);
  // After the last event: finishes the call and sets broken_ to why it
  // ended.
  void EndCall();
  // Waits for `ready` (evaluated under mu_) or the channel to break, at
  // most `timeout`.
  // Sends a fence command with a new id; its result is collected by id.
  // `read`: where a read fence's bytes go (null for other fences).
  // `answer_bytes`: the data a result without error must carry (a query's
  // byte; a read's size comes from `read`).
  // `before` (may be null): a command queued with the fence, just ahead
  // of it.
  absl::StatusOr<uint64_t> SendFence(v1::PipelineCommand command,
                                     const ReadTarget* read = nullptr,
                                     uint64_t answer_bytes = 0,
                                     v1::PipelineCommand* before = nullptr);
  // Queues `commands` in order, together (the writer takes them in one
  // message), waiting while the window has no room for all of them (for
  // an empty window when they are more than window_.commands).
  absl::Status SendAll(absl::Span<v1::PipelineCommand> commands);
  // Waits for fence `id`'s result and takes it (at most `timeout`; the
  // client's wait timeout when not given).
  absl::StatusOr<v1::FenceResult> TakeFence(
      uint64_t id, absl::string_view what,
      std::optional<absl::Duration> timeout = std::nullopt);
  absl::Status WaitLocked(absl::FunctionRef<bool()> ready,
                          absl::Duration timeout, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client& client_;
  const ChannelWindow window_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::PipelineRequest, v1::PipelineEvent>>
      stream_;
  std::thread writer_;
  std::thread reader_;

  absl::Mutex mu_;
  // Queued, not yet handed to the writer.
  std::deque<v1::PipelineCommand> queue_ ABSL_GUARDED_BY(mu_);
  // Commands sent (queued), and handed to the transport, so far.
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  // (last command number, bytes) of each command not yet acknowledged, for
  // the byte window.
  std::deque<std::pair<uint64_t, uint64_t>> unacked_ ABSL_GUARDED_BY(mu_);
  uint64_t unacked_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  // The server ended the call (the reader is collecting its status).
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  // The writer is inside stream_->Write: the reader's Finish waits for it
  // (gRPC's Finish is for when nothing more is being sent).
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Set once the call ended: every later call returns it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t next_fence_ ABSL_GUARDED_BY(mu_) = 1;
  // See LastWorkOn; one entry per stream the session's commands named.
  absl::flat_hash_map<uint64_t, uint64_t> last_work_ ABSL_GUARDED_BY(mu_);
  // The server's replies: acknowledgements, and results of awaited fences.
  PipelineReplies replies_ ABSL_GUARDED_BY(mu_);
  // Where each read fence not yet waited for puts its bytes.
  absl::flat_hash_map<uint64_t, ReadTarget> reads_ ABSL_GUARDED_BY(mu_);
  // Callbacks sent whose notice has not come.
  uint64_t next_callback_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, CallbackReached> callbacks_
      ABSL_GUARDED_BY(mu_);
  // Tells every callback still waiting that it never will run (the
  // channel ended with `why`). Call without mu_.
  void EndCallbacks();
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_COMMAND_CHANNEL_H_
