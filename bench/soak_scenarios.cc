#include "bench/soak_scenarios.h"

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
#include "bench/soak_rpc_client.h"

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

namespace rpc {

ForeignHandles& Foreign() {
  static auto* const handles = new ForeignHandles();
  return *handles;
}

// Loops over scenarios until `end` or `stop`, then ends its session.
void Client::Run(absl::Time end, const std::atomic<bool>* stop) {
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
void Client::SlowTransfer(bool upload) {
  if (!EnsureSession()) return;
  const uint64_t size = 64 << 20;
  const uint64_t b = Malloc(&main_, size);
  if (b == 0) return;
  PacedTransfer(upload, main_.token, b, size, 1 << 20, absl::Milliseconds(300),
                absl::Milliseconds(1250),
                upload ? "Upload (slow writer)" : "Download (slow reader)",
                V());
}

void Client::PacedTransfer(bool upload, const std::string& token,
                           uint64_t buffer, uint64_t size, uint64_t chunk,
                           absl::Duration write_pause,
                           absl::Duration read_pause, const char* name,
                           const Expect& e) {
  grpc::ClientContext context;
  SetDeadline(&context, kTransferDeadline);
  if (upload) {
    v1::UploadResponse response;
    auto writer = conn_->rt->Upload(&context, &response);
    v1::UploadRequest message;
    message.set_session(token);
    message.set_buffer(buffer);
    message.set_size(size);
    const std::string data(chunk, 's');
    for (uint64_t sent = 0; sent < size; sent += data.size()) {
      message.set_data(data);
      if (!writer->Write(message)) break;
      message.Clear();
      absl::SleepFor(write_pause);
    }
    writer->WritesDone();
    Record(name, e, writer->Finish(), context);
  } else {
    v1::DownloadRequest request;
    request.set_session(token);
    request.set_buffer(buffer);
    request.set_size(size);
    auto reader = conn_->rt->Download(&context, request);
    v1::DownloadResponse message;
    while (reader->Read(&message)) absl::SleepFor(read_pause);
    Record(name, e, reader->Finish(), context);
  }
}

void Client::RunSoakScenario() {
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
bool Client::RunShutdownScenario() {
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
void Client::EndClient() {
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

// Compute (one operator end to end on device memory, checked against the
// host reference) is in soak_compute_scenario.cc.

// Bytes up and down, any sizes, chunking and offsets; compared.
bool Client::Transfer() {
  SessionState* s = &main_;
  static const std::vector<uint64_t> kSizes = {
      0, 1, 4095, 4096, 65537, (1 << 20) + 3, 4 << 20, (9 << 20) + 7, 16 << 20};
  const uint64_t size = kSizes[Rand(Chance(0.8) ? 6 : kSizes.size())];
  std::string data(size, '\0');
  for (uint64_t i = 0; i < size; i += 8) {
    const uint64_t r = rng_();
    std::memcpy(data.data() + i, &r, std::min<uint64_t>(8, size - i));
  }
  const uint64_t buffer = Malloc(s, size);
  if (buffer == 0) return false;
  const uint64_t stream = PickStream();
  static const std::vector<uint64_t> kChunks = {1000, 65536, 1 << 20, 4 << 20};
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
bool Client::Pipeline() {
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
  std::vector<v1::ExecuteRequest> launches(16 + Rand(48),
                                           LaunchRequest(s, executor, stream));
  std::vector<Expect> expects(launches.size(), V());
  if (!ExecuteStream(s, launches, expects, V())) return false;
  if (!Sync(s, stream)) return false;
  if (!DestroyExecutor(s, executor, V()).ok()) return false;
  return Free(s, buffer);
}

// Discovery, stats, health.
void Client::InfoScenario() {
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
          response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
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
          response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
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
void Client::CheckSessionStats() {
  v1::GetSessionStatsRequest request;
  request.set_session(main_.token);
  v1::SessionStats stats;
  if (!Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats, V())
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
                     main_.streams.size(), " streams, ", main_.executors.size(),
                     " executors"));
  }
}

// Streams: created, loaded, synchronized, destroyed with work queued.
void Client::StreamScenario() {
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
      Sync(s, stream, Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
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
void Client::SessionScenario() {
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

void Client::EvaluateScenario() {
  const int op = static_cast<int>(Rand(kNumOps));
  const DataType dt = v1::FLOAT;
  const int64_t n = 1 + Rand(64);
  v1::EvaluateRequest request;
  request.set_op(kOpNames[op]);
  v1::OpParams* params = request.mutable_params();
  params->set_threshold(0.5);
  params->set_lambd(1.0);
  params->set_scale(2);
  if (op == kLeakyReluBackward) {
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
  if (op == kDropoutBackward) {
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
    const bool bit = op == kDropoutBackward &&
                     ((static_cast<int>(mask[i / 8]) >> (i % 8)) & 1);
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

}  // namespace rpc

void RunRpcClient(const ClientOptions& options, absl::Time end,
                  const std::atomic<bool>* stop, int slow_transfer) {
  rpc::Client client(options);
  if (slow_transfer != 0) client.SlowTransfer(/*upload=*/slow_transfer == 1);
  client.Run(end, stop);
}

}  // namespace opserver::soak
