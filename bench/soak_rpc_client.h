// The raw-RPC client the soak's scenarios run on (RunRpcClient in
// soak_scenarios.h is its entry point): a session as the client knows it,
// a typed wrapper per RPC that records every outcome, and the scenarios,
// defined in three files: soak_scenarios.cc (valid work and the loops),
// soak_invalid_scenarios.cc (invalid requests made on purpose) and
// soak_fault_scenarios.cc (calls abandoned or cut in the middle).
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

  bool OpenSession(SessionState* s, bool attach) {
    v1::CreateSessionRequest request;
    request.set_client_name(absl::StrCat("soak client ", id_));
    v1::CreateSessionResponse response;
    if (!Unary("CreateSession", SOAK_RT(CreateSession), request, &response, V())
             .ok()) {
      return false;
    }
    *s = SessionState();
    s->token = response.session();
    PublishSessionName(tenant_, s->token);
    if (attach) {
      s->attach_context = std::make_unique<grpc::ClientContext>();
      // Longer than the run: the server closes the session when it ends.
      SetDeadline(s->attach_context.get(), absl::Hours(2));
      v1::AttachRequest attach_request;
      attach_request.set_session(s->token);
      s->attach_reader =
          conn_->rt->Attach(s->attach_context.get(), attach_request);
      v1::AttachEvent event;
      if (!s->attach_reader->Read(&event) || event.event() != "attached") {
        EndAttach(s, V());
        if (mode_ == Mode::kSoak) {
          stats_->Problem("attach", "no 'attached' event");
        }
        return false;
      }
      s->attached = true;
    }
    return true;
  }

  // Cancels the session's Attach call and records how it ended.
  void EndAttach(SessionState* s, const Expect& e) {
    if (s->attach_reader == nullptr) return;
    s->attach_context->TryCancel();
    v1::AttachEvent event;
    while (s->attach_reader->Read(&event)) {
    }
    grpc::Status status = s->attach_reader->Finish();
    Record("Attach", e, status, *s->attach_context);
    s->attach_reader.reset();
    s->attach_context.reset();
    s->attached = false;
  }

  Expect AttachEnd() {
    // Ended by our cancel (CANCELLED) or by the server after CloseSession
    // or at shutdown (OK).
    Expect e = Invalid("attach_cancel",
                       Bit(StatusCode::OK) | Bit(StatusCode::CANCELLED));
    if (mode_ == Mode::kShutdown) e.codes |= Bit(StatusCode::UNAVAILABLE);
    return e;
  }

  void CloseSession(SessionState* s) {
    if (!s->open()) return;
    v1::CloseSessionRequest request;
    request.set_session(s->token);
    v1::CloseSessionResponse response;
    Unary("CloseSession", SOAK_RT(CloseSession), request, &response, V());
    EndAttach(s, AttachEnd());
    *s = SessionState();
  }

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

  uint64_t Malloc(SessionState* s, uint64_t size, const Expect& e) {
    v1::MallocRequest request;
    request.set_session(s->token);
    request.set_size(size);
    v1::MallocResponse response;
    if (!Unary("Malloc", SOAK_RT(Malloc), request, &response, e).ok()) return 0;
    s->buffers[response.buffer()] = size;
    Foreign().Publish('b', response.buffer());
    return response.buffer();
  }
  uint64_t Malloc(SessionState* s, uint64_t size) {
    return Malloc(s, size, V());
  }

  Outcome Free(SessionState* s, uint64_t buffer, const Expect& e) {
    v1::FreeRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    v1::FreeResponse response;
    Outcome o = Unary("Free", SOAK_RT(Free), request, &response, e);
    if (o.ok()) s->buffers.erase(buffer);
    return o;
  }
  bool Free(SessionState* s, uint64_t buffer) {
    return Free(s, buffer, V()).ok();
  }

  // ------------------------------------------------------------ streams

  uint64_t CreateStream(SessionState* s, const Expect& e) {
    v1::CreateStreamRequest request;
    request.set_session(s->token);
    v1::CreateStreamResponse response;
    if (!Unary("CreateStream", SOAK_RT(CreateStream), request, &response, e)
             .ok()) {
      return 0;
    }
    s->streams.insert(response.stream());
    Foreign().Publish('s', response.stream());
    return response.stream();
  }

  Outcome DestroyStream(SessionState* s, uint64_t stream, const Expect& e) {
    v1::DestroyStreamRequest request;
    request.set_session(s->token);
    request.set_stream(stream);
    v1::DestroyStreamResponse response;
    Outcome o = Unary("DestroyStream", SOAK_RT(DestroyStream), request,
                      &response, e, kTransferDeadline);
    if (o.ok()) s->streams.erase(stream);
    return o;
  }

  Outcome Sync(SessionState* s, uint64_t stream, const Expect& e) {
    v1::SynchronizeStreamRequest request;
    request.set_session(s->token);
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    return Unary("SynchronizeStream", SOAK_RT(SynchronizeStream), request,
                 &response, e, kTransferDeadline);
  }
  bool Sync(SessionState* s, uint64_t stream) {
    return Sync(s, stream, V()).ok();
  }

  // A stream of the main session to run on: 0 or one of up to 3 others.
  uint64_t PickStream() {
    if (Chance(0.5)) return 0;
    if (main_.streams.size() < 3) {
      uint64_t stream = CreateStream(&main_, V());
      if (stream != 0) return stream;
      return 0;
    }
    auto it = main_.streams.begin();
    std::advance(it, Rand(main_.streams.size()));
    return *it;
  }

  // ------------------------------------------------------------ transfers

  // Streams `data` into buffer[offset, +size) in chunks of `chunk` bytes;
  // the first message carries data or only the header.
  Outcome Upload(SessionState* s, uint64_t buffer, uint64_t offset,
                 const std::string& data, uint64_t stream, uint64_t chunk,
                 const Expect& e, bool header_alone = false,
                 uint64_t announced = UINT64_MAX) {
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    v1::UploadResponse response;
    auto writer = conn_->rt->Upload(&context, &response);
    v1::UploadRequest message;
    message.set_session(s->token);
    message.set_buffer(buffer);
    message.set_offset(offset);
    message.set_size(announced == UINT64_MAX ? data.size() : announced);
    message.set_stream(stream);
    bool ok = true;
    if (header_alone) ok = writer->Write(message);
    message.Clear();
    if (!header_alone) {
      message.set_session(s->token);
      message.set_buffer(buffer);
      message.set_offset(offset);
      message.set_size(announced == UINT64_MAX ? data.size() : announced);
      message.set_stream(stream);
    }
    size_t at = 0;
    bool first = !header_alone;
    while (ok && (at < data.size() || first)) {
      const size_t n = std::min<size_t>(chunk, data.size() - at);
      message.set_data(data.data() + at, n);
      ok = writer->Write(message);
      message.Clear();
      at += n;
      first = false;
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    Outcome o = Record("Upload", e, status, context);
    if (o.ok() && response.bytes_written() != data.size() &&
        mode_ == Mode::kSoak) {
      stats_->Problem(
          "upload_bytes_written",
          absl::StrCat(response.bytes_written(), " of ", data.size()));
    }
    return o;
  }

  Outcome Download(SessionState* s, uint64_t buffer, uint64_t offset,
                   uint64_t size, uint64_t stream, std::string* out,
                   const Expect& e) {
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    v1::DownloadRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_size(size);
    request.set_stream(stream);
    auto reader = conn_->rt->Download(&context, request);
    out->clear();
    v1::DownloadResponse chunk;
    while (reader->Read(&chunk)) out->append(chunk.data());
    grpc::Status status = reader->Finish();
    Outcome o = Record("Download", e, status, context);
    if (o.ok() && out->size() != size && mode_ == Mode::kSoak) {
      stats_->Problem("download_size",
                      absl::StrCat("got ", out->size(), " of ", size));
    }
    return o;
  }

  Outcome WriteValues(SessionState* s, uint64_t buffer, uint64_t offset,
                      DataType dt, const std::vector<double>& values,
                      uint64_t stream, const Expect& e) {
    v1::WriteValuesRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_dtype(dt);
    request.mutable_values()->Add(values.begin(), values.end());
    request.set_stream(stream);
    v1::WriteValuesResponse response;
    return Unary("WriteValues", SOAK_RT(WriteValues), request, &response, e);
  }

  Outcome ReadValues(SessionState* s, uint64_t buffer, uint64_t offset,
                     DataType dt, uint64_t count, uint64_t stream,
                     std::vector<double>* values, const Expect& e) {
    v1::ReadValuesRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_dtype(dt);
    request.set_count(count);
    request.set_stream(stream);
    v1::ReadValuesResponse response;
    Outcome o = Unary("ReadValues", SOAK_RT(ReadValues), request, &response, e);
    if (values != nullptr) {
      values->assign(response.values().begin(), response.values().end());
    }
    return o;
  }

  // ------------------------------------------------------------ executors

  uint64_t GetWorkspaceSize(SessionState* s,
                            v1::GetWorkspaceSizeRequest request,
                            uint64_t* workspace, const Expect& e) {
    request.set_session(s->token);
    v1::GetWorkspaceSizeResponse response;
    Outcome o = Unary("GetWorkspaceSize", SOAK_OPS(GetWorkspaceSize), request,
                      &response, e);
    if (!o.ok()) return 0;
    if (response.aclnn_status() != 0 && mode_ == Mode::kSoak) {
      stats_->Problem("gws_status", "OK call with a non-zero aclnn_status");
    }
    if (workspace != nullptr) *workspace = response.workspace_size();
    s->executors.insert(response.executor());
    Foreign().Publish('e', response.executor());
    return response.executor();
  }

  v1::ExecuteRequest LaunchRequest(SessionState* s, uint64_t executor,
                                   uint64_t stream, uint64_t ws_buffer = 0,
                                   uint64_t ws_offset = 0,
                                   uint64_t ws_size = 0) {
    v1::ExecuteRequest request;
    request.set_session(s->token);
    request.set_executor(executor);
    request.set_stream(stream);
    request.set_workspace_buffer(ws_buffer);
    request.set_workspace_offset(ws_offset);
    request.set_workspace_size(ws_size);
    return request;
  }

  void NoteLaunched(SessionState* s, uint64_t executor) {
    if (!s->repeatable.count(executor)) s->executors.erase(executor);
  }

  Outcome Execute(SessionState* s, const v1::ExecuteRequest& request,
                  const Expect& e) {
    v1::ExecuteResponse response;
    Outcome o = Unary("Execute", SOAK_OPS(Execute), request, &response, e);
    if (o.ok()) NoteLaunched(s, request.executor());
    return o;
  }

  // Sends every launch on one ExecuteStream call (reading replies as they
  // come) and checks each reply against its expectation.
  bool ExecuteStream(SessionState* s,
                     const std::vector<v1::ExecuteRequest>& launches,
                     const std::vector<Expect>& expects, const Expect& call) {
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    auto stream = conn_->ops->ExecuteStream(&context);
    size_t replies = 0;
    bool all_ok = true;
    auto take = [&](const v1::ExecuteResponse& r) {
      if (replies >= launches.size()) {
        stats_->Problem("execute_stream_reply", "more replies than launches");
        return;
      }
      Outcome o;
      o.code = static_cast<StatusCode>(r.code());
      o.aclnn = r.aclnn_status();
      o.message = r.message();
      if (r.executor() != launches[replies].executor() &&
          mode_ == Mode::kSoak) {
        stats_->Problem("execute_stream_order",
                        absl::StrCat("reply for executor ", r.executor(),
                                     ", launch ", replies, " was executor ",
                                     launches[replies].executor()));
      }
      stats_->Record("ExecuteStream launch", expects[replies], o);
      if (o.ok()) {
        NoteLaunched(s, launches[replies].executor());
      } else {
        all_ok = false;
      }
      ++replies;
    };
    v1::ExecuteResponse response;
    for (const v1::ExecuteRequest& launch : launches) {
      if (!stream->Write(launch)) break;
    }
    stream->WritesDone();
    while (stream->Read(&response)) take(response);
    grpc::Status status = stream->Finish();
    Outcome o = Record("ExecuteStream", call, status, context);
    if (o.ok() && replies != launches.size() && mode_ == Mode::kSoak) {
      stats_->Problem(
          "execute_stream_replies",
          absl::StrCat(replies, " replies to ", launches.size(), " launches"));
    }
    return o.ok() && all_ok && replies == launches.size();
  }

  Outcome SetRepeatable(SessionState* s, uint64_t executor, const Expect& e) {
    v1::SetExecutorRepeatableRequest request;
    request.set_session(s->token);
    request.set_executor(executor);
    v1::SetExecutorRepeatableResponse response;
    Outcome o = Unary("SetExecutorRepeatable", SOAK_OPS(SetExecutorRepeatable),
                      request, &response, e);
    if (o.ok()) s->repeatable.insert(executor);
    return o;
  }

  Outcome DestroyExecutor(SessionState* s, uint64_t executor, const Expect& e) {
    v1::DestroyExecutorRequest request;
    request.set_session(s->token);
    request.set_executor(executor);
    v1::DestroyExecutorResponse response;
    Outcome o = Unary("DestroyExecutor", SOAK_OPS(DestroyExecutor), request,
                      &response, e);
    if (o.ok()) {
      s->executors.erase(executor);
      s->repeatable.erase(executor);
    }
    return o;
  }

  // A tiny valid ThresholdBackward executor over `buffer` (>= 16 bytes).
  v1::GetWorkspaceSizeRequest TinyThreshold(uint64_t buffer) {
    v1::GetWorkspaceSizeRequest request;
    request.set_op("ThresholdBackward");
    request.mutable_params()->set_threshold(0.5);
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {4});
    }
    return request;
  }

  // A handle number of another session that this session does not own.
  uint64_t ForeignHandle(char kind) {
    for (int i = 0; i < 8; ++i) {
      uint64_t h = Foreign().Pick(kind, rng_);
      if (h != 0 && !main_.Owns(h)) return h;
    }
    return 0;
  }

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
  void TransferScenario() { Transfer(); }

  // ------------------------------------------------ invalid, on purpose
  // soak_invalid_scenarios.cc

  void InvalidScenario();
  void AnyRpcOn(SessionState* fake, const Expect& e);
  void BadShape();
  void BadDType();
  void BadParam();
  void SmallWorkspace();
  void StreamLimit();
  void MixedPipeline();

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
