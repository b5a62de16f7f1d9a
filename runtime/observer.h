// What the runtime reports as it works (launches, refused plans, Pipeline
// batches and commands, deferred errors, graph replays), to whoever
// watches: the server's metrics (server/metrics.h) implement it, so the
// runtime counts nothing itself and links no exporter. Every call is made
// where the event happens, often on a stream's thread for each launch, so
// an implementation must be cheap and thread-safe.
#ifndef OPSERVER_RUNTIME_OBSERVER_H_
#define OPSERVER_RUNTIME_OBSERVER_H_

#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"
#include "kernels/dtype.h"
#include "kernels/op_kind.h"

namespace opserver {

class RuntimeObserver {
 public:
  // One launch, from when it was queued: the observer makes it
  // (LaunchQueued), the stream's task reports its start and end through it.
  struct LaunchRecord {
    RuntimeObserver* observer;
    kernels::OpKind op;
    absl::Time queued;
    void Started() { observer->LaunchStarted(*this); }
    void Finished(int32_t aclnn_status) {  // 0: it succeeded.
      observer->LaunchFinished(*this, aclnn_status);
    }
  };

  virtual ~RuntimeObserver() = default;

  // A launch of `op` on `dtype` (its gradOutput's) was queued.
  virtual LaunchRecord LaunchQueued(kernels::OpKind op,
                                    kernels::DType dtype) = 0;
  // The launch `record` started running on its stream.
  virtual void LaunchStarted(const LaunchRecord& record) = 0;
  // The launch `record` ended with `aclnn_status` (0: it succeeded).
  virtual void LaunchFinished(const LaunchRecord& record,
                              int32_t aclnn_status) = 0;
  // GetWorkspaceSize refused a plan of `op` (unary or pipelined).
  virtual void PlanRefused(kernels::OpKind op, int32_t aclnn_status) = 0;
  // A Pipeline batch of `commands` commands was applied.
  virtual void PipelineBatch(size_t commands) = 0;
  // One Pipeline command of this oneof case (PipelineCommand's field
  // number).
  virtual void PipelineCommand(int command_case) = 0;
  // A fence reported a deferred error to its client.
  virtual void DeferredError() = 0;
  // A replay of a graph of `tasks` tasks was queued.
  virtual void GraphReplayed(uint64_t tasks) = 0;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_OBSERVER_H_
