// remote_bench's shared parts (remote_bench.cc has the benchmarks and
// main, remote_bench_modes the modes run instead of them): its flags'
// settings, the child processes main() forks before any gRPC use (an
// opserver, raw TCP sinks, a bare gRPC Echo service), the source data of a
// transfer, raw TCP next to it, and the timing helpers.
#ifndef OPSERVER_BENCH_REMOTE_BENCH_SUPPORT_H_
#define OPSERVER_BENCH_REMOTE_BENCH_SUPPORT_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "benchmark/benchmark.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"

namespace opserver::remote_bench {

inline constexpr size_t kTransferBytes = 256ull << 20;
inline constexpr size_t kChunk = 4ull << 20;

// ---- Settings (main() fills them from the flags and the forks) -------------

extern int opserver_port;
// --window_curve=W1,W2,...: opservers with these --receive_window_bytes
// (0 = BDP probing), forked at start like the others.
extern std::vector<uint64_t> curve_windows;
extern std::vector<std::pair<pid_t, int>> curve_servers;
// Raw TCP sinks by destination (Dest below).
extern int tcp_ports[2];
// A raw TCP relay in front of the kDestWhole sink (RunTcpRelay).
extern int tcp_relay_port;
extern int echo_port;
// --echo_window=N: the echo sink with a fixed N-byte receive window (BDP
// probing off), as opserver's --receive_window_bytes; 0 = gRPC's defaults.
extern int64_t echo_window;
extern std::vector<pid_t> children;
// --pin (see the top of remote_bench.cc).
extern bool pin_cores;
// --transfer_connections=K: the client library's connections per large
// transfer (0: the library's default).
extern int transfer_connections;
// --grpc_transfers: the client library moves bytes through gRPC's
// Upload/Download even where the server has a data path
// (ConnectOptions::data_path = false), to compare the two.
extern bool grpc_transfers;

// ---- Child processes -------------------------------------------------------

// Keeps the calling process on `cpu` (and the threads it starts later).
void PinToCpu(int cpu);
// Runs `body(report_fd)` in a child (on CPU 1 with --pin), which writes its
// port to report_fd; returns that port. The child's pid joins `children`.
int Fork(const std::function<void(int)>& body);
// An in-process opserver on loopback with --receive_window_bytes `window`
// (-1: the production default).
void RunOpserverWithWindow(int report, int64_t window);
void RunOpserver(int report);
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
void RunTcpSink(int report, Dest dest);
// Raw TCP relay: forwards each connection to the sink at `to_port` through
// one resident 4 MiB buffer (a read, then a write of what it read), and the
// sink's one-byte answer back. Each byte crosses loopback twice and is
// copied in and out of this process, as through the Ascend chain's front:
// the machine's limit for a transfer with two legs on one host.
void RunTcpRelay(int report, int to_port);
// The bare gRPC Echo service (bench/echo.proto).
void RunEcho(int report);

// ---- Transfers -------------------------------------------------------------

std::shared_ptr<grpc::Channel> Channel(int port);

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
bool RawTcpSend(const SourceData& data, Dest dest = kDestChunk);
// The same to the raw TCP server at `port` (a sink or the relay).
bool RawTcpSendTo(int port, const SourceData& data);

// Through the client library (what aclrtMemcpy and opctl use), with
// `chunk_bytes` per Upload message (0: the library's default).
std::unique_ptr<remote::Session> LibrarySession(int port,
                                                std::unique_ptr<Client>* client,
                                                uint64_t chunk_bytes = 0);

// Uploads (then downloads) 1 GiB through the client library; returns the
// server's peak RSS growth in KiB after the upload, or 0 on failure.
uint64_t UploadPeakGrowthKiB(pid_t pid, int port, bool download);

// ---- Timing ----------------------------------------------------------------

double Median(std::vector<double> v);

// Seconds `transfer` (returning absl::Status) takes; aborts if it fails.
template <typename Transfer>
double Seconds(Transfer transfer) {
  const auto start = std::chrono::steady_clock::now();
  if (!transfer().ok()) std::abort();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Seconds for one raw TCP one-way transfer of kTransferBytes from `data`
// into a resident 256 MiB buffer (what the upload writes into); through
// the server at `port` when not 0 (tcp_relay_port: the relay in front of
// that sink).
double RawTcpSeconds(const SourceData& data, int port = 0);

}  // namespace opserver::remote_bench

#endif  // OPSERVER_BENCH_REMOTE_BENCH_SUPPORT_H_
