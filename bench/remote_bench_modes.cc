#include "bench/remote_bench_modes.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "acl/acl.h"
#include "bench/chain.h"
#include "bench/remote_bench_support.h"
#include "client/client.h"
#include "common/status_macros.h"
#include "kernels/validate.h"

namespace opserver::remote_bench {
namespace {

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

// One end of the chain as --chain measures it.
struct ChainSide {
  const char* name;
  std::string address;
  std::unique_ptr<Client> client;
  std::unique_ptr<remote::Session> session;
  std::optional<remote::DeviceBuffer> buffer;
};

// Connects to `side` with the flags' transfer options and allocates its
// 256 MiB buffer; aborts when it cannot.
void ConnectSide(ChainSide& side) {
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

double Gbps(double seconds) { return kTransferBytes / seconds / 1e9; }

std::string Quartiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return absl::StrFormat("%.2f (quartiles %.2f-%.2f)", v[v.size() / 2],
                         v[v.size() / 4], v[(3 * v.size()) / 4]);
}

// --chain's transfers: per round, raw TCP and the raw TCP relay (two legs,
// as through the front: the machine's limit for it) next to each library
// upload and download of 256 MiB on each side; prints them with the
// backend calls the front made per transfer.
void ChainTransfers(bench::Chain& chain, ChainSide (&sides)[2], int rounds) {
  SourceData data(kWarm);
  std::vector<char> back(kTransferBytes, 'b');
  auto upload = [&](ChainSide& side) {
    return side.session->Upload(side.buffer->handle(), 0, data.at(0),
                                kTransferBytes);
  };
  auto download = [&](ChainSide& side) {
    return side.session->Download(side.buffer->handle(), 0, back.data(),
                                  kTransferBytes);
  };
  RawTcpSeconds(data);  // Warm everything (see Source).
  RawTcpSeconds(data, tcp_relay_port);
  for (ChainSide& side : sides) {
    Seconds([&] { return upload(side); });
    Seconds([&] { return download(side); });
  }
  // [side][0 upload, 1 download]: seconds and ratio to the TCP just before;
  // relay[kind]: the relay's seconds just before the front's transfer.
  std::vector<double> seconds[2][2], ratio[2][2], relay[2], tcp;
  bench::BackendCounts front_calls[2];
  for (int r = 0; r < rounds; ++r) {
    for (int kind = 0; kind < 2; ++kind) {
      for (int s = 0; s < 2; ++s) {
        const double t = RawTcpSeconds(data);
        if (s == 1) relay[kind].push_back(RawTcpSeconds(data, tcp_relay_port));
        const bench::BackendCounts before =
            bench::ScrapeCounts(chain.backend_metrics());
        const double x = Seconds(
            [&] { return kind == 0 ? upload(sides[s]) : download(sides[s]); });
        if (s == 1) {
          const bench::BackendCounts d =
              bench::ScrapeCounts(chain.backend_metrics()) - before;
          front_calls[kind].fences += d.fences;
          front_calls[kind].unary_calls += d.unary_calls;
        }
        tcp.push_back(t);
        seconds[s][kind].push_back(x);
        ratio[s][kind].push_back(t / x);
      }
    }
  }
  std::vector<double> all_relay = relay[0];
  all_relay.insert(all_relay.end(), relay[1].begin(), relay[1].end());
  // The front's CANN, by its file name (npos + 1 is 0: no directory).
  const std::string& path = chain.cann_library();
  const std::string cann = path.substr(path.rfind('/') + 1);
  std::printf(
      "remote_bench --chain: backend (CPU device) %s, front (Ascend device "
      "over %s) %s; %d rounds, 256 MiB each, warm source, "
      "resident destination%s%s\nraw TCP one-way: %.2f GB/s (median); raw "
      "TCP through a relay (two legs, as through the front): %.2f GB/s\n",
      chain.backend().c_str(), cann.c_str(), chain.front().c_str(), rounds,
      pin_cores ? ", pinned" : "", grpc_transfers ? ", through gRPC" : "",
      Gbps(Median(tcp)), Gbps(Median(all_relay)));
  for (int kind = 0; kind < 2; ++kind) {
    const char* what = kind == 0 ? "upload" : "download";
    std::vector<double> vs_cpu, vs_relay, relay_vs_cpu;
    for (int r = 0; r < rounds; ++r) {
      vs_cpu.push_back(seconds[0][kind][r] / seconds[1][kind][r]);
      vs_relay.push_back(relay[kind][r] / seconds[1][kind][r]);
      relay_vs_cpu.push_back(seconds[0][kind][r] / relay[kind][r]);
    }
    for (int s = 0; s < 2; ++s) {
      std::printf("%-8s %-7s %.2f GB/s, of the raw TCP just before: %s\n", what,
                  sides[s].name, Gbps(Median(seconds[s][kind])),
                  Quartiles(ratio[s][kind]).c_str());
    }
    std::printf(
        "%-8s ascend / cpu (same round): %s; ascend / relay: %s; relay / "
        "cpu: %s; backend calls per %s through the front: %.1f fences + "
        "%.1f unary\n",
        what, Quartiles(vs_cpu).c_str(), Quartiles(vs_relay).c_str(),
        Quartiles(relay_vs_cpu).c_str(), what,
        front_calls[kind].fences / rounds,
        front_calls[kind].unary_calls / rounds);
  }
  std::fflush(stdout);
}

// Each operator unpipelined, on 1024 fp32 elements, on both sides.
constexpr int64_t kChainElements = 1024;
constexpr int kChainWarmup = 20, kChainCalls = 200;

// The backend's idle SynchronizeStream round trip from `session` (a
// session of its own), median per round, in microseconds.
std::vector<double> IdleRoundTrips(remote::Session& session, int rounds) {
  std::vector<double> rtt;
  for (int i = 0; i < kChainWarmup; ++i) (void)session.Synchronize();
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> calls;
    for (int i = 0; i < kChainCalls; ++i) {
      calls.push_back(Seconds([&] { return session.Synchronize(); }));
    }
    rtt.push_back(Median(calls) * 1e6);
  }
  return rtt;
}

// `op`'s three tensors of kChainElements (its bit mask packed) in new
// buffers of `session`, which `buffers` keeps.
std::map<std::string, remote::TensorDesc> OperatorTensors(
    remote::Session& session, const kernels::OpInfo& op,
    std::vector<remote::DeviceBuffer>* buffers) {
  std::map<std::string, remote::TensorDesc> tensors;
  for (int t = 0; t < 3; ++t) {
    const bool mask = op.bit_mask_input && t == 1;
    const int64_t n =
        mask ? (kChainElements + 127) / 128 * 128 / 8 : kChainElements;
    auto buffer = session.Malloc(n * 4);
    if (!buffer.ok()) std::abort();
    tensors[std::string(op.tensors[t].name)] = remote::TensorDesc::Contiguous(
        buffer->handle(),
        mask ? kernels::DType::kUint8 : kernels::DType::kFloat, {n});
    buffers->push_back(*std::move(buffer));
  }
  return tensors;
}

// `op`'s cost on `side` (s: 0 the backend, 1 the front), median per round
// in microseconds; on the front, adds the backend's fences and unary
// calls to `waits`.
std::vector<double> OperatorMicros(bench::Chain& chain, ChainSide& side, int s,
                                   const kernels::OpInfo& op, int rounds,
                                   double* waits) {
  v1::OpParams params;
  params.set_threshold(0.5);
  params.set_lambd(0.5);
  params.mutable_negative_slope()->set_dtype(v1::DataType(0));
  params.mutable_negative_slope()->set_value(0.01);
  params.set_scale(2.0);
  remote::Session& session = *side.session;
  std::vector<remote::DeviceBuffer> buffers;
  const std::map<std::string, remote::TensorDesc> tensors =
      OperatorTensors(session, op, &buffers);
  auto call = [&]() -> absl::Status {
    auto executor =
        session.GetWorkspaceSize(std::string(op.name), params, tensors);
    if (!executor.ok()) return executor.status();
    RETURN_IF_ERROR(executor->Execute());
    return session.Synchronize();
  };
  for (int i = 0; i < kChainWarmup; ++i) {
    if (absl::Status e = call(); !e.ok()) {
      std::fprintf(stderr, "%s on %s: %s\n", std::string(op.name).c_str(),
                   side.name, e.ToString().c_str());
      std::abort();
    }
  }
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    const bench::BackendCounts before =
        s == 1 ? bench::ScrapeCounts(chain.backend_metrics())
               : bench::BackendCounts();
    std::vector<double> calls;
    for (int i = 0; i < kChainCalls; ++i) calls.push_back(Seconds(call));
    if (s == 1) {
      *waits += (bench::ScrapeCounts(chain.backend_metrics()) - before).Waits();
    }
    us.push_back(Median(calls) * 1e6);
  }
  return us;
}

// --chain's operator table: each operator on both sides, against the
// backend's idle round trip.
void ChainOperators(bench::Chain& chain, ChainSide (&sides)[2], int rounds) {
  const std::vector<double> rtt = IdleRoundTrips(*sides[0].session, rounds);
  std::printf(
      "\nbackend idle SynchronizeStream (median per round): %s us\n"
      "%-20s %12s %12s %12s %16s %s\n",
      Quartiles(rtt).c_str(), "operator", "CPU us", "Ascend us", "added us",
      "added backend RT", "backend waits/op");
  for (const kernels::OpInfo& op : kernels::OpRegistry()) {
    std::vector<double> us[2];
    double waits = 0;
    for (int s = 0; s < 2; ++s) {
      us[s] = OperatorMicros(chain, sides[s], s, op, rounds, &waits);
    }
    std::vector<double> added, added_rt;
    for (int r = 0; r < rounds; ++r) {
      added.push_back(us[1][r] - us[0][r]);
      added_rt.push_back((us[1][r] - us[0][r]) / rtt[r]);
    }
    std::printf("%-20s %12.1f %12.1f %12.1f %16.2f %.2f\n",
                std::string(op.name).c_str(), Median(us[0]), Median(us[1]),
                Median(added), Median(added_rt),
                waits / (static_cast<double>(rounds) * kChainCalls));
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
      kChainCalls, rounds);
  std::fflush(stdout);
}

}  // namespace

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
// then (`operators`) each operator's cost unpipelined (GetWorkspaceSize +
// Execute + Synchronize on 1024 fp32 elements through the client library,
// median of 200) on both, and the backend's idle SynchronizeStream round trip.
// The backend's /metrics give the calls the front made it answer.
void ChainRatios(const std::string& spec, int rounds, bool operators) {
  absl::StatusOr<std::unique_ptr<bench::Chain>> chain =
      bench::Chain::Start(spec);
  if (!chain.ok()) {
    std::fprintf(stderr, "--chain: %s\n", chain.status().ToString().c_str());
    std::exit(1);
  }
  ChainSide sides[2] = {{"cpu", (*chain)->backend()},
                        {"ascend", (*chain)->front()}};
  for (ChainSide& side : sides) ConnectSide(side);
  ChainTransfers(**chain, sides, rounds);
  if (operators) ChainOperators(**chain, sides, rounds);
  for (ChainSide& side : sides) {
    side.buffer.reset();
    side.session.reset();
    side.client.reset();
  }
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

}  // namespace opserver::remote_bench
