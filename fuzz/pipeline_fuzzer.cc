// The Pipeline channel: the input is a serialized PipelineRequest whose
// commands (plans under client ids, launches, frees, executor calls,
// fences) are applied by CommandPipeline through PipelineBatch (which keeps
// a batch in its wire form and parses a slice at a time), as the gRPC
// reactor does, to a session holding buffers 1..7 of fixed sizes (each its
// own exact heap block; their bytes are the input's) and a second stream
// (8), with small limits: 16 queued launches per stream, 64 handles, 2^20
// elements a launch, 4 fences held. The driver plays the reactor: it waits
// whenever the pipeline stops for room and releases fence results as a writer
// would; then it synchronizes, closes the session and waits for its stream
// threads, so no input leaves work behind for the next.
//
// Huge names and batches, beyond what libFuzzer's input length allows: an
// op name starting with '*' is grown to 1 MiB, and a batch whose session
// field is "repeat:N" has its commands repeated N times (N < 512), so a
// batch holds tens of thousands of commands. The driver applies each batch
// in slices of a size the input chooses (its first byte), as the reactor
// does with its workers.
//
// Invariants besides memory and thread safety: Apply always finishes the
// batch (a stop is always resumed), every fence is answered exactly once,
// no deferred error is INTERNAL, and every error the server keeps or
// reports is short whatever the names in the batch (a refused plan's kept
// error is at most 1 KiB, a reported one at most 2 KiB). A data_transfer
// reaches the data path (a stand-in that holds its stream with a gate and
// lets go at once) only checked: its range inside its buffer, a stream with
// a device, its own session; every other one is refused (Refuse with its
// ticket), so each is exactly one of the two. PipelineBatch
// opens every PipelineRequest with its session and command count, parses
// every command of one, and refuses other bytes with INVALID_ARGUMENT.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "fuzz/fuzz_support.h"
#include "proto/opserver.pb.h"
#include "runtime/command_pipeline.h"
#include "runtime/data_transfers.h"
#include "runtime/pipeline_batch.h"
#include "runtime/session.h"

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

// Bytes that are not a PipelineRequest, as the channel gets them: refused
// (or, for a command that does not parse, refused when its slice is
// parsed), never read past.
void CheckUnparsed(const uint8_t* data, size_t size) {
  absl::StatusOr<PipelineBatch> batch = PipelineBatch::Open(
      std::string(reinterpret_cast<const char*>(data), size), SIZE_MAX);
  FUZZ_CHECK(
      batch.ok() || batch.status().code() == absl::StatusCode::kInvalidArgument,
      batch.status().ToString());
}

// The data path's stand-in (runtime/data_transfers.h): checks what the
// pipeline hands it and counts.
class CheckedTransfers : public DataTransfers {
 public:
  explicit CheckedTransfers(const Session* session) : session_(session) {}

  absl::Status Start(Request request) override {
    FUZZ_CHECK(request.owner == session_, "another session's transfer");
    FUZZ_CHECK(
        request.stream != nullptr && request.stream->device_stream() != nullptr,
        "a transfer without a device stream");
    FUZZ_CHECK(request.buffer != nullptr &&
                   request.offset <= request.buffer->size() &&
                   request.size <= request.buffer->size() - request.offset,
               "a transfer outside its buffer");
    if (request.ticket.size() != 16) {
      return absl::InvalidArgumentError("ticket: not 16 bytes");
    }
    auto gate = std::make_shared<Stream::Gate>();
    RETURN_IF_ERROR(request.stream->Hold(
        gate, [] {}, [] {}));
    absl::MutexLock lock(&mu_);
    ++started_;
    return absl::OkStatus();  // The gate goes now: the stream goes on.
  }
  void Refuse(const std::string&) override {
    absl::MutexLock lock(&mu_);
    ++refused_;
  }
  void Cancel(const void* owner, const std::string&) override {
    FUZZ_CHECK(owner == session_, "another session's cancel");
  }
  size_t handled() {
    absl::MutexLock lock(&mu_);
    return started_ + refused_;
  }

 private:
  const Session* const session_;
  absl::Mutex mu_;
  size_t started_ ABSL_GUARDED_BY(mu_) = 0;
  size_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

// Grows '*' op names to 1 MiB and repeats a "repeat:N" batch's commands
// N times (see the top of the file).
void Grow(v1::PipelineRequest& request) {
  for (v1::PipelineCommand& command : *request.mutable_commands()) {
    if (command.has_plan() && !command.plan().request().op().empty() &&
        command.plan().request().op()[0] == '*') {
      std::string* op = command.mutable_plan()->mutable_request()->mutable_op();
      const std::string seed = *op;
      while (op->size() < (size_t{1} << 20)) op->append(seed);
    }
  }
  unsigned repeat = 0;
  if (absl::SimpleAtoi(absl::StripPrefix(request.session(), "repeat:"),
                       &repeat) &&
      repeat > 1 && repeat < 512 && request.commands_size() <= 64) {
    const auto once = request.commands();
    for (unsigned i = 1; i < repeat; ++i) {
      for (const v1::PipelineCommand& command : once) {
        *request.add_commands() = command;
      }
    }
  }
}

// Buffers 1..7 holding the input's bytes, and stream 8.
void Populate(Session& session, const uint8_t* data, size_t size) {
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
}

// The fences answered, each result checked as it comes.
struct Answers {
  void Answer(uint64_t id, const absl::Status& status,
              const std::string& data) {
    Report("fence", status);
    FUZZ_CHECK(data.size() <= CommandPipeline::kMaxCommandBytes, "a read of ",
               data.size(), " bytes");
    FUZZ_CHECK(status.ok() || data.empty(), "a failed read carried bytes");
    FUZZ_CHECK(status.code() != absl::StatusCode::kInternal, status.ToString());
    FUZZ_CHECK(status.message().size() <= 2048, "a reported error of ",
               status.message().size(), " bytes");
    absl::MutexLock lock(&mu);
    answered.insert(id);
  }

  absl::Mutex mu;
  std::multiset<uint64_t> answered ABSL_GUARDED_BY(mu);
};

// The request in its wire form, when it fits a batch the server admits
// (4 MiB, the default --max_pipeline_batch_bytes); the grown batches
// beyond that go to CommandPipeline parsed, as before.
std::optional<PipelineBatch> OpenBatch(const v1::PipelineRequest& request) {
  if (request.ByteSizeLong() > (size_t{4} << 20)) return std::nullopt;
  absl::StatusOr<PipelineBatch> opened =
      PipelineBatch::Open(request.SerializeAsString(), SIZE_MAX);
  FUZZ_CHECK(opened.ok(),
             "a PipelineRequest did not open: ", opened.status().ToString());
  FUZZ_CHECK(opened->size() == static_cast<size_t>(request.commands_size()) &&
                 opened->session() == request.session(),
             "the batch's commands or session differ from the request's");
  return *std::move(opened);
}

// Applies every command as the reactor does, `slice` at a time, waiting
// whenever the pipeline stops for room and releasing fence results as a
// writer would; the fences applied.
size_t ApplyAll(CommandPipeline& pipeline, Session& session,
                const v1::PipelineRequest& request,
                std::optional<PipelineBatch>& batch, size_t slice) {
  const size_t n = request.commands_size();
  size_t at = 0, fences_applied = 0;
  while (at < n) {
    auto resumed = std::make_shared<absl::Notification>();
    const CommandPipeline::Resume resume = [resumed] { resumed->Notify(); };
    const size_t end = std::min(n, at + slice);
    if (batch.has_value()) {
      absl::StatusOr<PipelineBatch::Progress> progress =
          batch->ApplyNext(pipeline, session, slice, resume);
      FUZZ_CHECK(progress.ok(),
                 "a command of a PipelineRequest did not parse: ",
                 progress.status().ToString());
      at += progress->applied;
      fences_applied += progress->fences;
      FUZZ_CHECK(batch->applied() == at, "the batch lost count");
    } else {
      const size_t next =
          pipeline.Apply(session, request.commands(), at, end, resume);
      for (size_t i = at; i < next; ++i) {
        fences_applied += request.commands(static_cast<int>(i)).has_fence();
      }
      at = next;
    }
    const bool stopped = at < end;
    // What the reactor's writes would do: results leave, room returns.
    pipeline.FencesWritten(SIZE_MAX, 0);
    if (stopped) {
      FUZZ_CHECK(resumed->WaitForNotificationWithTimeout(absl::Seconds(30)),
                 "a stopped pipeline was never resumed at command ", at);
    }
  }
  return fences_applied;
}

// A refused plan's kept error is short whatever its names.
void CheckRefusedPlans(Session& session, const v1::PipelineRequest& request) {
  for (const v1::PipelineCommand& command : request.commands()) {
    if (!command.has_plan()) continue;
    std::optional<absl::Status> kept =
        session.RefusedPlan(command.plan().executor(), /*launch=*/false);
    FUZZ_CHECK(!kept.has_value() || kept->message().size() <= 1100,
               "a refused plan keeps ", kept->message().size(), " bytes");
  }
}

}  // namespace
}  // namespace opserver::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserver;
  using namespace opserver::fuzz;
  QuietProtobuf();
  v1::PipelineRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) {
    CheckUnparsed(data, size);
    return 0;
  }
  Grow(request);
  const size_t slice = size == 0 ? 1 : 1 + data[0] % 64;
  static HeapDevice* const device = new HeapDevice(uint64_t{1} << 30);
  static const SessionLimits limits = Limits();
  MemoryAccounting account;
  auto threads = std::make_shared<StreamThreads>();
  {
    Session session("s", 1, "pipeline_fuzzer", device, &limits, &account,
                    threads);
    Populate(session, data, size);
    size_t fences = 0;
    size_t transfers = 0;
    for (const auto& command : request.commands()) {
      fences += command.has_fence();
      transfers += command.has_data_transfer();
    }
    Answers answers;
    CheckedTransfers data_path(&session);
    CommandPipeline pipeline(
        limits, /*max_fences=*/4,
        [&](uint64_t id, absl::Status status, std::string data) {
          answers.Answer(id, status, data);
        },
        /*observer=*/nullptr, &data_path);
    std::optional<PipelineBatch> batch = OpenBatch(request);
    const size_t fences_applied =
        ApplyAll(pipeline, session, request, batch, slice);
    FUZZ_CHECK(fences_applied == fences, "applied ", fences_applied,
               " fences of ", fences);
    for (const std::shared_ptr<Stream>& s : session.AllStreams()) {
      s->SynchronizeAndWait().IgnoreError();
    }
    CheckRefusedPlans(session, request);
    FUZZ_CHECK(data_path.handled() == transfers, "of ", transfers,
               " data transfers, ", data_path.handled(),
               " were started or refused");
    absl::MutexLock lock(&answers.mu);
    FUZZ_CHECK(answers.answered.size() == fences, "answered ",
               answers.answered.size(), " fences of ", fences);
  }
  // The session's stream threads end once they ran what they hold.
  FUZZ_CHECK(threads->WaitForZero(absl::Seconds(30)),
             "stream threads still running");
  FUZZ_CHECK(device->used() == 0, "device memory left: ", device->used());
  return 0;
}
