#include "client/opctl_bench.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/loopback_tcp.h"
#include "common/listen_address.h"
#include "common/status_macros.h"
#include "kernels/dtype.h"

namespace opserver::remote::opctl {
namespace {

using kernels::DType;

constexpr char kBenchUsage[] =
    "Usage: opctl [--server=..] bench [--bytes=N] [--iterations=N] "
    "[--elements=N] [--device=N]\n"
    "Measures upload and download throughput of --bytes (default 67108864)\n"
    "next to a raw TCP one-way stream over this host's loopback (the\n"
    "path's limit when the server is on loopback too),\n"
    "and the latency of each operator the server offers (GetWorkspaceSize\n"
    "+ Execute + SynchronizeStream, parameters at their defaults) on\n"
    "tensors of --elements (default 1024) elements, FLOAT where allowed,\n"
    "over --iterations runs (default 20; median and minimum),\n"
    "then a backward step of 250 dependent operators with one synchronize,\n"
    "pipelined and with unary calls, in microseconds per operator and in\n"
    "round trips (a synchronize of an idle stream, measured alongside),\n"
    "all on the server's device --device (default 0).";

// A backward step as a training job issues it: 250 dependent operators
// (plan + launch each), one synchronize, pipelined and with unary calls,
// against the round trip of the same connection (a synchronize of an idle
// stream).
int BenchStep(const Connector& connect, int64_t n, uint32_t device) {
  constexpr int kOps = 250;
  constexpr int kSteps = 5;
  std::printf(
      "\nbackward step: %d dependent ThresholdBackward on %lld "
      "FLOAT elements, one synchronize (median of %d)\n",
      kOps, static_cast<long long>(n), kSteps);
  std::printf("%-10s %12s %14s %16s\n", "path", "us per op", "round trip us",
              "round trips/op");
  for (bool pipeline : {true, false}) {
    auto connected = connect(pipeline, device);
    if (!connected.ok()) return Fail(connected.status().message());
    auto session = connected->client->CreateSession("opctl bench step", true,
                                                    connected->device);
    if (!session.ok()) return FailStatus(session.status());
    Session& s = **session;
    std::vector<float> ones(n, 1.0f);
    auto a = s.Malloc(n * 4);
    auto b = s.Malloc(n * 4);
    if (!a.ok() || !b.ok())
      return FailStatus(!a.ok() ? a.status() : b.status());
    for (auto* buffer : {&a, &b}) {
      absl::Status up = s.Upload((*buffer)->handle(), 0, ones.data(), n * 4);
      if (!up.ok()) return FailStatus(up);
    }
    const TensorDesc ta =
        TensorDesc::Contiguous(a->handle(), DType::kFloat, {n});
    const TensorDesc tb =
        TensorDesc::Contiguous(b->handle(), DType::kFloat, {n});
    std::vector<double> rtt;
    for (int i = 0; i < 50; ++i) {
      const absl::Time start = absl::Now();
      if (absl::Status st = s.Synchronize(); !st.ok()) return FailStatus(st);
      rtt.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::vector<double> per_op;
    for (int step = 0; step < kSteps; ++step) {
      const absl::Time start = absl::Now();
      for (int i = 0; i < kOps; ++i) {
        // a -> b -> a: each reads the previous one's output.
        auto executor = i % 2 == 0 ? s.ThresholdBackward(ta, ta, 0.5, tb)
                                   : s.ThresholdBackward(tb, tb, 0.5, ta);
        if (!executor.ok()) return FailStatus(executor.status());
        if (absl::Status st = executor->Execute(); !st.ok()) {
          return FailStatus(st);
        }
      }
      if (absl::Status st = s.Synchronize(); !st.ok()) return FailStatus(st);
      per_op.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / kOps);
    }
    std::sort(rtt.begin(), rtt.end());
    std::sort(per_op.begin(), per_op.end());
    const double round_trip = rtt[rtt.size() / 2];
    const double op = per_op[per_op.size() / 2];
    std::printf(
        "%-10s %12.1f %14.1f %16.2f%s\n", pipeline ? "pipelined" : "unary", op,
        round_trip, op / round_trip,
        pipeline && !s.pipelined() ? "  (server has no Pipeline: unary)" : "");
  }
  return 0;
}

// One operator's call as bench makes it, with the buffers it names.
struct BenchCall {
  v1::OpParams params;
  std::map<std::string, TensorDesc> descs;
  std::vector<DeviceBuffer> buffers;
};

// `op` on `n` elements: FLOAT tensors where the argument allows FLOAT (else
// its first dtype), every parameter at the server's default. An input that
// can only be UINT8 is taken for a bit mask of one bit per element, sized
// as aclnn's dropout mask is (align(n, 128) / 8 bytes), since nothing on the
// wire gives an input's size rule. Fails, saying why, when the call is not
// one the operator's checks accept.
absl::StatusOr<BenchCall> PrepareBenchCall(Session& s, const OpSignature& op,
                                           int64_t n) {
  BenchCall call;
  for (const ParamSignature& p : op.params) {
    if (!p.default_value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.name, " has no default"));
    }
    SetParam(p, *p.default_value, p.default_dtype(), &call.params);
  }
  auto pick = [](const TensorSignature& t) {
    return std::find(t.dtypes.begin(), t.dtypes.end(), DType::kFloat) !=
                   t.dtypes.end()
               ? DType::kFloat
               : t.dtypes.front();
  };
  std::map<std::string, ArgShape> shapes;
  for (const TensorSignature& t : op.inputs) {
    ArgShape arg{pick(t), {n}};
    if (t.dtypes == std::vector<DType>{DType::kUint8}) {
      arg.shape = {(n + 127) / 128 * 16};
    }
    shapes[t.name] = arg;
  }
  const DType out_dtype = pick(op.output);
  ASSIGN_OR_RETURN(std::vector<int64_t> out_shape,
                   OutputShape(op, call.params, shapes, out_dtype));
  shapes[op.output.name] = ArgShape{out_dtype, out_shape};
  for (const auto& [name, arg] : shapes) {
    int64_t numel = 1, bytes = 0;
    for (int64_t d : arg.shape) numel *= d;  // [n] or the mask's [<= n].
    if (__builtin_mul_overflow(numel, kernels::DTypeSize(arg.dtype), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " of ", numel, " elements is too large"));
    }
    ASSIGN_OR_RETURN(DeviceBuffer buffer, s.Malloc(bytes));
    if (name != op.output.name) {
      // Ones for FLOAT, 0x55 bytes otherwise (every other element of a mask).
      std::string host(bytes, '\x55');
      if (arg.dtype == DType::kFloat) {
        const float one = 1.0f;
        for (int64_t i = 0; i < numel; ++i) {
          std::memcpy(&host[i * sizeof(float)], &one, sizeof(float));
        }
      }
      RETURN_IF_ERROR(s.Upload(buffer.handle(), 0, host.data(), bytes));
    }
    call.descs[name] =
        TensorDesc::Contiguous(buffer.handle(), arg.dtype, arg.shape);
    call.buffers.push_back(std::move(buffer));
  }
  return call;
}

// bench's own arguments, checked.
struct BenchArgs {
  int64_t bytes = 64 << 20;
  int64_t iterations = 20;
  int64_t elements = 1024;
  uint32_t device = 0;
};

absl::StatusOr<BenchArgs> ParseBenchArgs(const std::vector<std::string>& raw) {
  ASSIGN_OR_RETURN(CommandArgs args, ParseCommandArgs(raw));
  if (!args.positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench: unexpected argument '", args.positional[0], "'"));
  }
  BenchArgs bench;
  int64_t* sizes[3] = {&bench.bytes, &bench.iterations, &bench.elements};
  const char* names[3] = {"bytes", "iterations", "elements"};
  for (int i = 0; i < 3; ++i) {
    if (const std::string* v = args.Get(names[i])) {
      if (!absl::SimpleAtoi(*v, sizes[i]) || *sizes[i] <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "bench: --", names[i], "=", *v, " must be a positive integer"));
      }
    }
  }
  ASSIGN_OR_RETURN(bench.device, DeviceArg(args, "bench"));
  for (const auto& [name, used] : args.used) args.flags.erase(name);
  if (!args.flags.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench: unknown argument --", args.flags.begin()->first,
                     " (try opctl bench --help)"));
  }
  return bench;
}

// Upload and download of `bytes`, best of up to 5 runs each, next to a raw
// TCP one-way stream over this host's loopback.
int BenchTransfers(Client& client, Session& s, int64_t bytes,
                   int64_t iterations) {
  std::vector<char> host(bytes, 1);
  auto buffer = s.Malloc(bytes);
  if (!buffer.ok()) return FailStatus(buffer.status());
  std::vector<double> up, down, tcp;
  for (int64_t i = 0; i < std::min<int64_t>(iterations, 5); ++i) {
    // The reference, interleaved with the transfers so both see the same
    // load on this host.
    absl::StatusOr<double> tcp_seconds = LoopbackTcpOneWaySeconds(bytes);
    if (!tcp_seconds.ok()) return FailStatus(tcp_seconds.status());
    tcp.push_back(*tcp_seconds);
    absl::Time start = absl::Now();
    absl::Status status = s.Upload(buffer->handle(), 0, host.data(), bytes);
    if (!status.ok()) return FailStatus(status);
    up.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    start = absl::Now();
    status = s.Download(buffer->handle(), 0, host.data(), bytes);
    if (!status.ok()) return FailStatus(status);
    down.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(up.begin(), up.end());
  std::sort(down.begin(), down.end());
  std::sort(tcp.begin(), tcp.end());
  std::printf("server %s, %lld bytes per transfer\n", client.address().c_str(),
              static_cast<long long>(bytes));
  // opctl cannot run a TCP sink on the server's host, so the reference is
  // this host's loopback: the path's limit only for a loopback server.
  absl::StatusOr<ListenAddress> address = ParseListenAddress(client.address());
  const bool loopback = address.ok() && IsLoopback(*address);
  const double tcp_gbs = bytes / tcp[0] / 1e9;
  std::printf(
      "raw TCP:  %8.3f GB/s (best of %zu, one-way over this host's "
      "loopback, same run)\n",
      tcp_gbs, tcp.size());
  std::printf("upload:   %8.3f GB/s (best of %zu)  %.2f of raw TCP\n",
              bytes / up[0] / 1e9, up.size(), bytes / up[0] / 1e9 / tcp_gbs);
  std::printf("download: %8.3f GB/s (best of %zu)  %.2f of raw TCP\n",
              bytes / down[0] / 1e9, down.size(),
              bytes / down[0] / 1e9 / tcp_gbs);
  if (!loopback) {
    std::printf(
        "(the server is not on loopback: raw TCP is this host's own ceiling, "
        "not the network's; measure the network with a tool on both ends, "
        "e.g. iperf3)\n");
  }
  buffer->Free().IgnoreError();
  return 0;
}

// Plan + launch + synchronize of each operator the server offers, on `n`
// elements, over `iterations` runs: median and minimum.
int BenchOperators(Client& client, Session& s, int64_t n, int64_t iterations) {
  absl::StatusOr<OpCatalog> catalog = FetchCatalog(client);
  if (!catalog.ok()) return FailStatus(catalog.status(), "bench: ");
  std::printf("%-20s %12s %12s  (%lld FLOAT elements, %lld runs)\n", "operator",
              "median us", "min us", static_cast<long long>(n),
              static_cast<long long>(iterations));
  for (const OpSignature& op : catalog->ops) {
    absl::StatusOr<BenchCall> call = PrepareBenchCall(s, op, n);
    if (!call.ok()) {
      std::printf("%-20s skipped: %s\n", op.name.c_str(),
                  std::string(call.status().message()).c_str());
      continue;
    }
    std::vector<double> times;
    for (int64_t i = 0; i < iterations; ++i) {
      const absl::Time start = absl::Now();
      absl::StatusOr<Executor> executor =
          s.GetWorkspaceSize(op.name, call->params, call->descs);
      if (!executor.ok()) return FailStatus(executor.status());
      absl::Status status = executor->Execute();
      if (status.ok()) status = s.Synchronize();
      if (!status.ok()) return FailStatus(status);
      times.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    }
    std::sort(times.begin(), times.end());
    std::printf("%-20s %12.1f %12.1f\n", op.name.c_str(),
                times[times.size() / 2], times[0]);
  }
  for (const std::string& why : catalog->rejected) {
    std::printf("skipped: %s\n", why.c_str());
  }
  return 0;
}

}  // namespace

int BenchHelp() {
  std::printf("%s\n", kBenchUsage);
  return 0;
}

int Bench(const Connector& connect, const std::vector<std::string>& raw) {
  if (WantsHelp(raw)) return BenchHelp();
  absl::StatusOr<BenchArgs> args = ParseBenchArgs(raw);
  if (!args.ok()) return Fail(args.status().message());
  auto connected = connect(true, args->device);
  if (!connected.ok()) return Fail(connected.status().message());
  Client& client = *connected->client;
  auto session = client.CreateSession("opctl bench", true, connected->device);
  if (!session.ok()) return FailStatus(session.status());
  if (int failed =
          BenchTransfers(client, **session, args->bytes, args->iterations);
      failed != 0) {
    return failed;
  }
  if (int failed =
          BenchOperators(client, **session, args->elements, args->iterations);
      failed != 0) {
    return failed;
  }
  return BenchStep(connect, args->elements, args->device);
}

}  // namespace opserver::remote::opctl
