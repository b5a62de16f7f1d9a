#ifndef OPSERVER_RUNTIME_SESSION_LIMITS_H_
#define OPSERVER_RUNTIME_SESSION_LIMITS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"

namespace opserver {

// Limits on what clients may hold; each is a server flag.
struct SessionLimits {
  uint64_t session_memory_bytes = 16ull << 30;
  uint32_t max_sessions = 64;
  uint32_t max_handles_per_session = 65536;
  // Each stream owns a thread, hence a much smaller limit than for handles.
  // Destroyed streams count until their thread is gone.
  uint32_t max_streams_per_session = 16;
  // Launches waiting on one stream (each holds its executor's buffers).
  uint32_t max_queued_per_stream = 16384;
  // Elements one launch may compute: bounds the time one launch holds a
  // stream (and teardown or shutdown waiting for it); ~1-2 s at 2^31.
  uint64_t max_launch_elements = 1ull << 31;
  // ExecuteStream replies waiting for a client that does not read them;
  // reading stops at this many.
  uint32_t max_pending_replies = 1024;
  // Evaluate calls computing at once (they need no session); more are
  // RESOURCE_EXHAUSTED.
  uint32_t max_concurrent_evaluates = 4;
  // Operators.Pipeline: channels open on one session, and what one batch
  // (one PipelineRequest) may hold. A batch is parsed and applied on the
  // server's workers, so these bound the memory and the time one message
  // can cost: a parsed batch takes about 15 times its wire size.
  uint32_t max_pipelines_per_session = 8;
  uint64_t max_pipeline_batch_bytes = 4ull << 20;
  uint32_t max_pipeline_batch_commands = 65536;
  // Attach calls open on one session (the documented use is one, tying the
  // session to a process); each holds a call's state on the server.
  uint32_t max_attach_per_session = 4;
  // SynchronizeStream and SynchronizeEvent calls waiting on one session:
  // each holds a call's state (about 12 KiB) until answered, far more than
  // the event budget's unit, so they have a much smaller limit of their
  // own. A call cancelled or past its deadline stops counting at once.
  uint32_t max_pending_synchronizes_per_session = 256;
  // Graphs (runtime/graph.h) defined and not destroyed on one session, and
  // their tasks together: each task holds a prepared plan or a write's
  // bytes, charged to the session's memory as well.
  uint32_t max_graphs_per_session = 64;
  uint64_t max_graph_tasks_per_session = 65536;
  absl::Duration idle_timeout = absl::Minutes(5);
  // How long a blocking host callback may hold its stream after the server
  // told the client it was reached (runtime/host_callbacks.h).
  absl::Duration callback_block_timeout = absl::Seconds(60);
  // Per owner identity (a token's tenant, a client certificate), so one
  // tenant cannot starve the others; 0 = no limit beyond the ones above.
  uint32_t max_sessions_per_tenant = 0;
  uint64_t tenant_memory_bytes = 0;
};

// What one owner identity holds across its sessions.
struct TenantUsage {
  // Device memory reserved by its sessions' buffers.
  std::atomic<uint64_t> bytes{0};
  // Open sessions; guarded by the SessionManager's mutex.
  uint32_t sessions = 0;
};

// CreateSession's client_name is for logs and stats: at most this long.
inline constexpr size_t kMaxClientNameBytes = 256;

// Errors the server keeps for a client until they are reported (a Pipeline
// channel's deferred errors, refused plans) are cut to this many bytes:
// they may quote what the client sent, such as an op name of megabytes.
inline constexpr size_t kMaxKeptErrorBytes = 1024;

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_SESSION_LIMITS_H_
