// The Pipeline channel: the input is a serialized PipelineRequest whose
// commands (plans under client ids, launches, frees, executor calls,
// fences) are applied by CommandPipeline, what the gRPC reactor calls,
// to a session holding buffers 1..7 of fixed sizes (each its own exact
// heap block; their bytes are the input's) and a second stream (8), with
// small limits: 16 queued launches per stream, 64 handles, 2^20 elements a
// launch, 4 fences held. The driver plays the reactor: it waits whenever
// the pipeline stops for room and releases fence results as a writer
// would; then it synchronizes, closes the session and waits for its stream
// threads, so no input leaves work behind for the next.
//
// Invariants besides memory and thread safety: Apply always finishes the
// batch (a stop is always resumed), every fence is answered exactly once,
// and no deferred error is INTERNAL.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "fuzz/fuzz_support.h"
#include "proto/opserver.pb.h"
#include "server/pipeline.h"
#include "server/session.h"

namespace opserver::fuzz {
namespace {

constexpr uint64_t kBufferBytes[] = {0, 1, 16, 64, 256, 4096, 65536 + 64};
constexpr int kBuffers = sizeof(kBufferBytes) / sizeof(kBufferBytes[0]);

SessionLimits Limits() {
  SessionLimits limits;
  limits.max_queued_per_stream = 16;
  limits.max_handles_per_session = 64;
  limits.max_launch_elements = uint64_t{1} << 20;
  limits.max_streams_per_session = 4;
  return limits;
}

}  // namespace
}  // namespace opserver::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserver;
  using namespace opserver::fuzz;
  QuietProtobuf();
  v1::PipelineRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  static HeapDevice* const device = new HeapDevice(uint64_t{1} << 30);
  static const SessionLimits limits = Limits();
  MemoryAccounting account;
  auto threads = std::make_shared<StreamThreads>();
  {
    Session session("s", 1, "pipeline_fuzzer", device, &limits, &account,
                    threads);
    for (int i = 0; i < kBuffers; ++i) {
      absl::StatusOr<uint64_t> handle = session.Malloc(kBufferBytes[i]);
      FUZZ_CHECK(handle.ok() && *handle == static_cast<uint64_t>(i + 1),
                 handle.status().ToString());
      FillCyclic((*session.GetBuffer(*handle))->data(), kBufferBytes[i], data,
                 size);
    }
    absl::StatusOr<uint64_t> stream = session.CreateStream();
    FUZZ_CHECK(stream.ok() && *stream == kBuffers + 1,
               stream.status().ToString());

    absl::Mutex mu;
    std::multiset<uint64_t> answered;
    size_t fences = 0;
    for (const auto& command : request.commands())
      fences += command.has_fence();
    CommandPipeline pipeline(limits, /*max_fences=*/4,
                             [&](uint64_t id, absl::Status status) {
                               Report("fence", status);
                               FUZZ_CHECK(
                                   status.code() != absl::StatusCode::kInternal,
                                   status.ToString());
                               absl::MutexLock lock(&mu);
                               answered.insert(id);
                             });
    size_t at = 0;
    const size_t n = request.commands_size();
    while (at < n) {
      auto resumed = std::make_shared<absl::Notification>();
      at = pipeline.Apply(session, request.commands(), at, SIZE_MAX,
                          [resumed] { resumed->Notify(); });
      // What the reactor's writes would do: results leave, room returns.
      pipeline.FencesWritten(SIZE_MAX);
      if (at < n) {
        FUZZ_CHECK(resumed->WaitForNotificationWithTimeout(absl::Seconds(30)),
                   "a stopped pipeline was never resumed at command ", at);
      }
    }
    for (const std::shared_ptr<Stream>& s : session.AllStreams()) {
      s->SynchronizeAndWait().IgnoreError();
    }
    absl::MutexLock lock(&mu);
    FUZZ_CHECK(answered.size() == fences, "answered ", answered.size(),
               " fences of ", fences);
  }
  // The session's stream threads end once they ran what they hold.
  FUZZ_CHECK(threads->WaitForZero(absl::Seconds(30)),
             "stream threads still running");
  FUZZ_CHECK(device->used() == 0, "device memory left: ", device->used());
  return 0;
}
