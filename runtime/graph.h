// Graphs: the server side of CANN's aclmdlRI capture, without the
// transport (see DefineGraphCommand in proto/opserver.proto and
// docs/graphs.md). A graph is defined once from recorded commands; every
// task is validated and prepared then, and a replay runs the prepared
// tasks on a stream without parsing, validating or planning anything
// again.
//
// A replay is queued as one unit of work: one Stream task runs every
// launch, memset, copy and write of the graph in order on the stream's
// device stream. Only event tasks split it: a record is queued as the
// stream's own event record (so waiters outside the graph see it), a wait
// on an event recorded outside the graph as the stream's own wait; a wait
// on an event recorded earlier in the same graph is already satisfied by
// the recorded order and costs nothing. A run of small tasks (each within
// the device's inline bound, runtime/executor.h, decided at definition, and
// all together within the caller's budget) queued on an idle stream runs at
// once on the thread that queues the replay (Stream::Enqueue's
// inline_if_idle: nothing is queued ahead, so the order is the stream's),
// with the stream's error positions, time-out and cancellation as on its
// thread; it pays no thread hand-off, and a synchronize behind it finds the
// stream idle. A larger run, or one behind queued work, goes to the
// stream's thread.
//
// Lifetime: the graph holds its executors (consumed into it at
// definition), the buffers they and its other tasks use, its events and
// its writes' bytes; queued replays hold the graph. So destroying a graph
// (or its session) with replays queued never frees memory they run on. A
// buffer whose handle was freed after the definition stays allocated (and
// charged) while the graph holds it, and a replay queued after the free
// is refused, with its stream's deferred error naming the task and the
// buffer: it must not write memory its owner already gave up.
#ifndef OPSERVER_RUNTIME_GRAPH_H_
#define OPSERVER_RUNTIME_GRAPH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "devices/device.h"
#include "proto/opserver.pb.h"
#include "runtime/event.h"
#include "runtime/memory_charge.h"
#include "runtime/observer.h"
#include "runtime/session.h"
#include "runtime/stream.h"

namespace opserver {

// What a graph costs the session's memory (--session_memory_bytes), beyond
// its writes' bytes: a prepared plan and its bookkeeping per task, about.
inline constexpr uint64_t kGraphBytes = 4 << 10;
inline constexpr uint64_t kGraphTaskBytes = 1 << 10;

class Graph : public std::enable_shared_from_this<Graph> {
 public:
  // One prepared task (public for the implementation's helpers only).
  struct Task;

  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  uint64_t id() const { return id_; }
  uint64_t tasks() const;
  // Replays queued so far, and those queued and not yet run (or dropped).
  uint64_t replays() const { return replays_.load(); }
  uint64_t pending_replays() const { return pending_->load(); }
  // One readable line per task, in order.
  std::vector<std::string> Describe() const;

  // Queues one replay on `stream` (see the top of this file); a run whose
  // tasks are each within the device's inline bound and together within
  // `inline_launches` times it (runtime/executor.h: kWorkerReplayLaunches
  // on a Pipeline worker, kUnaryReplayLaunches on an RPC thread) runs here
  // when the stream is idle. An error returned means nothing was queued:
  // the graph used a freed buffer (FAILED_PRECONDITION), the stream has no
  // device or refused the work (RESOURCE_EXHAUSTED when full, CANCELLED).
  // Errors while it runs are the stream's deferred error, named "replay of
  // graph G: task K of N: ".
  absl::Status Replay(Stream& stream, int64_t inline_launches);

 private:
  friend absl::Status DefineGraph(Session& session,
                                  const v1::DefineGraphCommand& define);
  struct Step;
  struct UsedBuffer;
  struct ReplayState;
  explicit Graph(uint64_t id);

  // Runs a step of kind kRun on `device`: its device graph, or its tasks
  // one by one; the first error, named.
  absl::Status Run(DeviceStream& device, const Step& step) const;
  // Issues tasks [begin, end) on `device`; the first error, unnamed, with
  // its task in *failed.
  absl::Status Issue(DeviceStream& device, size_t begin, size_t end,
                     size_t* failed) const;
  // Captures each run of device work that holds no write (a device graph
  // cannot hold host bytes) as a device graph, when `device` captures
  // graphs (a run it declines, UNIMPLEMENTED, stays a task list); an error
  // names the task or the run.
  absl::Status CaptureRuns(Device& device);
  absl::Status Named(const absl::Status& error, size_t task) const;

  const uint64_t id_;
  std::vector<Task> tasks_;
  // The replay's units, in order: runs of tasks, event records and waits.
  std::vector<Step> steps_;
  // Every buffer the tasks use, once, for the freed check.
  std::vector<UsedBuffer> buffers_;
  MemoryCharge charge_;
  RuntimeObserver* observer_ = nullptr;
  // The device's inline bound at definition (Device::
  // inline_launch_elements), in launch elements.
  int64_t inline_bound_ = 0;
  std::atomic<uint64_t> replays_{0};
  // Shared with queued replays, which may outlive the graph's last user.
  const std::shared_ptr<std::atomic<uint64_t>> pending_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

// Validates and prepares `define` against `session` and adds the graph to
// it (Session::AddGraph), consuming the launches' single-use executors.
// All or nothing: a refused definition leaves the session as it was, and
// its error names the task ("task 3 of 250: no buffer 7 ..."), with the
// code of the check that failed (NOT_FOUND for an unknown handle,
// INVALID_ARGUMENT for a task of another kind or an empty graph,
// RESOURCE_EXHAUSTED past the graph limits or the session's memory).
absl::Status DefineGraph(Session& session,
                         const v1::DefineGraphCommand& define);

// Queues a replay of graph `graph` of `session` on `stream`
// (Graph::Replay); NOT_FOUND for an unknown graph.
absl::Status ReplayGraph(Session& session, uint64_t graph, Stream& stream,
                         int64_t inline_launches);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_GRAPH_H_
