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
// --chain=OPSERVER,LIBACLNN_REMOTE[,FRONT_FLAG...]: instead of the
// benchmarks, the Ascend device over its verification chain (bench/chain.h)
// against its CPU backend directly, raw TCP and a raw TCP relay, in one run
// (see ChainRatios); the number of rounds is --paired's (default 5).
// LIBACLNN_REMOTE may be any CANN library: with the fake CANN
// (//devices/ascend:libfake_cann.so, whose copies are a memcpy) it measures
// what the front's staging costs by itself.
// --chain_transfers_only: --chain's transfers, not its operators (which
// the fake CANN does not compute).
//
// The parts: remote_bench_support (settings, child processes, sources and
// timing), remote_raw_session (a session on the raw stubs) and
// remote_bench_modes (the modes above run instead of the benchmarks).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/echo.grpc.pb.h"
#include "bench/remote_bench_modes.h"
#include "bench/remote_bench_support.h"
#include "bench/remote_raw_session.h"
#include "benchmark/benchmark.h"
#include "client/client.h"
#include "common/malloc_tuning.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver::remote_bench {
namespace {

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
}  // namespace opserver::remote_bench

int main(int argc, char** argv) {
  using namespace opserver::remote_bench;
  using opserver::TuneMallocForStreaming;
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
  const bool chain_operators =
      !TakeFlag(&argc, argv, "--chain_transfers_only").has_value();
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
  tcp_relay_port = Fork(
      [to = tcp_ports[kDestWhole]](int report) { RunTcpRelay(report, to); });
  echo_port = Fork(RunEcho);
  // After the forks: the children pin themselves to CPU 1.
  if (pin_cores) PinToCpu(0);

  if (chain.has_value()) {
    ChainRatios(*chain, paired_rounds > 0 ? paired_rounds : 5, chain_operators);
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
