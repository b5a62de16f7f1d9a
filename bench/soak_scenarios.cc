#include "bench/soak_scenarios.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/soak_reference.h"

namespace opserver::soak {
namespace {

std::string& TlsRoots() {
  static auto* const roots = new std::string();
  return *roots;
}

// Other tenants' session names, for the hostile tenant.
class SessionNames {
 public:
  void Publish(const std::string& tenant, const std::string& name) {
    absl::MutexLock lock(&mu_);
    if (names_.size() < 256) {
      names_.emplace_back(tenant, name);
    } else {
      names_[next_++ % names_.size()] = {tenant, name};
    }
  }
  std::string Pick(const std::string& tenant, std::mt19937_64& rng) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < 8 && !names_.empty(); ++i) {
      const auto& [owner, name] = names_[rng() % names_.size()];
      if (owner != tenant) return name;
    }
    return "";
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, std::string>> names_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

SessionNames* session_names = new SessionNames();

}  // namespace

void SetTlsRoots(std::string ca_pem) { TlsRoots() = std::move(ca_pem); }
bool UsingTls() { return !TlsRoots().empty(); }

void PublishSessionName(const std::string& tenant, const std::string& name) {
  session_names->Publish(tenant, name);
}
std::string PickSessionName(const std::string& tenant, std::mt19937_64& rng) {
  return session_names->Pick(tenant, rng);
}

std::shared_ptr<Conn> Connect(const std::string& address, bool own_connection,
                              const std::string& token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (UsingTls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = TlsRoots();
    credentials = grpc::SslCredentials(ssl);
    if (!token.empty()) {
      credentials = grpc::CompositeChannelCredentials(
          credentials, grpc::AccessTokenCredentials(token));
    }
  }
  auto conn = std::make_shared<Conn>();
  conn->channel = grpc::CreateCustomChannel(address, credentials, args);
  conn->rt = v1::Runtime::NewStub(conn->channel);
  conn->ops = v1::Operators::NewStub(conn->channel);
  conn->health = grpc::health::v1::Health::NewStub(conn->channel);
  return conn;
}

void SetDeadline(grpc::ClientContext* context, absl::Duration d) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

namespace {

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

ForeignHandles* foreign = new ForeignHandles();

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
  void Run(absl::Time end, const std::atomic<bool>* stop) {
    while (absl::Now() < end && !stop->load()) {
      if (mode_ == Mode::kShutdown) {
        if (!RunShutdownScenario()) break;  // The server is going away.
        continue;
      }
      RunSoakScenario();
    }
    EndClient();
  }

  // Shutdown mode: a transfer of 64 MiB that takes about 20 s (a slow
  // writer or a slow reader), so it is still running when the server's
  // shutdown grace ends.
  void SlowTransfer(bool upload) {
    if (!EnsureSession()) return;
    const uint64_t size = 64 << 20;
    const uint64_t b = Malloc(&main_, size);
    if (b == 0) return;
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    if (upload) {
      v1::UploadResponse response;
      auto writer = conn_->rt->Upload(&context, &response);
      v1::UploadRequest message;
      message.set_session(main_.token);
      message.set_buffer(b);
      message.set_size(size);
      const std::string chunk(1 << 20, 's');
      for (uint64_t sent = 0; sent < size; sent += chunk.size()) {
        message.set_data(chunk);
        if (!writer->Write(message)) break;
        message.Clear();
        absl::SleepFor(absl::Milliseconds(300));
      }
      writer->WritesDone();
      Record("Upload (slow writer)", V(), writer->Finish(), context);
    } else {
      v1::DownloadRequest request;
      request.set_session(main_.token);
      request.set_buffer(b);
      request.set_size(size);
      auto reader = conn_->rt->Download(&context, request);
      v1::DownloadResponse chunk;
      while (reader->Read(&chunk)) absl::SleepFor(absl::Milliseconds(1250));
      Record("Download (slow reader)", V(), reader->Finish(), context);
    }
  }

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
    foreign->Publish('b', response.buffer());
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
    foreign->Publish('s', response.stream());
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
    foreign->Publish('e', response.executor());
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
      uint64_t h = foreign->Pick(kind, rng_);
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

  void RunSoakScenario() {
    if (!EnsureSession()) return;
    static const std::vector<std::pair<int, void (Client::*)()>> kScenarios = {
        {30, &Client::ComputeScenario}, {10, &Client::TransferScenario},
        {8, &Client::InfoScenario},     {5, &Client::StreamScenario},
        {4, &Client::SessionScenario},  {32, &Client::InvalidScenario},
        {8, &Client::FaultScenario},    {3, &Client::EvaluateScenario}};
    int total = 0;
    for (const auto& [w, f] : kScenarios) total += w;
    int r = static_cast<int>(Rand(total));
    for (const auto& [w, f] : kScenarios) {
      if (r < w) {
        (this->*f)();
        break;
      }
      r -= w;
    }
    // Keep what the session holds bounded: free the oldest buffers.
    while (main_.open() && main_.buffers.size() > 24) {
      if (!Free(&main_, main_.buffers.begin()->first)) break;
    }
  }

  // Returns false once calls fail (the server is stopping).
  bool RunShutdownScenario() {
    if (!EnsureSession()) return false;
    switch (Rand(3)) {
      case 0:
        return Compute();
      case 1:
        return Transfer();
      default:
        return Pipeline();
    }
  }

  // How a client leaves at the end: closing its session, dropping its
  // Attach call (the server closes the session), or vanishing and leaving
  // it to the idle reaper.
  void EndClient() {
    if (!main_.open()) return;
    const uint64_t how = Rand(4);
    if (how < 2 || mode_ == Mode::kShutdown) {
      CloseSession(&main_);
    } else if (main_.attached) {
      DropAttach(&main_);
    } else {
      main_ = SessionState();  // Abandoned: reaped after --idle_timeout_s.
    }
  }

  void ComputeScenario() { Compute(); }
  void TransferScenario() { Transfer(); }

  // One operator end to end on device memory, checked against the host
  // reference.
  bool Compute() {
    SessionState* s = &main_;
    const int op = static_cast<int>(Rand(kNumOps));
    const DataType dt = PickOf(OpDTypes(op));
    const int dsize = DSize(dt);
    static const std::vector<int64_t> kSizes = {1,    3,     64,    1000,
                                                4096, 65536, 262144};
    const int64_t n = kSizes[Rand(Chance(0.9) ? 5 : kSizes.size())];
    enum Layout { kContig, kStrided, kBroadcast, kPacked, kInPlace };
    std::vector<Layout> layouts = {kContig, kStrided, kPacked};
    if (op == kSoftshrink || op == kLeaky) layouts.push_back(kBroadcast);
    if (op != kDropout) layouts.push_back(kInPlace);
    const Layout layout = Chance(0.4) ? kContig : PickOf(layouts);
    const bool strided_mask = op == kDropout && Chance(0.4);

    // Parameters.
    v1::OpParams params;
    params.set_threshold(IsIntegral(dt)
                             ? static_cast<double>(Rand(41)) - 20
                             : (static_cast<double>(Rand(33)) - 16) * 0.25);
    params.set_lambd(static_cast<double>(Rand(17)) * 0.25);
    static const std::vector<double> kSlopes = {0, 0.125, 0.25, 0.5, 1.5};
    params.mutable_negative_slope()->set_dtype(v1::FLOAT);
    params.mutable_negative_slope()->set_value(PickOf(kSlopes));
    static const std::vector<double> kScales = {0, 1, 1.25, 2, 4};
    params.set_scale(PickOf(kScales));

    // Inputs: exactly representable, never on a formula's boundary.
    auto value = [&]() -> double {
      switch (dt) {
        case v1::INT32:
          return static_cast<double>(Rand(2001)) - 1000;
        case v1::INT8:
          return static_cast<double>(Rand(201)) - 100;
        case v1::UINT8:
          return static_cast<double>(Rand(201));
        default:
          return (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
      }
    };
    int64_t rows = 1, cols = n;
    if (layout == kBroadcast) {
      for (int64_t r : {8, 4, 2, 1}) {
        if (n % r == 0) {
          rows = r;
          break;
        }
      }
      cols = n / rows;
    }
    const int64_t grad_store = layout == kStrided ? 2 * n + 1 : n;
    std::vector<double> grad(grad_store), second;
    for (double& v : grad) v = value();
    int64_t mask_bytes = 0;
    if (op == kDropout) {
      mask_bytes = n / 128 * 16 + (n % 128 != 0 ? 16 : 0);
      second.resize(strided_mask ? 2 * mask_bytes : mask_bytes);
      for (double& v : second) v = static_cast<double>(Rand(256));
    } else {
      second.resize(layout == kBroadcast ? cols : n);
      for (double& v : second) v = value();
    }
    std::vector<double> want(n), grad_at(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = layout == kStrided ? grad[1 + 2 * i] : grad[i];
      double x = 0;
      bool bit = false;
      if (op == kDropout) {
        const int64_t byte = i / 8;
        const int mask =
            static_cast<int>(second[strided_mask ? 2 * byte : byte]);
        bit = (mask >> (i % 8)) & 1;
      } else {
        x = layout == kBroadcast ? second[i % cols] : second[i];
      }
      want[i] = Reference(op, dt, params, g, x, bit);
      grad_at[i] = g;
    }
    const DataType second_dt = op == kDropout ? v1::UINT8 : dt;
    const std::string grad_bytes = Encode(dt, grad);
    const std::string second_bytes = Encode(second_dt, second);
    const uint64_t out_bytes = static_cast<uint64_t>(n) * dsize;

    // Device memory.
    uint64_t grad_buf = 0, second_buf = 0, out_buf = 0;
    uint64_t grad_off = 0, second_off = 0, out_off = 0;
    auto align = [](uint64_t x) { return (x + 63) / 64 * 64; };
    std::vector<uint64_t> mine;
    if (layout == kPacked) {
      second_off = align(grad_bytes.size()) + 64 * Rand(3);
      out_off = align(second_off + second_bytes.size());
      grad_buf = second_buf = out_buf = Malloc(s, out_off + out_bytes);
      if (grad_buf == 0) return false;
      mine = {grad_buf};
    } else {
      grad_buf = Malloc(s, grad_bytes.size());
      if (grad_buf == 0) return false;
      second_buf = Malloc(s, second_bytes.size());
      if (second_buf == 0) return false;
      mine = {grad_buf, second_buf};
      if (layout == kInPlace) {
        out_buf = grad_buf;
      } else {
        out_buf = Malloc(s, out_bytes);
        if (out_buf == 0) return false;
        mine.push_back(out_buf);
      }
    }
    const uint64_t stream = PickStream();
    // Inputs go up by Upload (any chunking) or WriteValues.
    auto put = [&](uint64_t buffer, uint64_t offset, DataType type,
                   const std::vector<double>& values,
                   const std::string& bytes) {
      if (Chance(0.5) && values.size() <= kMaxValues) {
        return WriteValues(s, buffer, offset, type, values, stream, V()).ok();
      }
      static const std::vector<uint64_t> kChunks = {100, 4096, 65536, 1 << 20};
      return Upload(s, buffer, offset, bytes, stream, PickOf(kChunks), V(),
                    Chance(0.3))
          .ok();
    };
    if (!put(grad_buf, grad_off, dt, grad, grad_bytes)) return false;
    if (!put(second_buf, second_off, second_dt, second, second_bytes)) {
      return false;
    }

    // Phase one.
    v1::GetWorkspaceSizeRequest request;
    request.set_op(Chance(0.2) ? absl::StrCat("aclnn", kOpNames[op])
                               : kOpNames[op]);
    *request.mutable_params() = params;
    if (op != kLeaky) request.mutable_params()->clear_negative_slope();
    auto& tensors = *request.mutable_tensors();
    std::vector<int64_t> shape = layout == kBroadcast
                                     ? std::vector<int64_t>{rows, cols}
                                     : std::vector<int64_t>{n};
    tensors["gradOutput"] = layout == kStrided
                                ? Desc(grad_buf, dt, {n}, {2}, 1, grad_off)
                                : Desc(grad_buf, dt, shape, {}, 0, grad_off);
    if (op == kDropout) {
      tensors["mask"] =
          strided_mask
              ? Desc(second_buf, v1::UINT8, {mask_bytes}, {2}, 0, second_off)
              : Desc(second_buf, v1::UINT8, {mask_bytes}, {}, 0, second_off);
    } else if (layout == kBroadcast) {
      tensors["self"] = Desc(second_buf, dt, {1, cols}, {}, 0, second_off);
    } else {
      tensors["self"] = Desc(second_buf, dt, shape, {}, 0, second_off);
    }
    tensors[OutName(op)] = Desc(out_buf, dt, shape, {}, 0, out_off);
    uint64_t workspace = 0;
    const uint64_t executor = GetWorkspaceSize(s, request, &workspace, V());
    if (executor == 0) return false;
    if (strided_mask && workspace != static_cast<uint64_t>(mask_bytes) &&
        mode_ == Mode::kSoak) {
      stats_->Problem("workspace_size",
                      absl::StrCat("strided mask of ", mask_bytes,
                                   " bytes, workspace ", workspace));
    }
    // Freed handles stay alive in the executor: results must not change.
    if (layout != kPacked && layout != kInPlace && Chance(0.15)) {
      if (!Free(s, grad_buf) || !Free(s, second_buf)) return false;
      mine = {out_buf};
    }
    uint64_t ws_buf = 0, ws_off = 0;
    if (workspace > 0) {
      ws_off = 64 * Rand(4);
      ws_buf = Malloc(s, ws_off + workspace + Rand(100));
      if (ws_buf == 0) return false;
      mine.push_back(ws_buf);
    }

    // Phase two: once, or a repeatable executor several times (not in
    // place: a second launch would compute on the first one's output).
    const bool repeat = layout != kInPlace && Chance(0.25);
    if (repeat && !SetRepeatable(s, executor, V()).ok()) return false;
    const int launches = repeat ? 1 + static_cast<int>(Rand(3)) : 1;
    std::vector<v1::ExecuteRequest> requests;
    for (int i = 0; i < launches; ++i) {
      requests.push_back(
          LaunchRequest(s, executor, stream, ws_buf, ws_off, workspace));
    }
    if (Chance(0.3)) {
      std::vector<Expect> expects(requests.size(), V());
      if (!ExecuteStream(s, requests, expects, V())) return false;
    } else {
      for (const auto& r : requests) {
        if (!Execute(s, r, V()).ok()) return false;
      }
    }
    if (repeat && !DestroyExecutor(s, executor, V()).ok()) return false;

    // Read back on the same stream: ordered after the launch with or
    // without a synchronize first.
    if (Chance(0.5) && !Sync(s, stream)) return false;
    std::vector<double> got;
    if (Chance(0.5) && static_cast<uint64_t>(n) <= kMaxValues) {
      if (!ReadValues(s, out_buf, out_off, dt, n, stream, &got, V()).ok()) {
        return false;
      }
    } else {
      std::string bytes;
      if (!Download(s, out_buf, out_off, out_bytes, stream, &bytes, V()).ok() ||
          bytes.size() != out_bytes) {
        return false;
      }
      got.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        got[i] = DecodeValue(dt, bytes.data() + i * dsize);
      }
    }
    if (got.size() != static_cast<size_t>(n)) {
      stats_->Problem("result_size", absl::StrCat(got.size(), " of ", n));
      return false;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!CloseEnough(dt, got[i], want[i], grad_at[i])) {
        stats_->Problem(
            "wrong_result",
            absl::StrCat(kOpNames[op], " ", v1::DataType_Name(dt), " n=", n,
                         " layout=", layout,
                         strided_mask ? " strided mask" : "", ": element ", i,
                         " is ", got[i], ", want ", want[i]));
        return false;
      }
    }
    if (!Sync(s, stream)) return false;
    // Free what this used (sometimes keep it: the session close frees it).
    if (Chance(0.85)) {
      for (uint64_t b : mine) {
        if (!Free(s, b)) return false;
      }
    }
    return true;
  }

  // Bytes up and down, any sizes, chunking and offsets; compared.
  bool Transfer() {
    SessionState* s = &main_;
    static const std::vector<uint64_t> kSizes = {
        0,       1, 4095, 4096, 65537, (1 << 20) + 3, 4 << 20, (9 << 20) + 7,
        16 << 20};
    const uint64_t size = kSizes[Rand(Chance(0.8) ? 6 : kSizes.size())];
    std::string data(size, '\0');
    for (uint64_t i = 0; i < size; i += 8) {
      const uint64_t r = rng_();
      std::memcpy(data.data() + i, &r, std::min<uint64_t>(8, size - i));
    }
    const uint64_t buffer = Malloc(s, size);
    if (buffer == 0) return false;
    const uint64_t stream = PickStream();
    static const std::vector<uint64_t> kChunks = {1000, 65536, 1 << 20,
                                                  4 << 20};
    if (Chance(0.3) && size > 1) {
      // Two uploads of adjacent ranges.
      const uint64_t split = 1 + Rand(size - 1);
      if (!Upload(s, buffer, 0, data.substr(0, split), stream, PickOf(kChunks),
                  V())
               .ok() ||
          !Upload(s, buffer, split, data.substr(split), stream, PickOf(kChunks),
                  V(), Chance(0.5))
               .ok()) {
        return false;
      }
    } else if (!Upload(s, buffer, 0, data, stream, PickOf(kChunks), V(),
                       Chance(0.3))
                    .ok()) {
      return false;
    }
    uint64_t from = 0, len = size;
    if (Chance(0.4) && size > 0) {
      from = Rand(size);
      len = Rand(size - from + 1);
    }
    std::string back;
    if (!Download(s, buffer, from, len, stream, &back, V()).ok()) return false;
    if (back != data.substr(from, len)) {
      stats_->Problem("transfer_mismatch",
                      absl::StrCat("download of [", from, ", +", len,
                                   ") differs from what was uploaded"));
      return false;
    }
    return Free(s, buffer);
  }

  // ExecuteStream with many launches of one repeatable executor.
  bool Pipeline() {
    SessionState* s = &main_;
    const int64_t n = 1 << 16;
    const uint64_t buffer = Malloc(s, n * 4);
    if (buffer == 0) return false;
    v1::GetWorkspaceSizeRequest request;
    request.set_op("HardswishBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
    if (executor == 0) return false;
    if (!SetRepeatable(s, executor, V()).ok()) return false;
    const uint64_t stream = PickStream();
    std::vector<v1::ExecuteRequest> launches(
        16 + Rand(48), LaunchRequest(s, executor, stream));
    std::vector<Expect> expects(launches.size(), V());
    if (!ExecuteStream(s, launches, expects, V())) return false;
    if (!Sync(s, stream)) return false;
    if (!DestroyExecutor(s, executor, V()).ok()) return false;
    return Free(s, buffer);
  }

  // Discovery, stats, health.
  void InfoScenario() {
    switch (Rand(7)) {
      case 0: {
        v1::GetDeviceInfoResponse info;
        if (Unary("GetDeviceInfo", SOAK_RT(GetDeviceInfo),
                  v1::GetDeviceInfoRequest(), &info, V())
                .ok() &&
            (info.api_version() != "opserver.v1" || info.kind() != "cpu")) {
          stats_->Problem("device_info", info.ShortDebugString());
        }
        break;
      }
      case 1: {
        v1::ListOperatorsResponse ops;
        if (Unary("ListOperators", SOAK_OPS(ListOperators),
                  v1::ListOperatorsRequest(), &ops, V())
                .ok() &&
            ops.operators_size() != kNumOps) {
          stats_->Problem("list_operators",
                          absl::StrCat(ops.operators_size(), " operators"));
        }
        break;
      }
      case 2: {
        grpc::health::v1::HealthCheckRequest request;
        static const std::vector<std::string> kServices = {
            "", "opserver.v1.Runtime", "opserver.v1.Operators"};
        request.set_service(PickOf(kServices));
        grpc::health::v1::HealthCheckResponse response;
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        if (Record("Health.Check", V(),
                   conn_->health->Check(&context, request, &response), context)
                .ok() &&
            response.status() !=
                grpc::health::v1::HealthCheckResponse::SERVING) {
          stats_->Problem("health", response.ShortDebugString());
        }
        break;
      }
      case 3: {
        v1::ServerStats stats;
        Unary("GetServerStats", SOAK_RT(GetServerStats),
              v1::GetServerStatsRequest(), &stats, V());
        break;
      }
      case 4: {  // Watch: the current status, then the client leaves.
        grpc::health::v1::HealthCheckRequest request;
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        auto reader = conn_->health->Watch(&context, request);
        grpc::health::v1::HealthCheckResponse response;
        if (!reader->Read(&response) ||
            response.status() !=
                grpc::health::v1::HealthCheckResponse::SERVING) {
          stats_->Problem("health_watch", response.ShortDebugString());
        }
        context.TryCancel();
        while (reader->Read(&response)) {
        }
        Record("Health.Watch", Invalid("watch_end", Bit(StatusCode::CANCELLED)),
               reader->Finish(), context);
        break;
      }
      default:
        CheckSessionStats();
        break;
    }
  }

  // What the server says the session holds must be what the client holds.
  void CheckSessionStats() {
    v1::GetSessionStatsRequest request;
    request.set_session(main_.token);
    v1::SessionStats stats;
    if (!Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats,
               V())
             .ok()) {
      return;
    }
    uint64_t bytes = 0;
    for (const auto& [h, size] : main_.buffers) bytes += size;
    if (stats.buffers() != main_.buffers.size() ||
        stats.buffer_bytes() != bytes ||
        stats.streams() != main_.streams.size() ||
        stats.executors() != main_.executors.size()) {
      stats_->Problem(
          "session_stats",
          absl::StrCat("server: ", stats.ShortDebugString(), "; client holds ",
                       main_.buffers.size(), " buffers of ", bytes, " bytes, ",
                       main_.streams.size(), " streams, ",
                       main_.executors.size(), " executors"));
    }
  }

  // Streams: created, loaded, synchronized, destroyed with work queued.
  void StreamScenario() {
    SessionState* s = &main_;
    switch (Rand(3)) {
      case 0: {  // Destroy a stream with work still queued: dropped.
        const uint64_t stream = CreateStream(s, V());
        if (stream == 0) return;
        const int64_t n = 1 << 18;
        const uint64_t buffer = Malloc(s, n * 4);
        if (buffer == 0) return;
        v1::GetWorkspaceSizeRequest request;
        request.set_op("LeakyReluBackward");
        request.mutable_params()->mutable_negative_slope()->set_value(0.25);
        for (const char* name : {"gradOutput", "self", "out"}) {
          (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {n});
        }
        const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
        if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
        for (int i = 0; i < 8; ++i) {
          if (!Execute(s, LaunchRequest(s, executor, stream), V()).ok()) return;
        }
        if (!DestroyStream(s, stream, V()).ok()) return;
        Sync(s, stream,
             Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
        DestroyStream(s, stream,
                      Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
        Execute(s, LaunchRequest(s, executor, stream),
                Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
        DestroyExecutor(s, executor, V());
        Free(s, buffer);
        break;
      }
      case 1: {  // Synchronize every stream.
        Sync(s, 0);
        for (uint64_t stream : std::set<uint64_t>(s->streams)) Sync(s, stream);
        break;
      }
      default: {  // Destroy one of the session's streams.
        if (s->streams.empty()) {
          CreateStream(s, V());
          return;
        }
        DestroyStream(s, *s->streams.begin(), V());
        break;
      }
    }
  }

  // Close and reopen the main session, sometimes attached.
  void SessionScenario() {
    switch (Rand(3)) {
      case 0:
        CloseSession(&main_);
        break;
      case 1:
        if (main_.attached) {
          DropAttach(&main_);
        } else {
          CloseSession(&main_);
        }
        break;
      default: {
        // A second session next to the main one, used and closed.
        SessionState other;
        if (!OpenSession(&other, Chance(0.5))) return;
        uint64_t b = Malloc(&other, 1 + Rand(1 << 16));
        if (b != 0) {
          WriteValues(&other, b, 0, v1::UINT8, {1, 2, 3}, 0, V());
        }
        CloseSession(&other);
        break;
      }
    }
  }

  void EvaluateScenario() {
    const int op = static_cast<int>(Rand(kNumOps));
    const DataType dt = v1::FLOAT;
    const int64_t n = 1 + Rand(64);
    v1::EvaluateRequest request;
    request.set_op(kOpNames[op]);
    v1::OpParams* params = request.mutable_params();
    params->set_threshold(0.5);
    params->set_lambd(1.0);
    params->set_scale(2);
    if (op == kLeaky) {
      params->mutable_negative_slope()->set_dtype(v1::FLOAT);
      params->mutable_negative_slope()->set_value(0.125);
    }
    std::vector<double> g(n), x(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
      x[i] = (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
    }
    v1::ValueTensor grad;
    grad.set_dtype(dt);
    grad.add_shape(n);
    grad.mutable_values()->Add(g.begin(), g.end());
    int64_t mask_bytes = n / 128 * 16 + (n % 128 != 0 ? 16 : 0);
    std::vector<double> mask(mask_bytes);
    v1::ValueTensor second;
    if (op == kDropout) {
      for (double& m : mask) m = static_cast<double>(Rand(256));
      second.set_dtype(v1::UINT8);
      second.add_shape(mask_bytes);
      second.mutable_values()->Add(mask.begin(), mask.end());
    } else {
      second.set_dtype(dt);
      second.add_shape(n);
      second.mutable_values()->Add(x.begin(), x.end());
    }
    request.mutable_output()->set_dtype(dt);
    request.mutable_output()->add_shape(n);
    const bool invalid = Chance(0.3);
    Expect e = V();
    if (invalid) {
      e = Invalid("bad_param", Bit(StatusCode::INVALID_ARGUMENT));
      switch (Rand(3)) {
        case 0:
          (*request.mutable_inputs())["bogus"] = grad;
          break;
        case 1:
          grad.add_values(1);  // n + 1 values for a shape of n.
          break;
        default:
          request.set_op("SoftplusBackward");
          break;
      }
    }
    (*request.mutable_inputs())["gradOutput"] = grad;
    (*request.mutable_inputs())[SecondName(op)] = second;
    e.evaluate = true;
    v1::EvaluateResponse response;
    if (!Unary("Evaluate", SOAK_OPS(Evaluate), request, &response, e).ok() ||
        invalid) {
      return;
    }
    if (response.output().values_size() != n) {
      stats_->Problem("evaluate_size",
                      absl::StrCat(response.output().values_size(), " of ", n));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const bool bit =
          op == kDropout && ((static_cast<int>(mask[i / 8]) >> (i % 8)) & 1);
      const double want = Reference(op, dt, *params, g[i], x[i], bit);
      if (!CloseEnough(dt, response.output().values(i), want, g[i])) {
        stats_->Problem(
            "evaluate_result",
            absl::StrCat(kOpNames[op], " element ", i, " is ",
                         response.output().values(i), ", want ", want));
        return;
      }
    }
  }

  // ------------------------------------------------ invalid, on purpose

  void InvalidScenario() {
    const uint32_t kNotFound = Bit(StatusCode::NOT_FOUND);
    const uint32_t kInvalid = Bit(StatusCode::INVALID_ARGUMENT);
    const uint32_t kExhausted = Bit(StatusCode::RESOURCE_EXHAUSTED);
    const uint32_t kPrecondition = Bit(StatusCode::FAILED_PRECONDITION);
    SessionState* s = &main_;
    switch (Rand(20)) {
      case 0:  // A made-up or empty session, on any RPC.
      case 1: {
        const bool empty = Rand(3) == 0;
        SessionState fake;
        fake.token = empty ? "" : RandomToken();
        const Expect e = empty ? Invalid("empty_session", kInvalid | kNotFound)
                               : Invalid("bad_session", kNotFound);
        AnyRpcOn(&fake, e);
        break;
      }
      case 2: {  // Another session's buffer.
        // Made first: a new handle could otherwise take the foreign number.
        const uint64_t mine = AnyBuffer();
        const uint64_t h = ForeignHandle('b');
        if (h == 0 || mine == 0) return;
        const Expect e = Invalid("foreign_handle", kNotFound);
        std::string bytes;
        switch (Rand(5)) {
          case 0:
            Free(s, h, e);
            break;
          case 1:
            Download(s, h, 0, 1, 0, &bytes, e);
            break;
          case 2:
            ReadValues(s, h, 0, v1::UINT8, 1, 0, nullptr, e);
            break;
          case 3:
            Upload(s, h, 0, "x", 0, 1, e);
            break;
          default: {
            v1::GetWorkspaceSizeRequest request = TinyThreshold(mine);
            (*request.mutable_tensors())["self"].set_buffer(h);
            GetWorkspaceSize(s, request, nullptr, e);
            break;
          }
        }
        break;
      }
      case 3: {  // Another session's executor.
        const uint64_t h = ForeignHandle('e');
        if (h == 0) return;
        switch (Rand(3)) {
          case 0:
            Execute(s, LaunchRequest(s, h, 0),
                    Invalid("foreign_handle", kNotFound | kPrecondition));
            break;
          case 1:
            SetRepeatable(s, h, Invalid("foreign_handle", kNotFound));
            break;
          default:
            DestroyExecutor(s, h, Invalid("foreign_handle", kNotFound));
            break;
        }
        break;
      }
      case 4: {  // Another session's stream.
        const Expect e = Invalid("foreign_handle", kNotFound);
        switch (Rand(3)) {
          case 0:
          case 1: {
            const uint64_t h = ForeignHandle('s');
            if (h == 0) return;
            if (Chance(0.5)) {
              Sync(s, h, e);
            } else {
              DestroyStream(s, h, e);
            }
            break;
          }
          default: {
            // A valid executor on a stream that is not ours: refused before
            // the executor is consumed, so it still launches afterwards.
            uint64_t mine = AnyBuffer();
            if (mine == 0) return;
            uint64_t executor =
                GetWorkspaceSize(s, TinyThreshold(mine), nullptr, V());
            const uint64_t h = ForeignHandle('s');
            if (executor == 0 || h == 0) return;
            Execute(s, LaunchRequest(s, executor, h), e);
            Execute(s, LaunchRequest(s, executor, 0), V());
            break;
          }
        }
        break;
      }
      case 5: {  // Handles nobody made.
        const uint64_t h = (1ull << 60) + Rand(1000);
        const Expect e = Invalid("unknown_handle", kNotFound);
        switch (Rand(4)) {
          case 0:
            Free(s, h, e);
            break;
          case 1:
            Sync(s, h, e);
            break;
          case 2:
            Execute(s, LaunchRequest(s, h, 0), e);
            break;
          default:
            DestroyExecutor(s, h, e);
            break;
        }
        break;
      }
      case 6: {  // A freed buffer.
        const uint64_t b = Malloc(s, 64);
        if (b == 0 || !Free(s, b)) return;
        const Expect e = Invalid("freed_buffer", kNotFound);
        if (Chance(0.5)) {
          Free(s, b, e);
        } else {
          WriteValues(s, b, 0, v1::FLOAT, {1}, 0, e);
        }
        break;
      }
      case 7: {  // A consumed executor.
        uint64_t mine = AnyBuffer();
        if (mine == 0) return;
        uint64_t executor =
            GetWorkspaceSize(s, TinyThreshold(mine), nullptr, V());
        if (executor == 0 ||
            !Execute(s, LaunchRequest(s, executor, 0), V()).ok()) {
          return;
        }
        switch (Rand(3)) {
          case 0:
            Execute(s, LaunchRequest(s, executor, 0),
                    Invalid("consumed_executor", kPrecondition));
            break;
          case 1:
            DestroyExecutor(s, executor,
                            Invalid("consumed_executor", kNotFound));
            break;
          default:
            SetRepeatable(s, executor, Invalid("consumed_executor", kNotFound));
            break;
        }
        break;
      }
      case 8:
      case 9:
        BadShape();
        break;
      case 10:
        BadDType();
        break;
      case 11:
        BadParam();
        break;
      case 12: {  // Past a limit.
        const Expect e = Invalid("oversized", kExhausted);
        switch (Rand(8)) {
          case 0:
            Malloc(s, 1ull << 40, e);
            break;
          case 1:
            Malloc(s, UINT64_MAX, e);
            break;
          case 2:
          case 3:
          case 4: {
            uint64_t b = AnyBuffer();
            if (b != 0) {
              ReadValues(s, b, 0, v1::UINT8, kMaxValues + 1, 0, nullptr, e);
            }
            break;
          }
          case 5: {  // 8 MiB of values: rarely.
            uint64_t b = AnyBuffer();
            if (b != 0) {
              WriteValues(s, b, 0, v1::UINT8,
                          std::vector<double>(kMaxValues + 1, 0), 0, e);
            }
            break;
          }
          default: {
            v1::EvaluateRequest request;
            request.set_op("HardswishBackward");
            for (const char* name : {"gradOutput", "self"}) {
              v1::ValueTensor& t = (*request.mutable_inputs())[name];
              t.set_dtype(v1::FLOAT);
              t.add_shape(kMaxValues + 1);
            }
            request.mutable_output()->set_dtype(v1::FLOAT);
            request.mutable_output()->add_shape(kMaxValues + 1);
            v1::EvaluateResponse response;
            Expect ee = e;
            ee.evaluate = true;
            Unary("Evaluate", SOAK_OPS(Evaluate), request, &response, ee);
            break;
          }
        }
        break;
      }
      case 13: {  // Ranges outside the buffer.
        const uint64_t b = Malloc(s, 4096);
        if (b == 0) return;
        const Expect e = Invalid("bad_range", kInvalid);
        std::string bytes;
        switch (Rand(5)) {
          case 0:
            Download(s, b, 4095, 2, 0, &bytes, e);
            break;
          case 1:
            Download(s, b, UINT64_MAX, 2, 0, &bytes, e);
            break;
          case 2:
            ReadValues(s, b, 4092, v1::DOUBLE, 1, 0, nullptr, e);
            break;
          case 3:
            WriteValues(s, b, 4096, v1::FLOAT, {1}, 0, e);
            break;
          default:
            Upload(s, b, 4000, std::string(97, 'x'), 0, 64, e);
            break;
        }
        Free(s, b);
        break;
      }
      case 14: {  // Uploads that break their own header.
        const uint64_t b = Malloc(s, 4096);
        if (b == 0) return;
        const Expect e = Invalid("bad_upload", kInvalid);
        switch (Rand(3)) {
          case 0:  // More data than announced.
            Upload(s, b, 0, std::string(200, 'x'), 0, 64, e, false, 100);
            break;
          case 1:  // Less.
            Upload(s, b, 0, std::string(50, 'x'), 0, 16, e, Chance(0.5), 100);
            break;
          default: {  // Nothing at all.
            grpc::ClientContext context;
            SetDeadline(&context, kCallDeadline);
            v1::UploadResponse response;
            auto writer = conn_->rt->Upload(&context, &response);
            writer->WritesDone();
            Record("Upload", e, writer->Finish(), context);
            break;
          }
        }
        Free(s, b);
        break;
      }
      case 15: {  // Values that do not fit their dtype.
        const uint64_t b = AnyBuffer();
        if (b == 0) return;
        const Expect e = Invalid("bad_value", kInvalid);
        switch (Rand(5)) {
          case 0:
            WriteValues(s, b, 0, v1::INT32, {1.5}, 0, e);
            break;
          case 1:
            WriteValues(s, b, 0, v1::INT32, {std::nan("")}, 0, e);
            break;
          case 2:
            WriteValues(s, b, 0, v1::INT8, {300}, 0, e);
            break;
          case 3:
            WriteValues(s, b, 0, v1::UINT8, {-1}, 0, e);
            break;
          default:
            WriteValues(s, b, 0, v1::BOOL, {2}, 0, e);
            break;
        }
        break;
      }
      case 16:
        SmallWorkspace();
        break;
      case 17: {  // Stream 0, destroyed and too many streams.
        switch (Rand(3)) {
          case 0:
            DestroyStream(s, 0, Invalid("stream0", kInvalid));
            break;
          case 1: {
            const uint64_t stream = CreateStream(s, V());
            if (stream == 0 || !DestroyStream(s, stream, V()).ok()) return;
            Sync(s, stream, Invalid("destroyed_stream", kNotFound));
            break;
          }
          default:
            StreamLimit();
            break;
        }
        break;
      }
      case 18: {  // Session-level misuse.
        switch (Rand(3)) {
          case 0: {
            v1::CreateSessionRequest request;
            request.set_client_name(std::string(257, 'n'));
            v1::CreateSessionResponse response;
            Unary("CreateSession", SOAK_RT(CreateSession), request, &response,
                  Invalid("long_name", kInvalid));
            break;
          }
          case 1: {
            SessionState other;
            if (!OpenSession(&other, false)) return;
            const std::string token = other.token;
            CloseSession(&other);
            other.token = token;
            const Expect e = Invalid("closed_session", kNotFound);
            if (Chance(0.5)) {
              Malloc(&other, 16, e);
            } else {
              v1::CloseSessionRequest request;
              request.set_session(token);
              v1::CloseSessionResponse response;
              Unary("CloseSession", SOAK_RT(CloseSession), request, &response,
                    e);
            }
            break;
          }
          default: {
            grpc::health::v1::HealthCheckRequest request;
            request.set_service("opserver.v0.Nonexistent");
            grpc::health::v1::HealthCheckResponse response;
            grpc::ClientContext context;
            SetDeadline(&context, kCallDeadline);
            Record("Health.Check", Invalid("unknown_health_service", kNotFound),
                   conn_->health->Check(&context, request, &response), context);
            break;
          }
        }
        break;
      }
      default:
        MixedPipeline();
        break;
    }
  }

  // One RPC, chosen at random, naming `fake` (a made-up or empty session).
  void AnyRpcOn(SessionState* fake, const Expect& e) {
    std::string bytes;
    switch (Rand(16)) {
      case 0:
        Malloc(fake, 16, e);
        break;
      case 1:
        Free(fake, 1, e);
        break;
      case 2:
        CreateStream(fake, e);
        break;
      case 3:
        DestroyStream(fake, 1, e);
        break;
      case 4:
        Sync(fake, 0, e);
        break;
      case 5:
        Upload(fake, 1, 0, "abcd", 0, 4, e);
        break;
      case 6:
        Download(fake, 1, 0, 4, 0, &bytes, e);
        break;
      case 7:
        WriteValues(fake, 1, 0, v1::FLOAT, {1}, 0, e);
        break;
      case 8:
        ReadValues(fake, 1, 0, v1::FLOAT, 1, 0, nullptr, e);
        break;
      case 9:
        GetWorkspaceSize(fake, TinyThreshold(1), nullptr, e);
        break;
      case 10:
        Execute(fake, LaunchRequest(fake, 1, 0), e);
        break;
      case 11:
        SetRepeatable(fake, 1, e);
        break;
      case 12:
        DestroyExecutor(fake, 1, e);
        break;
      case 13: {
        v1::GetSessionStatsRequest request;
        request.set_session(fake->token);
        v1::SessionStats stats;
        Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats, e);
        break;
      }
      case 14: {
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        v1::AttachRequest request;
        request.set_session(fake->token);
        auto reader = conn_->rt->Attach(&context, request);
        v1::AttachEvent event;
        bool attached = false;
        while (reader->Read(&event)) attached = true;
        Outcome o = Record("Attach", e, reader->Finish(), context);
        if (attached && mode_ == Mode::kSoak) {
          stats_->Problem("attach_fake", "an unknown session was attached");
        }
        (void)o;
        break;
      }
      default: {
        v1::CloseSessionRequest request;
        request.set_session(fake->token);
        v1::CloseSessionResponse response;
        Unary("CloseSession", SOAK_RT(CloseSession), request, &response, e);
        break;
      }
    }
  }

  void BadShape() {
    const Expect e = Invalid("bad_shape", Bit(StatusCode::INVALID_ARGUMENT));
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    const int64_t elems = static_cast<int64_t>(main_.buffers[b] / 4);
    v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
    auto& t = *request.mutable_tensors();
    switch (Rand(9)) {
      case 0:  // Past the end of the buffer.
        t["self"] = Desc(b, v1::FLOAT, {elems + 1});
        t["gradOutput"] = Desc(b, v1::FLOAT, {elems + 1});
        t["out"] = Desc(b, v1::FLOAT, {elems + 1});
        break;
      case 1:  // 9 dims.
        t["self"] = Desc(b, v1::FLOAT, {1, 1, 1, 1, 1, 1, 1, 1, 1});
        break;
      case 2:  // A negative dim.
        t["gradOutput"] = Desc(b, v1::FLOAT, {-4});
        break;
      case 3:  // Threshold does not broadcast.
        t["self"] = Desc(b, v1::FLOAT, {2});
        break;
      case 4:  // Wrong out shape.
        t["out"] = Desc(b, v1::FLOAT, {2, 2});
        break;
      case 5:  // An output that overlaps itself: 2^40 elements in 4 bytes.
        for (const char* name : {"gradOutput", "self", "out"}) {
          t[name] = Desc(b, v1::FLOAT, {1ll << 40}, {0});
        }
        break;
      case 6:  // Starts past the buffer.
        t["self"] = Desc(b, v1::FLOAT, {4}, {}, 0, main_.buffers[b] + 4096);
        break;
      case 7:  // Strides that overflow.
        t["gradOutput"] = Desc(b, v1::FLOAT, {4}, {1ll << 62});
        break;
      default: {  // A mask of the wrong size.
        request.set_op("DropoutBackward");
        request.mutable_params()->set_scale(2);
        t.erase("self");
        t["mask"] = Desc(b, v1::UINT8, {3});
        break;
      }
    }
    const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
    if (executor != 0) DestroyExecutor(&main_, executor, V());
  }

  void BadDType() {
    const Expect e = Invalid("bad_dtype", Bit(StatusCode::INVALID_ARGUMENT));
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
    auto& t = *request.mutable_tensors();
    switch (Rand(6)) {
      case 0:  // Not an aclDataType.
        t["self"].set_dtype(static_cast<DataType>(5));
        break;
      case 1:
        t["out"].set_dtype(static_cast<DataType>(99));
        break;
      case 2:  // Softshrink takes no INT32.
        request.set_op("SoftshrinkBackward");
        t.erase("out");
        for (const char* name : {"gradOutput", "self", "gradInput"}) {
          t[name] = Desc(b, v1::INT32, {4});
        }
        break;
      case 3:  // A FLOAT mask.
        request.set_op("DropoutBackward");
        request.mutable_params()->set_scale(2);
        t.erase("self");
        t["mask"] = Desc(b, v1::FLOAT, {4});
        break;
      case 4:  // Threshold on DOUBLE.
        for (const char* name : {"gradOutput", "self", "out"}) {
          t[name] = Desc(b, v1::DOUBLE, {2});
        }
        break;
      default: {  // WriteValues/ReadValues of dtype 5.
        if (Chance(0.5)) {
          WriteValues(&main_, b, 0, static_cast<DataType>(5), {1}, 0, e);
        } else {
          ReadValues(&main_, b, 0, static_cast<DataType>(5), 1, 0, nullptr, e);
        }
        return;
      }
    }
    const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
    if (executor != 0) DestroyExecutor(&main_, executor, V());
  }

  void BadParam() {
    const Expect e = Invalid("bad_param", Bit(StatusCode::INVALID_ARGUMENT));
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
    auto& t = *request.mutable_tensors();
    auto leaky = [&] {
      request.set_op("LeakyReluBackward");
      request.mutable_params()->mutable_negative_slope()->set_dtype(v1::FLOAT);
      request.mutable_params()->mutable_negative_slope()->set_value(0.5);
    };
    switch (Rand(9)) {
      case 0:
        request.set_op("SoftplusBackward");
        break;
      case 1:
        t["bogus"] = t["self"];
        break;
      case 2:
        request.set_op("SoftshrinkBackward");
        request.mutable_params()->set_lambd(-1);
        t["gradInput"] = t["out"];
        t.erase("out");
        break;
      case 3:
      case 4:
        request.set_op("DropoutBackward");
        request.mutable_params()->set_scale(Rand(2) ? 0.5 : std::nan(""));
        t["mask"] = Desc(b, v1::UINT8, {16});
        t.erase("self");
        break;
      case 5:  // negativeSlope missing.
        request.set_op("LeakyReluBackward");
        break;
      case 6:  // An integer slope that is not an integer.
        leaky();
        request.mutable_params()->mutable_negative_slope()->set_dtype(
            v1::INT32);
        break;
      case 7:  // A negative slope with selfIsResult.
        leaky();
        request.mutable_params()->mutable_negative_slope()->set_value(-0.5);
        request.mutable_params()->set_self_is_result(true);
        break;
      default:  // A tensor missing.
        t.erase("out");
        break;
    }
    const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
    if (executor != 0) DestroyExecutor(&main_, executor, V());
  }

  // A workspace too small or missing: refused without consuming the
  // executor, which then runs with the right one.
  void SmallWorkspace() {
    SessionState* s = &main_;
    const int64_t n = 256;
    const uint64_t b = Malloc(s, 4 * n * 2 + 64);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request;
    request.set_op("DropoutBackward");
    request.mutable_params()->set_scale(2);
    auto& t = *request.mutable_tensors();
    t["gradOutput"] = Desc(b, v1::FLOAT, {n});
    t["mask"] = Desc(b, v1::UINT8, {32}, {2}, 0, 4 * n);
    t["out"] = Desc(b, v1::FLOAT, {n}, {}, 0, 4 * n + 64);
    uint64_t workspace = 0;
    const uint64_t executor = GetWorkspaceSize(s, request, &workspace, V());
    if (executor == 0) return;
    if (workspace == 0) {
      stats_->Problem("workspace_size", "a strided mask needs a workspace");
      return;
    }
    const uint64_t ws = Malloc(s, workspace);
    if (ws == 0) return;
    switch (Rand(3)) {
      case 0:
        Execute(s, LaunchRequest(s, executor, 0, ws, 0, workspace - 1),
                Invalid("small_workspace", Bit(StatusCode::INVALID_ARGUMENT)));
        break;
      case 1:
        Execute(s, LaunchRequest(s, executor, 0, 1ull << 60, 0, workspace),
                Invalid("small_workspace", Bit(StatusCode::NOT_FOUND)));
        break;
      default:
        Execute(s, LaunchRequest(s, executor, 0, ws, 8, workspace),
                Invalid("bad_range", Bit(StatusCode::INVALID_ARGUMENT)));
        break;
    }
    Execute(s, LaunchRequest(s, executor, 0, ws, 0, workspace), V());
    Sync(s, 0);
    Free(s, ws);
    Free(s, b);
  }

  // CreateStream until the limit (16 per session) refuses one.
  void StreamLimit() {
    SessionState* s = &main_;
    std::vector<uint64_t> made;
    bool refused = false;
    for (int i = 0; i < 20 && !refused; ++i) {
      uint64_t stream = CreateStream(
          s, Invalid("stream_limit", Bit(StatusCode::OK) |
                                         Bit(StatusCode::RESOURCE_EXHAUSTED)));
      if (stream == 0) {
        refused = true;
      } else {
        made.push_back(stream);
      }
    }
    if (!refused) {
      stats_->Problem("stream_limit", "20 streams created in one session");
    }
    for (uint64_t stream : made) DestroyStream(s, stream, V());
  }

  // One ExecuteStream call mixing valid launches with bad ones: each reply
  // carries its own outcome and the call goes on.
  void MixedPipeline() {
    SessionState* s = &main_;
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    std::vector<v1::ExecuteRequest> launches;
    std::vector<Expect> expects;
    for (int i = 0; i < 6; ++i) {
      if (Chance(0.5)) {
        const uint64_t executor =
            GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
        if (executor == 0) return;
        launches.push_back(LaunchRequest(s, executor, 0));
        expects.push_back(V());
        if (Chance(0.3)) {  // The same single-use executor again.
          launches.push_back(LaunchRequest(s, executor, 0));
          expects.push_back(Invalid("consumed_executor",
                                    Bit(StatusCode::FAILED_PRECONDITION)));
        }
      } else if (Chance(0.5)) {
        launches.push_back(LaunchRequest(s, (1ull << 60) + i, 0));
        expects.push_back(
            Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND)));
      } else {
        const uint64_t executor =
            GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
        if (executor == 0) return;
        launches.push_back(LaunchRequest(s, executor, (1ull << 60) + i));
        expects.push_back(
            Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND)));
        // Refused before consuming: destroy it afterwards.
        launches.push_back(LaunchRequest(s, executor, 0));
        expects.push_back(V());
      }
    }
    ExecuteStream(s, launches, expects, V());
    Sync(s, 0);
  }

  // ------------------------------------------------ faults, in-process

  void FaultScenario() {
    switch (Rand(8)) {
      case 6:
        CloseMidTransfer();
        return;
      case 7:
        UnreadPipeline();
        return;
      case 0:
        CancelUpload();
        break;
      case 1:
        CancelDownload();
        break;
      case 2:
        CancelPipeline();
        break;
      case 3:
        CloseMidPipeline();
        break;
      case 4:
        CancelAttach();
        break;
      default:
        CloseWithWork();
        break;
    }
  }

  void CancelUpload() {
    SessionState* s = &main_;
    const uint64_t size = (8 + Rand(25)) << 20;
    const uint64_t b = Malloc(s, size);
    if (b == 0) return;
    const std::string chunk(256 << 10, 'u');
    grpc::ClientContext context;
    const bool by_deadline = Chance(0.3);
    SetDeadline(&context, by_deadline ? absl::Milliseconds(5 + Rand(50))
                                      : kTransferDeadline);
    v1::UploadResponse response;
    auto writer = conn_->rt->Upload(&context, &response);
    v1::UploadRequest message;
    message.set_session(s->token);
    message.set_buffer(b);
    message.set_size(size);
    const uint64_t stop_after = Rand(size / chunk.size());
    uint64_t sent = 0;
    for (uint64_t i = 0; sent < size; ++i) {
      if (!by_deadline && i == stop_after) {
        context.TryCancel();
        break;
      }
      message.set_data(chunk);
      if (!writer->Write(message)) break;
      message.Clear();
      sent += chunk.size();
    }
    if (sent >= size) writer->WritesDone();
    grpc::Status status = writer->Finish();
    Record("Upload",
           Invalid("cancel_upload", Bit(StatusCode::CANCELLED) |
                                        Bit(StatusCode::DEADLINE_EXCEEDED) |
                                        Bit(StatusCode::OK)),
           status, context);
    // The session is unharmed.
    CheckSessionStats();
    Free(s, b);
  }

  void CancelDownload() {
    SessionState* s = &main_;
    const uint64_t size = (8 + Rand(25)) << 20;
    const uint64_t b = Malloc(s, size);
    if (b == 0) return;
    grpc::ClientContext context;
    const int how = static_cast<int>(Rand(3));
    SetDeadline(&context, how == 2 ? absl::Milliseconds(5 + Rand(50))
                                   : kTransferDeadline);
    v1::DownloadRequest request;
    request.set_session(s->token);
    request.set_buffer(b);
    request.set_size(size);
    auto reader = conn_->rt->Download(&context, request);
    v1::DownloadResponse chunk;
    if (how == 0) {
      context.TryCancel();  // Before reading anything.
    } else if (how == 1) {
      const uint64_t k = 1 + Rand(3);
      for (uint64_t i = 0; i < k && reader->Read(&chunk); ++i) {
      }
      context.TryCancel();
    } else {
      absl::SleepFor(absl::Milliseconds(Rand(20)));  // A slow reader.
    }
    while (reader->Read(&chunk)) {
    }
    Record("Download",
           Invalid("cancel_download", Bit(StatusCode::CANCELLED) |
                                          Bit(StatusCode::DEADLINE_EXCEEDED) |
                                          Bit(StatusCode::OK)),
           reader->Finish(), context);
    CheckSessionStats();
    Free(s, b);
  }

  // ExecuteStream cancelled with launches in flight; what was queued runs
  // and the stream synchronizes OK.
  void CancelPipeline() {
    SessionState* s = &main_;
    const int64_t n = 1 << 16;
    const uint64_t b = Malloc(s, n * 4);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request;
    request.set_op("SoftshrinkBackward");
    request.mutable_params()->set_lambd(0.5);
    for (const char* name : {"gradOutput", "self", "gradInput"}) {
      (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
    if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
    const uint64_t stream = PickStream();
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    auto call = conn_->ops->ExecuteStream(&context);
    const int launches = 64 + static_cast<int>(Rand(448));
    const v1::ExecuteRequest launch = LaunchRequest(s, executor, stream);
    for (int i = 0; i < launches; ++i) {
      if (!call->Write(launch)) break;
    }
    const uint64_t k = Rand(16);
    v1::ExecuteResponse reply;
    for (uint64_t i = 0; i < k && call->Read(&reply); ++i) {
      Outcome o;
      o.code = static_cast<StatusCode>(reply.code());
      o.aclnn = reply.aclnn_status();
      o.message = reply.message();
      stats_->Record("ExecuteStream launch", V(), o);
    }
    context.TryCancel();
    while (call->Read(&reply)) {
    }
    Record("ExecuteStream",
           Invalid("cancel_pipeline",
                   Bit(StatusCode::CANCELLED) | Bit(StatusCode::OK)),
           call->Finish(), context);
    Sync(s, stream);
    DestroyExecutor(s, executor, V());
    Free(s, b);
  }

  // CloseSession while its ExecuteStream runs: later launches are refused
  // in their replies; the call ends OK.
  void CloseMidPipeline() {
    SessionState temp;
    if (!OpenSession(&temp, Chance(0.5))) return;
    const int64_t n = 1 << 16;
    const uint64_t b = Malloc(&temp, n * 4);
    if (b == 0) return CloseSession(&temp);
    v1::GetWorkspaceSizeRequest request;
    request.set_op("ThresholdBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(&temp, request, nullptr, V());
    if (executor == 0 || !SetRepeatable(&temp, executor, V()).ok()) {
      return CloseSession(&temp);
    }
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    auto call = conn_->ops->ExecuteStream(&context);
    const v1::ExecuteRequest launch = LaunchRequest(&temp, executor, 0);
    const int before = 8 + static_cast<int>(Rand(24));
    for (int i = 0; i < before; ++i) call->Write(launch);
    v1::ExecuteResponse reply;
    const Expect either = Invalid(
        "close_mid_pipeline", Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND) |
                                  Bit(StatusCode::CANCELLED));
    int read = 0;
    for (; read < 4 && call->Read(&reply); ++read) {
      Outcome o;
      o.code = static_cast<StatusCode>(reply.code());
      o.aclnn = reply.aclnn_status();
      o.message = reply.message();
      stats_->Record("ExecuteStream launch", either, o);
    }
    CloseSession(&temp);
    const int after = 1 + static_cast<int>(Rand(8));
    for (int i = 0; i < after; ++i) call->Write(launch);
    call->WritesDone();
    Outcome last;
    while (call->Read(&reply)) {
      ++read;
      last.code = static_cast<StatusCode>(reply.code());
      last.aclnn = reply.aclnn_status();
      last.message = reply.message();
      stats_->Record("ExecuteStream launch", either, last);
    }
    Outcome o = Record("ExecuteStream", V(), call->Finish(), context);
    if (o.ok() &&
        (read != before + after || last.code != StatusCode::NOT_FOUND)) {
      stats_->Problem("close_mid_pipeline",
                      absl::StrCat(read, " replies to ", before + after,
                                   " launches; the last after CloseSession: ",
                                   CodeName(last.code)));
    }
  }

  // CloseSession from another thread while the session's transfer runs.
  void CloseMidTransfer() {
    SessionState temp;
    if (!OpenSession(&temp, Chance(0.5))) return;
    const uint64_t size = 16 << 20;
    const uint64_t b = Malloc(&temp, size);
    if (b == 0) return CloseSession(&temp);
    const bool upload = Chance(0.5);
    const Expect e = Invalid("close_mid_transfer",
                             Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND) |
                                 Bit(StatusCode::CANCELLED));
    SessionState view;  // The transfer's own copy of what it names.
    view.token = temp.token;
    std::thread transfer([&] {
      grpc::ClientContext context;
      SetDeadline(&context, kTransferDeadline);
      if (upload) {
        v1::UploadResponse response;
        auto writer = conn_->rt->Upload(&context, &response);
        v1::UploadRequest message;
        message.set_session(view.token);
        message.set_buffer(b);
        message.set_size(size);
        const std::string chunk(256 << 10, 't');
        for (uint64_t sent = 0; sent < size; sent += chunk.size()) {
          message.set_data(chunk);
          if (!writer->Write(message)) break;
          message.Clear();
          absl::SleepFor(absl::Microseconds(500));
        }
        writer->WritesDone();
        Record("Upload", e, writer->Finish(), context);
      } else {
        v1::DownloadRequest request;
        request.set_session(view.token);
        request.set_buffer(b);
        request.set_size(size);
        auto reader = conn_->rt->Download(&context, request);
        v1::DownloadResponse chunk;
        while (reader->Read(&chunk)) absl::SleepFor(absl::Milliseconds(5));
        Record("Download", e, reader->Finish(), context);
      }
    });
    absl::SleepFor(absl::Milliseconds(Rand(30)));
    CloseSession(&temp);
    transfer.join();
  }

  // ExecuteStream that never reads its replies: the server stops reading
  // at --max_pending_replies, the client's writes block, the deadline ends
  // the call.
  void UnreadPipeline() {
    SessionState* s = &main_;
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    const uint64_t executor =
        GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
    if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
    grpc::ClientContext context;
    SetDeadline(&context, absl::Milliseconds(1000 + Rand(2000)));
    auto call = conn_->ops->ExecuteStream(&context);
    const v1::ExecuteRequest launch = LaunchRequest(s, executor, 0);
    int written = 0;
    while (written < 3000 && call->Write(launch)) ++written;
    call->WritesDone();
    v1::ExecuteResponse reply;
    int replies = 0;
    while (call->Read(&reply)) {
      ++replies;
      if (reply.code() != 0) {
        stats_->Problem("unread_pipeline",
                        absl::StrCat("launch failed: ", reply.message()));
      }
    }
    Record("ExecuteStream",
           Invalid("unread_pipeline",
                   Bit(StatusCode::DEADLINE_EXCEEDED) | Bit(StatusCode::OK)),
           call->Finish(), context);
    Sync(s, 0);
    DestroyExecutor(s, executor, V());
  }

  // Cancelling the Attach call ends the session on the server.
  void CancelAttach() {
    SessionState temp;
    if (!OpenSession(&temp, true)) return;
    Malloc(&temp, 1 + Rand(1 << 20));
    const std::string token = temp.token;
    DropAttach(&temp);
    temp.token = token;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    const Expect e = Invalid("attach_cancel",
                             Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND));
    for (;;) {
      v1::GetSessionStatsRequest request;
      request.set_session(token);
      v1::SessionStats stats;
      Outcome o = Unary("GetSessionStats", SOAK_RT(GetSessionStats), request,
                        &stats, e);
      if (o.code == StatusCode::NOT_FOUND) return;
      if (!o.ok()) return;
      if (absl::Now() > deadline) {
        stats_->Problem("attach_cancel",
                        "the session outlived its cancelled Attach by 10 s");
        return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  // CloseSession with work queued on its streams returns promptly.
  void CloseWithWork() {
    SessionState temp;
    if (!OpenSession(&temp, Chance(0.5))) return;
    const int64_t n = 1 << 18;
    const uint64_t b = Malloc(&temp, n * 4);
    if (b == 0) return CloseSession(&temp);
    v1::GetWorkspaceSizeRequest request;
    request.set_op("HardswishBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(&temp, request, nullptr, V());
    if (executor == 0 || !SetRepeatable(&temp, executor, V()).ok()) {
      return CloseSession(&temp);
    }
    const uint64_t stream = CreateStream(&temp, V());
    for (int i = 0; i < 32; ++i) {
      Execute(&temp, LaunchRequest(&temp, executor, i % 2 ? stream : 0), V());
    }
    CloseSession(&temp);
  }

  const int id_;
  const std::string address_;
  const std::string tenant_;
  std::shared_ptr<Conn> conn_;
  Stats* const stats_;
  std::mt19937_64 rng_;
  const Mode mode_;
  SessionState main_;
};

}  // namespace

void RunRpcClient(const ClientOptions& options, absl::Time end,
                  const std::atomic<bool>* stop, int slow_transfer) {
  Client client(options);
  if (slow_transfer != 0) client.SlowTransfer(/*upload=*/slow_transfer == 1);
  client.Run(end, stop);
}

[[noreturn]] void RunFaultChild(const std::string& kind,
                                const std::string& address, bool attach,
                                int parent, const std::string& token) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(4);
  alarm(60);
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "soak fault child: %s\n", what.c_str());
    _exit(5);
  };
  auto ready = [] {
    if (write(1, "R", 1) != 1) _exit(6);
  };
  auto conn = Connect(address, true, token);
  grpc::ClientContext create_context;
  v1::CreateSessionRequest create;
  create.set_client_name(absl::StrCat("soak fault child ", kind));
  v1::CreateSessionResponse session;
  grpc::Status status =
      conn->rt->CreateSession(&create_context, create, &session);
  if (!status.ok()) fail("CreateSession: " + status.error_message());
  grpc::ClientContext attach_context;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attached;
  if (attach) {
    v1::AttachRequest request;
    request.set_session(session.session());
    attached = conn->rt->Attach(&attach_context, request);
    v1::AttachEvent event;
    if (!attached->Read(&event)) fail("Attach");
  }
  const uint64_t size = 16 << 20;
  grpc::ClientContext malloc_context;
  v1::MallocRequest malloc_request;
  malloc_request.set_session(session.session());
  malloc_request.set_size(size);
  v1::MallocResponse buffer;
  status = conn->rt->Malloc(&malloc_context, malloc_request, &buffer);
  if (!status.ok()) fail("Malloc: " + status.error_message());
  bool said = false;
  if (kind == "upload") {
    const std::string chunk(256 << 10, 'c');
    for (;;) {
      grpc::ClientContext context;
      v1::UploadResponse response;
      auto writer = conn->rt->Upload(&context, &response);
      v1::UploadRequest message;
      message.set_session(session.session());
      message.set_buffer(buffer.buffer());
      message.set_size(size);
      for (uint64_t sent = 0; sent < size; sent += chunk.size()) {
        message.set_data(chunk);
        if (!writer->Write(message)) fail("Upload write");
        message.Clear();
        if (!said && sent >= 4 * chunk.size()) {
          ready();
          said = true;
        }
        usleep(2000);
      }
      writer->WritesDone();
      status = writer->Finish();
      if (!status.ok()) fail("Upload: " + status.error_message());
    }
  } else if (kind == "download") {
    for (;;) {
      grpc::ClientContext context;
      v1::DownloadRequest request;
      request.set_session(session.session());
      request.set_buffer(buffer.buffer());
      request.set_size(size);
      auto reader = conn->rt->Download(&context, request);
      v1::DownloadResponse chunk;
      while (reader->Read(&chunk)) {
        if (!said) {
          ready();
          said = true;
        }
        usleep(50000);  // A slow reader: the server waits on flow control.
      }
      status = reader->Finish();
      if (!status.ok()) fail("Download: " + status.error_message());
    }
  } else {
    const int64_t n = (16 << 20) / 4;
    grpc::ClientContext plan_context;
    v1::GetWorkspaceSizeRequest plan;
    plan.set_session(session.session());
    plan.set_op("HardswishBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*plan.mutable_tensors())[name] =
          Desc(buffer.buffer(), v1::FLOAT, {n / 16});
    }
    v1::GetWorkspaceSizeResponse executor;
    status = conn->ops->GetWorkspaceSize(&plan_context, plan, &executor);
    if (!status.ok()) fail("GetWorkspaceSize: " + status.error_message());
    grpc::ClientContext repeat_context;
    v1::SetExecutorRepeatableRequest repeat;
    repeat.set_session(session.session());
    repeat.set_executor(executor.executor());
    v1::SetExecutorRepeatableResponse repeated;
    status =
        conn->ops->SetExecutorRepeatable(&repeat_context, repeat, &repeated);
    if (!status.ok()) fail("SetExecutorRepeatable: " + status.error_message());
    grpc::ClientContext context;
    auto call = conn->ops->ExecuteStream(&context);
    v1::ExecuteRequest launch;
    launch.set_session(session.session());
    launch.set_executor(executor.executor());
    // At most 32 launches in flight: what it leaves queued is bounded.
    int in_flight = 0, replies = 0;
    v1::ExecuteResponse reply;
    for (;;) {
      while (in_flight < 32) {
        if (!call->Write(launch)) fail("ExecuteStream write");
        ++in_flight;
      }
      if (!call->Read(&reply)) fail("ExecuteStream read");
      if (reply.code() != 0) fail("ExecuteStream launch: " + reply.message());
      --in_flight;
      if (++replies == 16) ready();
    }
  }
  _exit(7);
}

}  // namespace opserver::soak
