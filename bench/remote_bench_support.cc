#include "bench/remote_bench_support.h"

#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/echo.grpc.pb.h"
#include "common/data_path.h"
#include "server/server.h"

namespace opserver::remote_bench {

int opserver_port = 0;
std::vector<uint64_t> curve_windows;
std::vector<std::pair<pid_t, int>> curve_servers;
int tcp_ports[2] = {0, 0};
int tcp_relay_port = 0;
int echo_port = 0;
int64_t echo_window = 0;
std::vector<pid_t> children;
bool pin_cores = false;
int transfer_connections = 0;
bool grpc_transfers = false;

namespace {

void SendPort(int fd, int port) {
  if (write(fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  close(fd);
}

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

// Peak RSS (VmHWM) of a process, in KiB.
uint64_t PeakRssKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

}  // namespace

void PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    std::perror("remote_bench --pin: sched_setaffinity");
    std::exit(1);
  }
}

int Fork(const std::function<void(int)>& body) {
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

void RunOpserver(int report) { RunOpserverWithWindow(report, -1); }

namespace {

// A listening socket on loopback, port chosen by the kernel, reported to
// `report`; exits the (child) process when it cannot listen.
int ListenAndReport(int report) {
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
  return listener;
}

// A blocking connection to 127.0.0.1:`port`.
absl::StatusOr<UniqueFd> ConnectLoopback(int port) {
  return ConnectTcp("127.0.0.1", port, absl::Seconds(10), absl::ZeroDuration());
}

}  // namespace

void RunTcpSink(int report, Dest dest) {
  const int listener = ListenAndReport(report);
  // Written once, so every page is resident like a populated device block.
  std::vector<char> sink(dest == kDestWhole ? kTransferBytes : kChunk, 'z');
  for (;;) {
    int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) continue;
    // Received as the data path receives (RecvFull), so the limit is
    // measured with the same wake-ups per byte.
    size_t at = 0;
    for (;;) {
      const size_t want = std::min(kChunk, sink.size() - at);
      const size_t n = RecvFull(fd, sink.data() + at, want).value_or(0);
      at = (at + n) % sink.size();
      if (n < want) break;  // The end, or a broken connection.
    }
    char ack = 1;
    if (write(fd, &ack, 1) != 1) {
      // The client went away; nothing to report to.
    }
    close(fd);
  }
}

void RunTcpRelay(int report, int to_port) {
  const int listener = ListenAndReport(report);
  // Two resident buffers, as the chain front's staging memory: one fills
  // from the client while the other drains to the sink.
  std::vector<char> buffers[2] = {std::vector<char>(kChunk, 'r'),
                                  std::vector<char>(kChunk, 'r')};
  for (;;) {
    UniqueFd in(accept(listener, nullptr, nullptr));
    if (in.get() < 0) continue;
    absl::StatusOr<UniqueFd> connected = ConnectLoopback(to_port);
    if (!connected.ok()) continue;
    const int out = connected->get();
    std::mutex mu;
    std::condition_variable cv;
    size_t filled[2] = {0, 0};  // Bytes waiting in each buffer.
    bool ended = false, broken = false;
    std::thread sender([&] {
      for (size_t k = 0;; ++k) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return filled[k % 2] > 0 || ended; });
        const size_t n = filled[k % 2];
        if (n == 0) return;
        lock.unlock();
        const bool ok = SendAll(out, buffers[k % 2].data(), n).ok();
        lock.lock();
        filled[k % 2] = 0;
        broken |= !ok;
        cv.notify_all();
        if (!ok) return;
      }
    });
    for (size_t k = 0;; ++k) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return filled[k % 2] == 0 || broken; });
        if (broken) break;
      }
      const size_t n =
          RecvFull(in.get(), buffers[k % 2].data(), kChunk).value_or(0);
      std::lock_guard<std::mutex> lock(mu);
      if (n == 0) break;
      filled[k % 2] = n;
      cv.notify_all();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ended = true;
      cv.notify_all();
    }
    sender.join();
    char ack = 0;
    shutdown(out, SHUT_WR);
    if (read(out, &ack, 1) == 1 && write(in.get(), &ack, 1) != 1) {
      // The client went away; nothing to report to.
    }
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

std::shared_ptr<grpc::Channel> Channel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials(), args);
}

bool RawTcpSend(const SourceData& data, Dest dest) {
  return RawTcpSendTo(tcp_ports[dest], data);
}

bool RawTcpSendTo(int port, const SourceData& data) {
  absl::StatusOr<UniqueFd> connected = ConnectLoopback(port);
  if (!connected.ok()) return false;
  const int fd = connected->get();
  for (size_t sent = 0; sent < kTransferBytes;) {
    ssize_t n =
        write(fd, data.at(sent), std::min(kChunk, kTransferBytes - sent));
    if (n <= 0) break;
    sent += n;
  }
  shutdown(fd, SHUT_WR);
  char ack;
  return read(fd, &ack, 1) == 1;
}

std::unique_ptr<remote::Session> LibrarySession(int port,
                                                std::unique_ptr<Client>* client,
                                                uint64_t chunk_bytes) {
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

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double RawTcpSeconds(const SourceData& data, int port) {
  return Seconds([&] {
    return RawTcpSendTo(port != 0 ? port : tcp_ports[kDestWhole], data)
               ? absl::OkStatus()
               : absl::UnavailableError("raw TCP send failed");
  });
}

}  // namespace opserver::remote_bench
