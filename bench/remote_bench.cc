// Remote-execution benchmarks: opserver's transfers and per-operator
// overhead next to the machine's transport limits, measured in the same run.
//
//   bazel run -c opt //bench:remote_bench
//
// Before any gRPC use, main() forks two server processes (so client and
// server do not share a process, as in production): an opserver and a
// baseline process serving a raw TCP sink and a bare gRPC Echo service.
// Reported: GB/s for 256 MiB transfers (raw TCP one-way, bare gRPC client
// stream, opserver Upload and Download), and calls/s for a bare unary round
// trip, a tiny operator (GetWorkspaceSize + Execute + SynchronizeStream),
// sequential and pipelined launches. Then, with a fresh opserver process,
// the server's peak RSS while a 1 GiB tensor goes up and down.
//
// --pin: this process (every client) runs on CPU 0 and every forked server
// on CPU 1, so the two ends of a transfer do not take turns on one core as
// they would not on two machines; unpinned, the scheduler moves both over
// both cores and the receiver's work competes with the sender's.
// --paired=N: instead of the benchmarks, N rounds of raw TCP next to a
// library upload and download and an aclrtMemcpy each way, each transfer
// divided by the raw TCP transfer just before it (see PairedRatios).
// --transfer_connections=K: the client library's connections per transfer
// of 32 MiB or more (ConnectOptions::transfer_connections).
// --grpc_transfers: the library's transfers through gRPC, not the server's
// data path (ConnectOptions::data_path = false).
// --chain=OPSERVER,LIBACLNN_REMOTE: instead of the benchmarks, the Ascend
// device over its verification chain (bench/chain.h) against its CPU
// backend directly and raw TCP, in one run (see ChainRatios); the number of
// rounds is --paired's (default 5).

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "bench/chain.h"
#include "bench/echo.grpc.pb.h"
#include "benchmark/benchmark.h"
#include "client/client.h"
#include "common/malloc_tuning.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/grpcpp.h"
#include "kernels/validate.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"

namespace opserver {
namespace {

constexpr size_t kTransferBytes = 256ull << 20;
constexpr size_t kChunk = 4ull << 20;

int opserver_port = 0;
// --window_curve=W1,W2,...: opservers with these --receive_window_bytes
// (0 = BDP probing), forked at start like the others.
std::vector<uint64_t> curve_windows;
std::vector<std::pair<pid_t, int>> curve_servers;
// Raw TCP sinks by destination (Dest below).
int tcp_ports[2] = {0, 0};
int echo_port = 0;
// --echo_window=N: the echo sink with a fixed N-byte receive window (BDP
// probing off), as opserver's --receive_window_bytes; 0 = gRPC's defaults.
int64_t echo_window = 0;
std::vector<pid_t> children;
// --pin (see the top of the file).
bool pin_cores = false;
// --transfer_connections=K: the client library's connections per large
// transfer (0: the library's default).
int transfer_connections = 0;
// --grpc_transfers: the client library moves bytes through gRPC's
// Upload/Download even where the server has a data path
// (ConnectOptions::data_path = false), to compare the two.
bool grpc_transfers = false;

// Keeps the calling process on `cpu` (and the threads it starts later).
void PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::perror("remote_bench --pin: sched_setaffinity");
    std::exit(1);
  }
}

// ---- Child processes -------------------------------------------------------

void SendPort(int fd, int port) {
  if (write(fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  close(fd);
}

// Runs `body(report_port)` in a child; returns the port it reports.
template <typename Body>
int Fork(Body body) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  pid_t pid = fork();
  if (pid == 0) {
    if (pin_cores) PinToCpu(1);
    close(fds[0]);
    body(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) std::abort();
  close(fds[0]);
  children.push_back(pid);
  return port;
}

void RunOpserverWithWindow(int report, int64_t window) {
  Options options;
  options.listen = "127.0.0.1:0";
  if (window >= 0) options.receive_window_bytes = window;
  options.transfer_limits.chunk_bytes = kChunk;
  options.detect_mutex_deadlocks = false;  // As the opserver binary runs.
  auto server = Server::Start(options);
  if (!server.ok()) _exit(1);
  SendPort(report, (*server)->port());
  pause();  // Until killed.
}

// The production default window.
void RunOpserver(int report) { RunOpserverWithWindow(report, -1); }

class EchoService final : public bench::Echo::CallbackService {
  grpc::ServerReadReactor<bench::Chunk>* Sink(
      grpc::CallbackServerContext* /*context*/, bench::Ack* ack) override {
    class Reader : public grpc::ServerReadReactor<bench::Chunk> {
     public:
      explicit Reader(bench::Ack* ack) : ack_(ack) { StartRead(&chunk_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          ack_->set_bytes(bytes_);
          Finish(grpc::Status::OK);
          return;
        }
        bytes_ += chunk_.data().size();
        StartRead(&chunk_);
      }
      void OnDone() override { delete this; }

     private:
      bench::Ack* ack_;
      bench::Chunk chunk_;
      uint64_t bytes_ = 0;
    };
    return new Reader(ack);
  }
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const bench::Chunk* request,
                                 bench::Chunk* response) override {
    *response = *request;
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// Where a raw TCP sink puts what it receives. Like the source, the
// destination matters on these VMs: an upload writes 256 MiB of device
// memory, which no cache holds, while one 4 MiB buffer read into over and
// over stays (partly) cached.
enum Dest : int64_t {
  kDestChunk = 0,  // One 4 MiB buffer, over and over: the socket's ceiling.
  kDestWhole = 1,  // A resident 256 MiB buffer, as an upload's device memory.
};

// Raw TCP sink: reads each connection to its end into `dest`, then answers
// one byte.
void RunTcpSink(int report, Dest dest) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 16) != 0) {
    _exit(1);
  }
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  SendPort(report, ntohs(addr.sin_port));
  // Written once, so every page is resident like a populated device block.
  std::vector<char> sink(dest == kDestWhole ? kTransferBytes : kChunk, 'z');
  for (;;) {
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) continue;
    size_t at = 0;
    ssize_t n;
    while ((n = read(fd, sink.data() + at,
                     std::min(kChunk, sink.size() - at))) > 0) {
      at = (at + static_cast<size_t>(n)) % sink.size();
    }
    char ack = 1;
    if (write(fd, &ack, 1) != 1) {
      // The client went away; nothing to report to.
    }
    close(fd);
  }
}

void RunEcho(int report) {
  EchoService echo;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  if (echo_window > 0) {  // As opserver's --receive_window_bytes does.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               static_cast<int>(echo_window));
  }
  builder.RegisterService(&echo);
  auto server = builder.BuildAndStart();
  if (server == nullptr) _exit(1);
  SendPort(report, port);
  pause();
}

// ---- Benchmarks ------------------------------------------------------------

std::shared_ptr<grpc::Channel> Channel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

// What the source memory of a transfer is. On these VMs the first time the
// kernel reads a page a process has just written costs about as much as a
// page fault (sending a freshly written 256 MiB buffer over raw TCP runs at
// a third of the speed of sending it again), so a transfer is compared
// with raw TCP sending the same kind of memory.
enum Source : int64_t {
  kCachedChunk = 0,  // One 4 MiB buffer sent over and over: the ceiling.
  kWarm = 1,         // The whole 256 MiB, sent before (untimed) and again.
  kFresh = 2,        // A newly written 256 MiB buffer per transfer.
};

// The bytes a transfer sends, per `source`; Refresh() before each timed
// transfer writes a new buffer (untimed) for kFresh.
class SourceData {
 public:
  explicit SourceData(int64_t source)
      : source_(source),
        data_(source == kCachedChunk ? kChunk : kTransferBytes, 'x') {}
  void Refresh(benchmark::State& state) {
    if (source_ != kFresh) return;
    state.PauseTiming();
    std::vector<char>(kTransferBytes, 'y').swap(data_);
    state.ResumeTiming();
  }
  // The bytes at `offset` of the transfer (the 4 MiB chunk repeats).
  const char* at(size_t offset) const {
    return data_.data() + (source_ == kCachedChunk ? 0 : offset);
  }
  bool warm() const { return source_ == kWarm; }

 private:
  const int64_t source_;
  std::vector<char> data_;
};

// One raw TCP transfer of kTransferBytes from `data`; false on failure.
bool RawTcpSend(const SourceData& data, Dest dest = kDestChunk) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(tcp_ports[dest]);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return false;
  }
  for (size_t sent = 0; sent < kTransferBytes;) {
    ssize_t n =
        write(fd, data.at(sent), std::min(kChunk, kTransferBytes - sent));
    if (n <= 0) break;
    sent += n;
  }
  shutdown(fd, SHUT_WR);
  char ack;
  const bool acked = read(fd, &ack, 1) == 1;
  close(fd);
  return acked;
}

// Args: Source, Dest.
void BM_RawTcpOneWay(benchmark::State& state) {
  SourceData data(state.range(0));
  const Dest dest = static_cast<Dest>(state.range(1));
  if (data.warm() && !RawTcpSend(data, dest)) {
    state.SkipWithError("send failed");
  }
  for (auto _ : state) {
    data.Refresh(state);
    if (!RawTcpSend(data, dest)) state.SkipWithError("send failed");
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

void BM_GrpcClientStream(benchmark::State& state) {
  auto stub = bench::Echo::NewStub(Channel(echo_port));
  bench::Chunk chunk;
  chunk.set_data(std::string(kChunk, 'x'));
  for (auto _ : state) {
    grpc::ClientContext context;
    bench::Ack ack;
    auto writer = stub->Sink(&context, &ack);
    for (size_t sent = 0; sent < kTransferBytes; sent += kChunk) {
      writer->Write(chunk);
    }
    writer->WritesDone();
    if (!writer->Finish().ok()) state.SkipWithError("sink failed");
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

struct Remote {
  std::unique_ptr<v1::Runtime::Stub> runtime;
  std::unique_ptr<v1::Operators::Stub> ops;
  std::string session;

  explicit Remote(int port) {
    auto channel = Channel(port);
    runtime = v1::Runtime::NewStub(channel);
    ops = v1::Operators::NewStub(channel);
    grpc::ClientContext context;
    v1::CreateSessionResponse response;
    MustSucceed(
        runtime->CreateSession(&context, v1::CreateSessionRequest(), &response),
        "CreateSession");
    session = response.session();
  }
  ~Remote() {
    grpc::ClientContext context;
    v1::CloseSessionRequest request;
    request.set_session(session);
    v1::CloseSessionResponse response;
    runtime->CloseSession(&context, request, &response);
  }
  uint64_t Malloc(uint64_t size) {
    grpc::ClientContext context;
    v1::MallocRequest request;
    request.set_session(session);
    request.set_size(size);
    v1::MallocResponse response;
    MustSucceed(runtime->Malloc(&context, request, &response), "Malloc");
    return response.buffer();
  }
  uint64_t CreateStream() {
    grpc::ClientContext context;
    v1::CreateStreamRequest request;
    request.set_session(session);
    v1::CreateStreamResponse response;
    MustSucceed(runtime->CreateStream(&context, request, &response),
                "CreateStream");
    return response.stream();
  }
  // A benchmark on handle 0 would measure an error path: stop instead.
  static void MustSucceed(const grpc::Status& status, const char* what) {
    if (status.ok()) return;
    std::fprintf(stderr, "remote_bench: %s: %s\n", what,
                 status.error_message().c_str());
    std::abort();
  }
  // Streams `size` bytes of `data` (repeated) into the buffer.
  bool Upload(uint64_t buffer, const char* data, size_t size) {
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = runtime->Upload(&context, &response);
    v1::UploadRequest chunk;
    chunk.set_session(session);
    chunk.set_buffer(buffer);
    chunk.set_size(size);
    for (size_t at = 0; at < size; at += kChunk) {
      chunk.set_data(data + at, std::min(kChunk, size - at));
      if (!writer->Write(chunk)) break;
      chunk.clear_session();
    }
    writer->WritesDone();
    return writer->Finish().ok();
  }
  // The same upload, serialized by hand: each message is a few header bytes
  // plus a slice that points into the caller's memory, so the client copies
  // nothing before the socket write (what the stub's set_data cannot do).
  // Ordered on `stream` (0: the session's default stream), in messages of
  // `chunk` bytes.
  bool UploadZeroCopy(grpc::Channel* channel, uint64_t buffer, const char* data,
                      size_t size, uint64_t offset = 0, uint64_t stream = 0,
                      size_t chunk = kChunk) {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel,
            grpc::internal::RpcMethod(
                "/opserver.v1.Runtime/Upload",
                grpc::internal::RpcMethod::CLIENT_STREAMING),
            &context, &response));
    v1::UploadRequest header;
    header.set_session(session);
    header.set_buffer(buffer);
    header.set_offset(offset);
    header.set_size(size);
    header.set_stream(stream);
    std::string prefix = header.SerializeAsString();
    size_t at = 0;
    do {  // At least one message: an empty upload is its header alone.
      const size_t n = std::min(chunk, size - at);
      uint8_t tag[11];
      tag[0] = google::protobuf::internal::WireFormatLite::MakeTag(
          v1::UploadRequest::kDataFieldNumber,
          google::protobuf::internal::WireFormatLite::
              WIRETYPE_LENGTH_DELIMITED);
      uint8_t* end =
          google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
              n, tag + 1);
      prefix.append(reinterpret_cast<char*>(tag), end - tag);
      grpc::Slice slices[] = {grpc::Slice(prefix),
                              grpc::Slice(const_cast<char*>(data + at), n,
                                          grpc::Slice::STATIC_SLICE)};
      grpc::ByteBuffer message(slices, 2);
      if (!writer->Write(message)) break;
      prefix.clear();
      at += n;
    } while (at < size);
    writer->WritesDone();
    return writer->Finish().ok();
  }

  bool Download(uint64_t buffer, char* out, size_t size) {
    grpc::ClientContext context;
    v1::DownloadRequest request;
    request.set_session(session);
    request.set_buffer(buffer);
    request.set_size(size);
    auto reader = runtime->Download(&context, request);
    v1::DownloadResponse chunk;
    size_t at = 0;
    while (reader->Read(&chunk)) {
      std::memcpy(out + at, chunk.data().data(), chunk.data().size());
      at += chunk.data().size();
    }
    return reader->Finish().ok() && at == size;
  }
  // A repeatable ThresholdBackward executor over fresh 16-element buffers.
  uint64_t RepeatableTinyExecutor() {
    uint64_t grad = Malloc(64), self = Malloc(64), out = Malloc(64);
    grpc::ClientContext context;
    v1::GetWorkspaceSizeResponse planned;
    ops->GetWorkspaceSize(&context, TinyThreshold(grad, self, out), &planned);
    grpc::ClientContext repeatable_context;
    v1::SetExecutorRepeatableRequest request;
    request.set_session(session);
    request.set_executor(planned.executor());
    v1::SetExecutorRepeatableResponse response;
    ops->SetExecutorRepeatable(&repeatable_context, request, &response);
    return planned.executor();
  }

  v1::GetWorkspaceSizeRequest TinyThreshold(uint64_t grad, uint64_t self,
                                            uint64_t out) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(session);
    request.set_op("ThresholdBackward");
    for (auto [name, buffer] :
         {std::pair{"gradOutput", grad}, std::pair{"self", self},
          std::pair{"out", out}}) {
      v1::TensorDesc& desc = (*request.mutable_tensors())[name];
      desc.set_buffer(buffer);
      desc.set_dtype(v1::FLOAT);
      desc.add_shape(16);
    }
    return request;
  }
};

void BM_OpserverUpload(benchmark::State& state) {
  Remote remote(opserver_port);
  std::vector<char> data(kTransferBytes, 'x');
  uint64_t buffer = remote.Malloc(kTransferBytes);
  remote.Upload(buffer, data.data(), kTransferBytes);  // Warm (see Source).
  for (auto _ : state) {
    if (!remote.Upload(buffer, data.data(), kTransferBytes)) {
      state.SkipWithError("upload failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

void BM_OpserverUploadZeroCopy(benchmark::State& state) {
  Remote remote(opserver_port);
  auto channel = Channel(opserver_port);
  std::vector<char> data(kTransferBytes, 'x');
  uint64_t buffer = remote.Malloc(kTransferBytes);
  remote.UploadZeroCopy(channel.get(), buffer, data.data(),
                        kTransferBytes);  // Warm (see Source).
  for (auto _ : state) {
    if (!remote.UploadZeroCopy(channel.get(), buffer, data.data(),
                               kTransferBytes)) {
      state.SkipWithError("upload failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

// Args: connections, KiB per message. The same 256 MiB in as many Upload
// calls of equal parts at once, each on its own TCP connection (a distinct
// channel argument keeps gRPC from sharing one subchannel) and its own
// stream. With more than one part, as a library upload split this way
// would have to: first an empty Upload on the first part's stream (the
// server answers it once the stream has reached it, so no part lands
// before the work queued ahead of the upload).
void BM_OpserverUploadParallel(benchmark::State& state) {
  const int k = static_cast<int>(state.range(0));
  const size_t chunk = static_cast<size_t>(state.range(1)) << 10;
  Remote remote(opserver_port);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < k; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetInt("opserver.bench.connection", i);
    channels.push_back(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(opserver_port),
                                  grpc::InsecureChannelCredentials(), args));
  }
  std::vector<char> data(kTransferBytes, 'x');
  uint64_t buffer = remote.Malloc(kTransferBytes);
  // A stream per part: uploads on one stream run one after another.
  std::vector<uint64_t> streams;
  for (int i = 0; i < k; ++i) streams.push_back(remote.CreateStream());
  const size_t part = kTransferBytes / k;
  auto upload = [&] {
    if (k > 1 && !remote.UploadZeroCopy(channels[0].get(), buffer, data.data(),
                                        0, 0, streams[0])) {
      return false;
    }
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int i = 0; i < k; ++i) {
      threads.emplace_back([&, i] {
        if (!remote.UploadZeroCopy(channels[i].get(), buffer,
                                   data.data() + i * part, part, i * part,
                                   streams[i], chunk)) {
          ++failures;
        }
      });
    }
    for (auto& t : threads) t.join();
    return failures == 0;
  };
  upload();  // Warm (see Source).
  for (auto _ : state) {
    if (!upload()) state.SkipWithError("upload failed");
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

void BM_OpserverDownload(benchmark::State& state) {
  Remote remote(opserver_port);
  std::vector<char> data(kTransferBytes, 'x');
  uint64_t buffer = remote.Malloc(kTransferBytes);
  remote.Upload(buffer, data.data(), kTransferBytes);
  for (auto _ : state) {
    if (!remote.Download(buffer, data.data(), kTransferBytes)) {
      state.SkipWithError("download failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

// Through the client library (what aclrtMemcpy and opctl use), with
// `chunk_bytes` per Upload message (0: the library's default).
std::unique_ptr<remote::Session> LibrarySession(int port,
                                                std::unique_ptr<Client>* client,
                                                uint64_t chunk_bytes = 0) {
  remote::ConnectOptions options;
  if (chunk_bytes != 0) options.upload_chunk_bytes = chunk_bytes;
  if (transfer_connections > 0) {
    options.transfer_connections = transfer_connections;
  }
  options.data_path = !grpc_transfers;
  auto connected =
      Client::Connect("127.0.0.1:" + std::to_string(port), options);
  if (!connected.ok()) return nullptr;
  *client = *std::move(connected);
  auto session = (*client)->CreateSession("remote_bench");
  return session.ok() ? *std::move(session) : nullptr;
}

// Args: Source (kWarm or kFresh), KiB per Upload message (0: the library's
// default).
void BM_ClientUpload(benchmark::State& state) {
  std::unique_ptr<Client> client;
  auto session = LibrarySession(opserver_port, &client,
                                static_cast<uint64_t>(state.range(1)) << 10);
  SourceData data(state.range(0));
  auto buffer = session->Malloc(kTransferBytes);
  auto upload = [&] {
    return session->Upload(buffer->handle(), 0, data.at(0), kTransferBytes)
        .ok();
  };
  if (data.warm() && !upload()) state.SkipWithError("upload failed");
  for (auto _ : state) {
    data.Refresh(state);
    if (!upload()) state.SkipWithError("upload failed");
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

void BM_ClientDownload(benchmark::State& state) {
  std::unique_ptr<Client> client;
  auto session = LibrarySession(opserver_port, &client);
  std::vector<char> data(kTransferBytes, 'x');
  auto buffer = session->Malloc(kTransferBytes);
  if (!session->Upload(buffer->handle(), 0, data.data(), kTransferBytes).ok()) {
    state.SkipWithError("upload failed");
    return;
  }
  for (auto _ : state) {
    if (!session->Download(buffer->handle(), 0, data.data(), kTransferBytes)
             .ok()) {
      state.SkipWithError("download failed");
    }
  }
  state.SetBytesProcessed(state.iterations() * kTransferBytes);
}

void BM_GrpcUnaryRoundTrip(benchmark::State& state) {
  auto stub = bench::Echo::NewStub(Channel(echo_port));
  bench::Chunk request;
  request.set_data(std::string(64, 'x'));
  for (auto _ : state) {
    grpc::ClientContext context;
    bench::Chunk response;
    if (!stub->Ping(&context, request, &response).ok()) {
      state.SkipWithError("ping failed");
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// GetWorkspaceSize + Execute + SynchronizeStream on resident 16-element
// buffers: the remote cost of one aclnn operator call.
void BM_TinyOperator(benchmark::State& state) {
  Remote remote(opserver_port);
  uint64_t grad = remote.Malloc(64), self = remote.Malloc(64),
           out = remote.Malloc(64);
  v1::GetWorkspaceSizeRequest plan = remote.TinyThreshold(grad, self, out);
  v1::ExecuteRequest execute;
  execute.set_session(remote.session);
  v1::SynchronizeStreamRequest sync;
  sync.set_session(remote.session);
  for (auto _ : state) {
    grpc::ClientContext c1, c2, c3;
    v1::GetWorkspaceSizeResponse planned;
    v1::ExecuteResponse executed;
    v1::SynchronizeStreamResponse synced;
    bool ok = remote.ops->GetWorkspaceSize(&c1, plan, &planned).ok();
    execute.set_executor(planned.executor());
    ok = ok && remote.ops->Execute(&c2, execute, &executed).ok();
    ok = ok && remote.runtime->SynchronizeStream(&c3, sync, &synced).ok();
    if (!ok) state.SkipWithError("tiny operator failed");
  }
  state.SetItemsProcessed(state.iterations());
}

// Launches of one repeatable executor: sequential (each Execute waits for
// its reply) vs pipelined (`in_flight` Executes outstanding on the one
// connection, then one synchronize).
void BM_Launches(benchmark::State& state) {
  const int in_flight = static_cast<int>(state.range(0));
  const int per_iteration = 256;
  Remote remote(opserver_port);
  const uint64_t executor = remote.RepeatableTinyExecutor();
  v1::ExecuteRequest execute;
  execute.set_session(remote.session);
  execute.set_executor(executor);
  for (auto _ : state) {
    absl::Mutex mu;
    int outstanding = 0, failures = 0;
    struct Call {
      grpc::ClientContext context;
      v1::ExecuteResponse response;
    };
    std::vector<std::unique_ptr<Call>> calls(per_iteration);
    for (int i = 0; i < per_iteration; ++i) {
      {
        struct Room {
          int* outstanding;
          int limit;
        } room{&outstanding, in_flight};
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](Room* r) { return *r->outstanding < r->limit; }, &room));
        ++outstanding;
      }
      calls[i] = std::make_unique<Call>();
      remote.ops->async()->Execute(&calls[i]->context, &execute,
                                   &calls[i]->response,
                                   [&](grpc::Status status) {
                                     absl::MutexLock lock(&mu);
                                     --outstanding;
                                     if (!status.ok()) ++failures;
                                   });
    }
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](int* n) { return *n == 0; }, &outstanding));
    }
    grpc::ClientContext context;
    v1::SynchronizeStreamRequest sync;
    sync.set_session(remote.session);
    v1::SynchronizeStreamResponse synced;
    if (failures > 0 ||
        !remote.runtime->SynchronizeStream(&context, sync, &synced).ok()) {
      state.SkipWithError("launch failed");
    }
  }
  state.SetItemsProcessed(state.iterations() * per_iteration);
}

// The same launches on one ExecuteStream call: requests written back to
// back, responses read by a second thread.
void BM_LaunchStream(benchmark::State& state) {
  const int per_iteration = 256;
  Remote remote(opserver_port);
  const uint64_t executor = remote.RepeatableTinyExecutor();
  v1::ExecuteRequest execute;
  execute.set_session(remote.session);
  execute.set_executor(executor);
  for (auto _ : state) {
    grpc::ClientContext context;
    auto stream = remote.ops->ExecuteStream(&context);
    int failures = 0;
    std::thread reader([&] {
      v1::ExecuteResponse response;
      while (stream->Read(&response)) failures += response.code() != 0;
    });
    for (int i = 0; i < per_iteration; ++i) stream->Write(execute);
    stream->WritesDone();
    reader.join();
    grpc::ClientContext sync_context;
    v1::SynchronizeStreamRequest sync;
    sync.set_session(remote.session);
    v1::SynchronizeStreamResponse synced;
    if (!stream->Finish().ok() || failures > 0 ||
        !remote.runtime->SynchronizeStream(&sync_context, sync, &synced).ok()) {
      state.SkipWithError("launch stream failed");
    }
  }
  state.SetItemsProcessed(state.iterations() * per_iteration);
}

BENCHMARK(BM_RawTcpOneWay)
    ->ArgNames({"source", "dest"})
    ->Args({kCachedChunk, kDestChunk})
    ->Args({kWarm, kDestChunk})
    ->Args({kFresh, kDestChunk})
    ->Args({kWarm, kDestWhole})
    ->Args({kFresh, kDestWhole})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_GrpcClientStream)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_OpserverUpload)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_OpserverUploadZeroCopy)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_OpserverUploadParallel)
    ->ArgNames({"connections", "message_kib"})
    ->Args({1, 4096})
    ->Args({2, 4096})
    ->Args({4, 4096})
    ->Args({1, 1024})
    ->Args({2, 1024})
    ->Args({4, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_OpserverDownload)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ClientUpload)
    ->ArgNames({"source", "chunk_kib"})
    ->Args({kWarm, 0})
    ->Args({kFresh, 0})
    // Smaller and larger messages than the default: what each message
    // costs besides its bytes (BENCHMARKS.md, "Per message").
    ->Args({kWarm, 64})
    ->Args({kWarm, 256})
    ->Args({kWarm, 4096})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_ClientDownload)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GrpcUnaryRoundTrip)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_TinyOperator)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Launches)
    ->Arg(1)
    ->Arg(64)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_LaunchStream)->Unit(benchmark::kMillisecond)->UseRealTime();

// Peak RSS (VmHWM) of a fresh opserver process before and after a 1 GiB
// tensor is uploaded and downloaded.
uint64_t PeakRssKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// Uploads (then downloads) 1 GiB through the client library; returns the
// server's peak RSS growth in KiB after the upload, or 0 on failure.
uint64_t UploadPeakGrowthKiB(pid_t pid, int port, bool download) {
  const size_t size = 1ull << 30;
  const uint64_t before = PeakRssKiB(pid);
  std::unique_ptr<Client> client;
  auto session = LibrarySession(port, &client);
  if (session == nullptr) return 0;
  std::vector<char> data(size, 'y');
  auto buffer = session->Malloc(size);
  if (!buffer.ok() ||
      !session->Upload(buffer->handle(), 0, data.data(), size).ok()) {
    return 0;
  }
  const uint64_t after_upload = PeakRssKiB(pid);
  if (download &&
      !session->Download(buffer->handle(), 0, data.data(), size).ok()) {
    return 0;
  }
  const uint64_t after = PeakRssKiB(pid);
  std::printf("after upload: +%.1f MiB, after download: +%.1f MiB\n",
              (after_upload - before) / 1024.0, (after - before) / 1024.0);
  return after - before;
}

void MeasureServerRss(pid_t pid, int port) {
  const uint64_t growth = UploadPeakGrowthKiB(pid, port, /*download=*/true);
  if (growth == 0) {
    std::printf("rss: transfer failed\n");
    return;
  }
  std::printf(
      "server peak RSS moving 1 GiB up and down (client library, %s): "
      "+%.1f MiB (buffer 1024 MiB + %.1f MiB, chunk %zu MiB)\n",
      grpc_transfers ? "gRPC, default window" : "data path", growth / 1024.0,
      growth / 1024.0 - 1024.0, kChunk >> 20);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds `transfer` (returning absl::Status) takes; aborts if it fails.
template <typename Transfer>
double Seconds(Transfer transfer) {
  const auto start = std::chrono::steady_clock::now();
  if (!transfer().ok()) std::abort();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Seconds for one raw TCP one-way transfer of kTransferBytes from `data`
// into a resident 256 MiB buffer (what the upload writes into).
double RawTcpSeconds(const SourceData& data) {
  return Seconds([&] {
    return RawTcpSend(data, kDestWhole)
               ? absl::OkStatus()
               : absl::UnavailableError("raw TCP send failed");
  });
}

// For each window: the server's peak RSS growth uploading 1 GiB (fresh
// process), then the median of 5 library uploads of 256 MiB, each next to a
// raw TCP transfer of the same size (interleaved, so both see the same
// neighbours), and 5 more back to back as the benchmarks run them.
void WindowCurve() {
  // The window governs gRPC's transfers only.
  grpc_transfers = true;
  std::printf(
      "| --receive_window_bytes | upload GB/s | raw TCP GB/s | upload / TCP | "
      "upload back to back GB/s | peak RSS over the 1 GiB buffer "
      "|\n|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < curve_windows.size(); ++i) {
    const auto [pid, port] = curve_servers[i];
    const uint64_t growth = UploadPeakGrowthKiB(pid, port, /*download=*/false);
    std::unique_ptr<Client> client;
    auto session = LibrarySession(port, &client);
    // The same 256 MiB for both (the first raw send warms it).
    SourceData data(kWarm);
    auto buffer = session->Malloc(kTransferBytes);
    RawTcpSeconds(data);
    // Seconds for one library upload of `data`.
    auto upload_seconds = [&] {
      return Seconds([&] {
        return session->Upload(buffer->handle(), 0, data.at(0), kTransferBytes);
      });
    };
    std::vector<double> upload, tcp;
    for (int r = 0; r < 5; ++r) {
      tcp.push_back(RawTcpSeconds(data));
      upload.push_back(upload_seconds());
    }
    // The same uploads back to back, as the benchmarks run them.
    std::vector<double> back_to_back;
    for (int r = 0; r < 5; ++r) back_to_back.push_back(upload_seconds());
    const double up = kTransferBytes / Median(upload) / 1e9;
    const double up_b2b = kTransferBytes / Median(back_to_back) / 1e9;
    const double raw = kTransferBytes / Median(tcp) / 1e9;
    std::printf(
        "| %llu | %.2f | %.2f | %.2f | %.2f | %+.1f MiB (%.1f chunks) |\n",
        static_cast<unsigned long long>(curve_windows[i]), up, raw, up / raw,
        up_b2b, growth / 1024.0 - 1024.0,
        (growth / 1024.0 - 1024.0) / (kChunk >> 20));
    std::fflush(stdout);
  }
}

// A transfer that --paired times next to raw TCP.
struct PairedCase {
  const char* name;
  std::function<absl::Status()> run;
  std::vector<double> seconds, ratio;
};

// The C API's side of --paired: aclInit against the benchmark's opserver
// (the C API reads its environment there), one 256 MiB device buffer.
void* CApiBuffer() {
  setenv("OPSERVER_ADDRESS", absl::StrCat("127.0.0.1:", opserver_port).c_str(),
         1);
  setenv("OPSERVER_DATA_PATH", grpc_transfers ? "0" : "1", 1);
  if (transfer_connections > 0) {
    setenv("OPSERVER_TRANSFER_CONNECTIONS",
           std::to_string(transfer_connections).c_str(), 1);
  }
  void* device = nullptr;
  if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS ||
      aclrtMalloc(&device, kTransferBytes, ACL_MEM_MALLOC_HUGE_FIRST) !=
          ACL_SUCCESS) {
    std::fprintf(stderr, "C API: %s\n", aclGetRecentErrMsg());
    std::abort();
  }
  return device;
}

absl::Status AclStatus(aclError error) {
  return error == ACL_SUCCESS ? absl::OkStatus()
                              : absl::InternalError(aclGetRecentErrMsg());
}

// --paired=N: N rounds of {raw TCP, transfer} for each transfer: library
// upload and download, then the same through aclrtMemcpy; 256 MiB each from
// warm memory into resident memory. Each transfer is divided by the raw TCP
// transfer just before it, so both see the same neighbours: on a shared VM
// the speed of the machine drifts by more than the differences measured,
// and benchmarks run one after another (all TCP repetitions, then all
// uploads) turn that drift into the ratio.
void PairedRatios(int rounds) {
  std::unique_ptr<Client> client;
  auto session = LibrarySession(opserver_port, &client);
  if (session == nullptr) std::abort();
  SourceData data(kWarm);
  std::vector<char> back(kTransferBytes, 'b');  // Resident, as `data` is.
  auto buffer = session->Malloc(kTransferBytes);
  if (!buffer.ok()) std::abort();
  void* device = CApiBuffer();
  PairedCase cases[] = {
      {"library upload",
       [&] {
         return session->Upload(buffer->handle(), 0, data.at(0),
                                kTransferBytes);
       }},
      {"library download",
       [&] {
         return session->Download(buffer->handle(), 0, back.data(),
                                  kTransferBytes);
       }},
      {"aclrtMemcpy host->device",
       [&] {
         return AclStatus(aclrtMemcpy(device, kTransferBytes, data.at(0),
                                      kTransferBytes,
                                      ACL_MEMCPY_HOST_TO_DEVICE));
       }},
      {"aclrtMemcpy device->host",
       [&] {
         return AclStatus(aclrtMemcpy(back.data(), kTransferBytes, device,
                                      kTransferBytes,
                                      ACL_MEMCPY_DEVICE_TO_HOST));
       }},
  };
  RawTcpSeconds(data);  // Warm everything (see Source).
  for (PairedCase& c : cases) Seconds(c.run);
  std::vector<double> tcp;
  for (int r = 0; r < rounds; ++r) {
    for (PairedCase& c : cases) {
      const double t = RawTcpSeconds(data);
      const double s = Seconds(c.run);
      tcp.push_back(t);
      c.seconds.push_back(s);
      c.ratio.push_back(t / s);
    }
  }
  auto gbps = [](double s) { return kTransferBytes / s / 1e9; };
  std::printf(
      "%d rounds, 256 MiB each, warm source, resident destination%s%s\n"
      "raw TCP one-way: %.2f GB/s (median)\n",
      rounds, pin_cores ? ", pinned" : "",
      grpc_transfers ? ", through gRPC" : "", gbps(Median(tcp)));
  for (PairedCase& c : cases) {
    std::sort(c.ratio.begin(), c.ratio.end());
    // Quartiles: the middle half of the rounds.
    std::printf(
        "%-25s %.2f GB/s, %.2f of the raw TCP just before (median; "
        "quartiles %.2f-%.2f)\n",
        (std::string(c.name) + ":").c_str(), gbps(Median(c.seconds)),
        Median(c.ratio), c.ratio[c.ratio.size() / 4],
        c.ratio[(3 * c.ratio.size()) / 4]);
  }
  aclrtFree(device);
  aclrtResetDevice(0);
  aclFinalize();
}

// --chain: per round, raw TCP next to each transfer (library upload and
// download of 256 MiB, as in PairedRatios) against the backend (CPU
// device) directly and against the front (Ascend device over the chain),
// then each operator's cost unpipelined (GetWorkspaceSize + Execute +
// Synchronize on 1024 fp32 elements through the client library, median of
// 200) on both, and the backend's idle SynchronizeStream round trip. The
// backend's /metrics give the calls the front made it answer.
void ChainRatios(const std::string& spec, int rounds) {
  absl::StatusOr<std::unique_ptr<bench::Chain>> chain =
      bench::Chain::Start(spec);
  if (!chain.ok()) {
    std::fprintf(stderr, "--chain: %s\n", chain.status().ToString().c_str());
    std::exit(1);
  }
  struct Side {
    const char* name;
    std::string address;
    std::unique_ptr<Client> client;
    std::unique_ptr<remote::Session> session;
    std::optional<remote::DeviceBuffer> buffer;
  };
  Side sides[2] = {{"cpu", (*chain)->backend()}, {"ascend", (*chain)->front()}};
  for (Side& side : sides) {
    remote::ConnectOptions options;
    options.data_path = !grpc_transfers;
    if (transfer_connections > 0) {
      options.transfer_connections = transfer_connections;
    }
    auto connected = Client::Connect(side.address, options);
    if (!connected.ok()) std::abort();
    side.client = *std::move(connected);
    auto session = side.client->CreateSession("remote_bench --chain");
    if (!session.ok()) std::abort();
    side.session = *std::move(session);
    auto buffer = side.session->Malloc(kTransferBytes);
    if (!buffer.ok()) {
      std::fprintf(stderr, "Malloc on %s: %s\n", side.name,
                   buffer.status().ToString().c_str());
      std::abort();
    }
    side.buffer = *std::move(buffer);
  }
  SourceData data(kWarm);
  std::vector<char> back(kTransferBytes, 'b');
  auto upload = [&](Side& side) {
    return side.session->Upload(side.buffer->handle(), 0, data.at(0),
                                kTransferBytes);
  };
  auto download = [&](Side& side) {
    return side.session->Download(side.buffer->handle(), 0, back.data(),
                                  kTransferBytes);
  };
  RawTcpSeconds(data);  // Warm everything (see Source).
  for (Side& side : sides) {
    Seconds([&] { return upload(side); });
    Seconds([&] { return download(side); });
  }
  // [side][0 upload, 1 download]: seconds and ratio to the TCP just before.
  std::vector<double> seconds[2][2], ratio[2][2], tcp;
  bench::BackendCounts front_calls[2];
  for (int r = 0; r < rounds; ++r) {
    for (int kind = 0; kind < 2; ++kind) {
      for (int s = 0; s < 2; ++s) {
        const double t = RawTcpSeconds(data);
        const bench::BackendCounts before =
            bench::ScrapeCounts((*chain)->backend_metrics());
        const double x = Seconds(
            [&] { return kind == 0 ? upload(sides[s]) : download(sides[s]); });
        if (s == 1) {
          const bench::BackendCounts d =
              bench::ScrapeCounts((*chain)->backend_metrics()) - before;
          front_calls[kind].fences += d.fences;
          front_calls[kind].unary_calls += d.unary_calls;
        }
        tcp.push_back(t);
        seconds[s][kind].push_back(x);
        ratio[s][kind].push_back(t / x);
      }
    }
  }
  auto gbps = [](double s) { return kTransferBytes / s / 1e9; };
  auto quartiles = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return absl::StrFormat("%.2f (quartiles %.2f-%.2f)", v[v.size() / 2],
                           v[v.size() / 4], v[(3 * v.size()) / 4]);
  };
  std::printf(
      "remote_bench --chain: backend (CPU device) %s, front (Ascend device "
      "over libaclnn_remote.so) %s; %d rounds, 256 MiB each, warm source, "
      "resident destination%s%s\nraw TCP one-way: %.2f GB/s (median)\n",
      (*chain)->backend().c_str(), (*chain)->front().c_str(), rounds,
      pin_cores ? ", pinned" : "", grpc_transfers ? ", through gRPC" : "",
      gbps(Median(tcp)));
  for (int kind = 0; kind < 2; ++kind) {
    const char* what = kind == 0 ? "upload" : "download";
    std::vector<double> vs_cpu;
    for (int r = 0; r < rounds; ++r) {
      vs_cpu.push_back(seconds[0][kind][r] / seconds[1][kind][r]);
    }
    for (int s = 0; s < 2; ++s) {
      std::printf("%-8s %-7s %.2f GB/s, of the raw TCP just before: %s\n", what,
                  sides[s].name, gbps(Median(seconds[s][kind])),
                  quartiles(ratio[s][kind]).c_str());
    }
    std::printf(
        "%-8s ascend / cpu (same round): %s; backend calls per %s through "
        "the front: %.1f fences + %.1f unary\n",
        what, quartiles(vs_cpu).c_str(), what,
        front_calls[kind].fences / rounds,
        front_calls[kind].unary_calls / rounds);
  }
  std::fflush(stdout);

  // Each operator unpipelined, 1024 fp32 elements, on both.
  constexpr int64_t kElements = 1024;
  constexpr int kWarmup = 20, kCalls = 200;
  std::vector<double> rtt;
  {
    // The backend's idle synchronize, from a session of its own.
    Side& cpu = sides[0];
    for (int i = 0; i < kWarmup; ++i) (void)cpu.session->Synchronize();
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> calls;
      for (int i = 0; i < kCalls; ++i) {
        calls.push_back(Seconds([&] { return cpu.session->Synchronize(); }));
      }
      rtt.push_back(Median(calls) * 1e6);
    }
  }
  std::printf(
      "\nbackend idle SynchronizeStream (median per round): %s us\n"
      "%-20s %12s %12s %12s %16s %s\n",
      quartiles(rtt).c_str(), "operator", "CPU us", "Ascend us", "added us",
      "added backend RT", "backend waits/op");
  for (const kernels::OpInfo& op : kernels::OpRegistry()) {
    v1::OpParams params;
    params.set_threshold(0.5);
    params.set_lambd(0.5);
    params.mutable_negative_slope()->set_dtype(v1::DataType(0));
    params.mutable_negative_slope()->set_value(0.01);
    params.set_scale(2.0);
    std::vector<double> us[2];
    double waits = 0;
    for (int s = 0; s < 2; ++s) {
      remote::Session& session = *sides[s].session;
      std::map<std::string, remote::TensorDesc> tensors;
      std::vector<remote::DeviceBuffer> buffers;
      for (int t = 0; t < 3; ++t) {
        const bool mask = op.bit_mask_input && t == 1;
        const int64_t n = mask ? (kElements + 127) / 128 * 128 / 8 : kElements;
        auto buffer = session.Malloc(n * 4);
        if (!buffer.ok()) std::abort();
        tensors[std::string(op.tensors[t].name)] =
            remote::TensorDesc::Contiguous(
                buffer->handle(),
                mask ? kernels::DType::kUint8 : kernels::DType::kFloat, {n});
        buffers.push_back(*std::move(buffer));
      }
      auto call = [&]() -> absl::Status {
        auto executor =
            session.GetWorkspaceSize(std::string(op.name), params, tensors);
        if (!executor.ok()) return executor.status();
        RETURN_IF_ERROR(executor->Execute());
        return session.Synchronize();
      };
      for (int i = 0; i < kWarmup; ++i) {
        if (absl::Status e = call(); !e.ok()) {
          std::fprintf(stderr, "%s on %s: %s\n", std::string(op.name).c_str(),
                       sides[s].name, e.ToString().c_str());
          std::abort();
        }
      }
      for (int r = 0; r < rounds; ++r) {
        const bench::BackendCounts before =
            s == 1 ? bench::ScrapeCounts((*chain)->backend_metrics())
                   : bench::BackendCounts();
        std::vector<double> calls;
        for (int i = 0; i < kCalls; ++i) calls.push_back(Seconds(call));
        if (s == 1) {
          waits += (bench::ScrapeCounts((*chain)->backend_metrics()) - before)
                       .Waits();
        }
        us[s].push_back(Median(calls) * 1e6);
      }
    }
    std::vector<double> added, added_rt;
    for (int r = 0; r < rounds; ++r) {
      added.push_back(us[1][r] - us[0][r]);
      added_rt.push_back((us[1][r] - us[0][r]) / rtt[r]);
    }
    std::printf("%-20s %12.1f %12.1f %12.1f %16.2f %.2f\n",
                std::string(op.name).c_str(), Median(us[0]), Median(us[1]),
                Median(added), Median(added_rt),
                waits / (static_cast<double>(rounds) * kCalls));
  }
  std::printf(
      "\nTransfers: GB/s of the median round; \"of the raw TCP just "
      "before\": each transfer divided by the raw TCP transfer run right "
      "before it (median and quartiles over the rounds); ascend / cpu: the "
      "front's time over the backend's, same round. Operators: median of "
      "%d GetWorkspaceSize + Execute + Synchronize calls per round (median "
      "over %d rounds), added = Ascend - CPU, in microseconds and in the "
      "backend's idle SynchronizeStream round trips of the same round; "
      "backend waits/op = fences + unary calls the backend answered per "
      "call on the front.\n",
      kCalls, rounds);
  std::fflush(stdout);
  for (Side& side : sides) {
    side.buffer.reset();
    side.session.reset();
    side.client.reset();
  }
}

// Removes the first argument that is `flag` or starts with it (a flag that
// ends in '=') from argv; returns what follows the prefix, or nullopt.
std::optional<std::string> TakeFlag(int* argc, char** argv,
                                    const std::string& flag) {
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    const bool match =
        flag.back() == '=' ? arg.rfind(flag, 0) == 0 : arg == flag;
    if (!match) continue;
    for (int j = i; j + 1 < *argc; ++j) argv[j] = argv[j + 1];
    --*argc;
    return arg.substr(flag.size());
  }
  return std::nullopt;
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  using namespace opserver;
  // The client side gets the same malloc tuning the server applies.
  TuneMallocForStreaming();
  // Our flags, removed before Google Benchmark sees argv.
  // --window_curve=LIST: print the window curve instead of running the
  // benchmarks.
  if (std::optional<std::string> list =
          TakeFlag(&argc, argv, "--window_curve=")) {
    for (size_t at = 0; at <= list->size();) {
      size_t comma = list->find(',', at);
      if (comma == std::string::npos) comma = list->size();
      curve_windows.push_back(std::stoull(list->substr(at, comma - at)));
      at = comma + 1;
    }
  }
  if (std::optional<std::string> window =
          TakeFlag(&argc, argv, "--echo_window=")) {
    echo_window = std::stoll(*window);
  }
  int paired_rounds = 0;
  if (std::optional<std::string> rounds = TakeFlag(&argc, argv, "--paired=")) {
    paired_rounds = std::stoi(*rounds);
  }
  if (std::optional<std::string> k =
          TakeFlag(&argc, argv, "--transfer_connections=")) {
    transfer_connections = std::stoi(*k);
  }
  std::optional<std::string> chain = TakeFlag(&argc, argv, "--chain=");
  pin_cores = TakeFlag(&argc, argv, "--pin").has_value();
  grpc_transfers = TakeFlag(&argc, argv, "--grpc_transfers").has_value();
  if (pin_cores && sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    std::fprintf(stderr, "remote_bench --pin: needs two CPUs\n");
    return 1;
  }
  for (uint64_t window : curve_windows) {
    const int port = Fork([window](int report) {
      RunOpserverWithWindow(report, static_cast<int64_t>(window));
    });
    curve_servers.emplace_back(children.back(), port);
  }
  // Fork the servers before this process touches gRPC.
  opserver_port = Fork(RunOpserver);
  pid_t rss_pid = 0;
  int rss_port = Fork(RunOpserver);
  rss_pid = children.back();
  tcp_ports[kDestChunk] =
      Fork([](int report) { RunTcpSink(report, kDestChunk); });
  tcp_ports[kDestWhole] =
      Fork([](int report) { RunTcpSink(report, kDestWhole); });
  echo_port = Fork(RunEcho);
  // After the forks: the children pin themselves to CPU 1.
  if (pin_cores) PinToCpu(0);

  if (chain.has_value()) {
    ChainRatios(*chain, paired_rounds > 0 ? paired_rounds : 5);
  } else if (!curve_windows.empty()) {
    WindowCurve();
  } else if (paired_rounds > 0) {
    PairedRatios(paired_rounds);
  } else {
    MeasureServerRss(rss_pid, rss_port);
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  for (pid_t pid : children) kill(pid, SIGKILL);
  for (pid_t pid : children) waitpid(pid, nullptr, 0);
  return 0;
}
