// The raw-RPC client the soak's scenarios run on (RunRpcClient in
// soak_scenarios.h is its entry point): a session as the client knows it,
// a typed wrapper per RPC that records every outcome (defined in
// soak_rpc_calls.cc), and the scenarios, defined by kind:
// soak_scenarios.cc and soak_compute_scenario.cc (valid work and the
// loops), soak_invalid_scenarios.cc and soak_handle_scenarios.cc (invalid
// requests made on purpose) and soak_fault_scenarios.cc (calls abandoned
// or cut in the middle).
#ifndef OPSERVER_BENCH_SOAK_RPC_CLIENT_H_
#define OPSERVER_BENCH_SOAK_RPC_CLIENT_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/soak_reference.h"
#include "bench/soak_report.h"
#include "bench/soak_scenarios.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver::soak::rpc {

// A session as its client knows it: every handle it holds, so that stats,
// foreign handles and cleanup can be checked exactly.
struct SessionState {
  std::string token;
  bool attached = false;
  std::unique_ptr<grpc::ClientContext> attach_context;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attach_reader;
  std::map<uint64_t, uint64_t> buffers;  // handle -> size
  std::set<uint64_t> streams;
  std::set<uint64_t> executors;  // Not yet consumed (or repeatable).
  std::set<uint64_t> repeatable;
  bool open() const { return !token.empty(); }
  bool Owns(uint64_t handle) const {
    return buffers.count(handle) || streams.count(handle) ||
           executors.count(handle);
  }
};

// Handles other clients hold, for the foreign-handle requests.
class ForeignHandles {
 public:
  void Publish(char kind, uint64_t handle) {
    absl::MutexLock lock(&mu_);
    auto& ring = rings_[kind];
    if (ring.size() < 512) {
      ring.push_back(handle);
    } else {
      ring[next_[kind]++ % ring.size()] = handle;
    }
  }
  // A handle of `kind` some other session made, or 0.
  uint64_t Pick(char kind, std::mt19937_64& rng) {
    absl::MutexLock lock(&mu_);
    auto& ring = rings_[kind];
    if (ring.empty()) return 0;
    return ring[rng() % ring.size()];
  }

 private:
  absl::Mutex mu_;
  std::map<char, std::vector<uint64_t>> rings_ ABSL_GUARDED_BY(mu_);
  std::map<char, size_t> next_ ABSL_GUARDED_BY(mu_);
};

// The one set of the process.
ForeignHandles& Foreign();

// The codes of the errors invalid requests expect.
inline constexpr uint32_t kNotFound = Bit(StatusCode::NOT_FOUND);
inline constexpr uint32_t kInvalid = Bit(StatusCode::INVALID_ARGUMENT);
inline constexpr uint32_t kExhausted = Bit(StatusCode::RESOURCE_EXHAUSTED);
inline constexpr uint32_t kPrecondition = Bit(StatusCode::FAILED_PRECONDITION);

struct ComputeCase;  // soak_compute_scenario.cc

class Client {
 public:
  explicit Client(const ClientOptions& o)
      : id_(o.id),
        address_(o.address),
        tenant_(o.tenant),
        conn_(o.shared),
        stats_(o.stats),
        rng_(o.seed),
        mode_(o.mode) {
    if (conn_ == nullptr) conn_ = Connect(address_, true, o.token);
  }

  // Loops over scenarios until `end` or `stop`, then ends its session.
  void Run(absl::Time end, const std::atomic<bool>* stop);
  // Shutdown mode: a transfer of 64 MiB that takes about 20 s (a slow
  // writer or a slow reader), so it is still running when the server's
  // shutdown grace ends.
  void SlowTransfer(bool upload);
  // An Upload (`chunk` bytes a message, `write_pause` after each) or a
  // Download (`read_pause` after each message read) of buffer[0, size) of
  // session `token`, recorded under `name` with `e`: transfers that must
  // still be running when something else happens to them.
  void PacedTransfer(bool upload, const std::string& token, uint64_t buffer,
                     uint64_t size, uint64_t chunk, absl::Duration write_pause,
                     absl::Duration read_pause, const char* name,
                     const Expect& e);

 private:
  // ------------------------------------------------------------ helpers

  uint64_t Rand(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool Chance(double p) {
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[Rand(v.size())];
  }

  // In shutdown mode every valid call may also meet the server stopping.
  Expect V() {
    if (mode_ == Mode::kShutdown) {
      return Invalid("server_shutdown", Bit(StatusCode::OK) |
                                            Bit(StatusCode::UNAVAILABLE) |
                                            Bit(StatusCode::CANCELLED));
    }
    return Valid();
  }

  Outcome Record(const char* rpc, const Expect& e, const grpc::Status& status,
                 const grpc::ClientContext& context) {
    Outcome o = FromStatus(status, context);
    stats_->Record(rpc, e, o);
    return o;
  }

  template <typename Req, typename Resp, typename Fn>
  Outcome Unary(const char* rpc, Fn fn, const Req& request, Resp* response,
                const Expect& e, absl::Duration deadline = kCallDeadline) {
    grpc::ClientContext context;
    SetDeadline(&context, deadline);
    grpc::Status status = fn(&context, request, response);
    return Record(rpc, e, status, context);
  }

#define SOAK_RT(method)                                    \
  [this](grpc::ClientContext* c, const auto& r, auto* p) { \
    return conn_->rt->method(c, r, p);                     \
  }
#define SOAK_OPS(method)                                   \
  [this](grpc::ClientContext* c, const auto& r, auto* p) { \
    return conn_->ops->method(c, r, p);                    \
  }

  std::string RandomToken() {
    return absl::StrFormat("%016x%016x", rng_(), rng_());
  }

  // ------------------------------------------------------------ sessions

  bool OpenSession(SessionState* s, bool attach);

  // Cancels the session's Attach call and records how it ended.
  void EndAttach(SessionState* s, const Expect& e);

  Expect AttachEnd() {
    // Ended by our cancel (CANCELLED) or by the server after CloseSession
    // or at shutdown (OK).
    Expect e = Invalid("attach_cancel",
                       Bit(StatusCode::OK) | Bit(StatusCode::CANCELLED));
    if (mode_ == Mode::kShutdown) e.codes |= Bit(StatusCode::UNAVAILABLE);
    return e;
  }

  void CloseSession(SessionState* s);

  // The server closes the session when its Attach call ends.
  void DropAttach(SessionState* s) {
    EndAttach(s, AttachEnd());
    *s = SessionState();
  }

  bool EnsureSession() {
    if (main_.open()) return true;
    return OpenSession(&main_, Chance(0.6));
  }

  // ------------------------------------------------------------ memory

  uint64_t Malloc(SessionState* s, uint64_t size, const Expect& e);
  uint64_t Malloc(SessionState* s, uint64_t size) {
    return Malloc(s, size, V());
  }

  Outcome Free(SessionState* s, uint64_t buffer, const Expect& e);
  bool Free(SessionState* s, uint64_t buffer) {
    return Free(s, buffer, V()).ok();
  }

  // ------------------------------------------------------------ streams

  uint64_t CreateStream(SessionState* s, const Expect& e);

  Outcome DestroyStream(SessionState* s, uint64_t stream, const Expect& e);

  Outcome Sync(SessionState* s, uint64_t stream, const Expect& e);
  bool Sync(SessionState* s, uint64_t stream) {
    return Sync(s, stream, V()).ok();
  }

  // A stream of the main session to run on: 0 or one of up to 3 others.
  uint64_t PickStream();

  // ------------------------------------------------------------ transfers

  // Streams `data` into buffer[offset, +size) in chunks of `chunk` bytes;
  // the first message carries data or only the header.
  Outcome Upload(SessionState* s, uint64_t buffer, uint64_t offset,
                 const std::string& data, uint64_t stream, uint64_t chunk,
                 const Expect& e, bool header_alone = false,
                 uint64_t announced = UINT64_MAX);

  Outcome Download(SessionState* s, uint64_t buffer, uint64_t offset,
                   uint64_t size, uint64_t stream, std::string* out,
                   const Expect& e);

  Outcome WriteValues(SessionState* s, uint64_t buffer, uint64_t offset,
                      DataType dt, const std::vector<double>& values,
                      uint64_t stream, const Expect& e);

  Outcome ReadValues(SessionState* s, uint64_t buffer, uint64_t offset,
                     DataType dt, uint64_t count, uint64_t stream,
                     std::vector<double>* values, const Expect& e);

  // ------------------------------------------------------------ executors

  uint64_t GetWorkspaceSize(SessionState* s,
                            v1::GetWorkspaceSizeRequest request,
                            uint64_t* workspace, const Expect& e);

  v1::ExecuteRequest LaunchRequest(SessionState* s, uint64_t executor,
                                   uint64_t stream, uint64_t ws_buffer = 0,
                                   uint64_t ws_offset = 0,
                                   uint64_t ws_size = 0);

  void NoteLaunched(SessionState* s, uint64_t executor) {
    if (!s->repeatable.count(executor)) s->executors.erase(executor);
  }

  Outcome Execute(SessionState* s, const v1::ExecuteRequest& request,
                  const Expect& e);

  // Sends every launch on one ExecuteStream call (reading replies as they
  // come) and checks each reply against its expectation.
  bool ExecuteStream(SessionState* s,
                     const std::vector<v1::ExecuteRequest>& launches,
                     const std::vector<Expect>& expects, const Expect& call);

  Outcome SetRepeatable(SessionState* s, uint64_t executor, const Expect& e);

  Outcome DestroyExecutor(SessionState* s, uint64_t executor, const Expect& e);

  // A tiny valid ThresholdBackward executor over `buffer` (>= 16 bytes).
  v1::GetWorkspaceSizeRequest TinyThreshold(uint64_t buffer);

  // A handle number of another session that this session does not own.
  uint64_t ForeignHandle(char kind);

  // A small buffer of the main session, made if needed.
  uint64_t AnyBuffer(uint64_t min_size = 64) {
    for (const auto& [handle, size] : main_.buffers) {
      if (size >= min_size) return handle;
    }
    return Malloc(&main_, std::max<uint64_t>(min_size, 256));
  }

  // ------------------------------------------------------------ scenarios
  // Valid work and the loops (soak_scenarios.cc).

  void RunSoakScenario();
  bool RunShutdownScenario();
  void EndClient();
  bool Compute();
  bool Transfer();
  bool Pipeline();
  void InfoScenario();
  void CheckSessionStats();
  void StreamScenario();
  void SessionScenario();
  void EvaluateScenario();

  void ComputeScenario() { Compute(); }

  // Compute's steps, in the order of their random draws
  // (soak_compute_scenario.cc).
  ComputeCase DrawCompute();
  void DrawComputeInputs(ComputeCase& c);
  bool PlaceCompute(ComputeCase& c);
  bool PlanCompute(ComputeCase& c);
  bool LaunchCompute(ComputeCase& c);
  bool CheckCompute(const ComputeCase& c);
  void TransferScenario() { Transfer(); }

  // ------------------------------------------------ invalid, on purpose
  // soak_invalid_scenarios.cc

  void InvalidScenario();
  void Oversized();
  void BadRange();
  void BadUpload();
  void BadValue();
  void StreamMisuse();
  void SessionMisuse();
  void BadShape();
  void BadDType();
  void BadParam();
  void SmallWorkspace();
  void StreamLimit();
  void MixedPipeline();

  // ------------------------------------ handles not the caller's to use
  // soak_handle_scenarios.cc

  void BadSession();
  void AnyRpcOn(SessionState* fake, const Expect& e);
  void ForeignBuffer();
  void ForeignExecutor();
  void ForeignStream();
  void UnknownHandle();
  void FreedBuffer();
  void ConsumedExecutor();

  // ------------------------------------------------ faults, in-process
  // soak_fault_scenarios.cc

  void FaultScenario();
  void CancelUpload();
  void CancelDownload();
  void CancelPipeline();
  void CloseMidPipeline();
  void CloseMidTransfer();
  void UnreadPipeline();
  void CancelAttach();
  void CloseWithWork();

  const int id_;
  const std::string address_;
  const std::string tenant_;
  std::shared_ptr<Conn> conn_;
  Stats* const stats_;
  std::mt19937_64 rng_;
  const Mode mode_;
  SessionState main_;
};

}  // namespace opserver::soak::rpc

#endif  // OPSERVER_BENCH_SOAK_RPC_CLIENT_H_
