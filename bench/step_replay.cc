#include "bench/step_replay.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/chain.h"
#include "bench/delay_proxy.h"
#include "client/client.h"
#include "devices/device_factory.h"
#include "runtime/executor.h"
#include "runtime/session.h"
#include "server/server.h"
#include "testing/opserver_process.h"

namespace opserver::step_bench {
namespace {

// The same step through the C++ client (remote::Session), eagerly (250
// plans and launches, one synchronize) and as a graph defined once and
// replayed (one replay_graph command and one synchronize per step), in
// the same run, alternating rounds; each step's result checked against
// the host chain. Also the process's CPU time (client and server: the
// server is in-process) per replayed operator.
struct ReplayResult {
  double eager_us = 0;
  double replay_us = 0;
  double replay_cpu_us_per_op = 0;
  // The median synchronize of an idle stream: one round trip.
  double round_trip_us = 0;
  // The server process's CPU per replayed operator, when the server is a
  // child process (--replay=OPSERVER); -1 otherwise.
  double server_cpu_us_per_op = -1;
  // The server's CPU per idle synchronize (one message in, one answer
  // out, no operator): the per-step floor the replayed operators share.
  double server_cpu_us_per_sync = -1;
};

// Replayed steps whose server CPU is summed: /proc counts in clock ticks
// (10 ms), so the sum must be long for a sub-microsecond figure per
// operator.
constexpr int kServerCpuSteps = 2000;
constexpr int kIdleSynchronizes = 200;

double ProcessCpuUs() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec * 1e6 + usage.ru_utime.tv_usec +
         usage.ru_stime.tv_sec * 1e6 + usage.ru_stime.tv_usec;
}

// User and system CPU of process `pid` so far (all its threads, gone ones
// included), from /proc/PID/stat.
double ChildCpuUs(pid_t pid) {
  const std::string stat =
      process::ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, utime 14, stime 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) Die("cannot read the server's CPU time");
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  if (fields.size() < 13) Die("cannot read the server's CPU time");
  const double ticks =
      std::atof(fields[11].c_str()) + std::atof(fields[12].c_str());
  return ticks * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The step through the C++ client on one session of `address`: its
// buffers with the inputs uploaded, a stream, the step launched eagerly,
// and the same step as a graph defined once and replayed.
class ClientStep {
 public:
  ClientStep(const std::string& address, const Inputs& inputs,
             const std::vector<float>& expected)
      : expected_(expected) {
    client_ = Must(Client::Connect(address), "Connect");
    session_ =
        Must(client_->CreateSession("step_bench replay"), "CreateSession");
    remote::Session& s = *session_;
    grad_ = Must(s.Malloc(kBytes), "Malloc");
    ping_pong_[0] = Must(s.Malloc(kBytes), "Malloc");
    ping_pong_[1] = Must(s.Malloc(kBytes), "Malloc");
    selfs_ = Must(s.Malloc(inputs.selfs.size() * sizeof(float)), "Malloc");
    masks_ = Must(s.Malloc(inputs.masks.size()), "Malloc");
    Must(s.Upload(grad_.handle(), 0, inputs.grad.data(), kBytes), "Upload");
    Must(s.Upload(selfs_.handle(), 0, inputs.selfs.data(),
                  inputs.selfs.size() * sizeof(float)),
         "Upload");
    Must(s.Upload(masks_.handle(), 0, inputs.masks.data(), inputs.masks.size()),
         "Upload");
    stream_ = Must(s.CreateStream(), "CreateStream");
  }

  // Records every operator's launch into a graph on the server.
  void DefineGraph() {
    std::vector<v1::PipelineCommand> tasks;
    for (int op = 0; op < kOps; ++op) {
      remote::Executor executor = Must(Plan(op), "plan");
      tasks.push_back(Must(
          session_->LaunchCommand(executor.handle(), stream_.handle(), 0, 0, 0),
          "record"));
      executor.Release();
    }
    graph_ = Must(session_->DefineGraph(std::move(tasks)), "DefineGraph");
    Must(session_->Flush(), "DefineGraph (deferred)");
  }
  void DestroyGraph() {
    Must(session_->DestroyGraph(graph_), "DestroyGraph");
    Must(session_->Flush(), "Flush");
  }

  void Eager() {
    for (int op = 0; op < kOps; ++op) {
      Must(Must(Plan(op), "plan").Execute(stream_.handle()), "Execute");
    }
    Synchronize();
  }
  // One replay and its synchronize, sent as one message.
  void Replay() {
    Must(session_->ReplayGraphAndSynchronize(graph_, stream_.handle()),
         "ReplayGraphAndSynchronize");
  }
  void Synchronize() {
    Must(session_->Synchronize(stream_.handle()), "Synchronize");
  }
  // Zeroes the step's result buffer, so that a step that wrote nothing
  // fails Check.
  void ClearResult() {
    Must(session_->Memset(ping_pong_[(kOps - 1) % 2].handle(), 0, kBytes, 0,
                          stream_.handle()),
         "Memset");
  }
  // Dies naming `what` unless the result is the host chain's.
  void Check(const char* what) {
    std::vector<float> actual(kElements);
    Must(session_->Download(ping_pong_[(kOps - 1) % 2].handle(), 0,
                            actual.data(), kBytes, stream_.handle()),
         "Download");
    if (std::memcmp(actual.data(), expected_.data(), kBytes) != 0) {
      Die(absl::StrCat(what, ": the result differs from the host chain"));
    }
  }

 private:
  static constexpr uint64_t kBytes = kElements * sizeof(float);

  absl::StatusOr<remote::Executor> Plan(int op) {
    remote::Session& s = *session_;
    const uint64_t in =
        op == 0 ? grad_.handle() : ping_pong_[(op + 1) % 2].handle();
    remote::TensorDesc g =
        remote::TensorDesc::Contiguous(in, kernels::DType::kFloat, {kElements});
    remote::TensorDesc o = remote::TensorDesc::Contiguous(
        ping_pong_[op % 2].handle(), kernels::DType::kFloat, {kElements});
    remote::TensorDesc x = remote::TensorDesc::Contiguous(
        selfs_.handle(), kernels::DType::kFloat, {kElements});
    x.buffer_offset = op * kElements * sizeof(float);
    switch (OpAt(op)) {
      case Op::kThreshold:
        return s.ThresholdBackward(g, x, kThreshold, o);
      case Op::kSoftshrink:
        return s.SoftshrinkBackward(g, x, kLambd, o);
      case Op::kHardswish:
        return s.HardswishBackward(g, x, o);
      case Op::kLeakyRelu:
        return s.LeakyReluBackward(
            g, x, remote::ScalarValue{kernels::DType::kFloat, kSlope}, false,
            o);
      case Op::kDropout: {
        remote::TensorDesc mask = remote::TensorDesc::Contiguous(
            masks_.handle(), kernels::DType::kUint8, {kMaskBytes});
        mask.buffer_offset = op * kMaskBytes;
        return s.DropoutBackward(g, mask, kScale, o);
      }
    }
    return absl::StatusOr<remote::Executor>(absl::InternalError("no op"));
  }

  const std::vector<float>& expected_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<remote::Session> session_;
  remote::DeviceBuffer grad_;
  remote::DeviceBuffer ping_pong_[2];
  remote::DeviceBuffer selfs_;
  remote::DeviceBuffer masks_;
  remote::Stream stream_;
  uint64_t graph_ = 0;
};

ReplayResult RunReplayComparison(const std::string& address,
                                 const Inputs& inputs,
                                 const std::vector<float>& expected,
                                 pid_t server_pid) {
  ClientStep step(address, inputs, expected);
  step.DefineGraph();
  for (int i = 0; i < kWarmupSteps; ++i) {
    step.Eager();
    step.Replay();
  }
  std::vector<double> eager, replay;
  double replay_cpu = 0;
  for (int i = 0; i < kSteps; ++i) {
    step.ClearResult();
    Clock::time_point start = Clock::now();
    step.Eager();
    eager.push_back(Micros(Clock::now() - start));
    step.Check("eager step");
    step.ClearResult();
    step.Synchronize();
    const double cpu = ProcessCpuUs();
    start = Clock::now();
    step.Replay();
    replay.push_back(Micros(Clock::now() - start));
    replay_cpu += ProcessCpuUs() - cpu;
    step.Check("replayed step");
  }
  ReplayResult result;
  std::vector<double> idle;
  for (int i = 0; i < kIdleSynchronizes; ++i) {
    const Clock::time_point start = Clock::now();
    step.Synchronize();
    idle.push_back(Micros(Clock::now() - start));
  }
  result.round_trip_us = Median(idle);
  if (server_pid > 0) {
    const double before = ChildCpuUs(server_pid);
    for (int i = 0; i < kServerCpuSteps; ++i) step.Replay();
    result.server_cpu_us_per_op =
        (ChildCpuUs(server_pid) - before) / kServerCpuSteps / kOps;
    step.Check("replayed step");
    const double idle = ChildCpuUs(server_pid);
    for (int i = 0; i < kServerCpuSteps; ++i) step.Synchronize();
    result.server_cpu_us_per_sync =
        (ChildCpuUs(server_pid) - idle) / kServerCpuSteps;
  }
  step.DestroyGraph();
  result.eager_us = Median(eager);
  result.replay_us = Median(replay);
  result.replay_cpu_us_per_op = replay_cpu / kSteps / kOps;
  return result;
}

// The in-process launch cost of the same 250 operators: planned once on a
// Session of a CPU device made here (as the server plans them), then each
// step launched straight on a device stream, no RPC, no queue. The median
// step over kSteps, in microseconds per operator.
double InProcessUsPerOp(const Inputs& inputs) {
  DeviceOptions device_options;
  device_options.memory_cache_bytes = 0;
  std::unique_ptr<opserver::Device> device =
      Must(CreateDevice(device_options), "CreateDevice");
  SessionLimits limits;
  MemoryAccounting account;
  auto threads = std::make_shared<StreamThreads>();
  std::vector<double> steps;
  {
    opserver::Session session("in-process", 1, "step_bench", device.get(),
                              &limits, &account, threads);
    auto buffer = [&](const void* data, uint64_t bytes) {
      const uint64_t handle = Must(session.Malloc(bytes), "Malloc");
      if (data != nullptr) {
        std::memcpy((*session.GetBuffer(handle))->data(), data, bytes);
      }
      return handle;
    };
    const uint64_t bytes = kElements * sizeof(float);
    const uint64_t grad = buffer(inputs.grad.data(), bytes);
    const uint64_t ping_pong[2] = {buffer(nullptr, bytes),
                                   buffer(nullptr, bytes)};
    const uint64_t selfs =
        buffer(inputs.selfs.data(), inputs.selfs.size() * sizeof(float));
    const uint64_t masks = buffer(inputs.masks.data(), inputs.masks.size());
    auto desc = [](uint64_t handle, uint64_t offset, v1::DataType dtype,
                   int64_t n) {
      v1::TensorDesc d;
      d.set_buffer(handle);
      d.set_buffer_offset(offset);
      d.set_dtype(dtype);
      d.add_shape(n);
      return d;
    };
    std::vector<std::shared_ptr<Executor>> plans;
    for (int op = 0; op < kOps; ++op) {
      v1::GetWorkspaceSizeRequest request;
      request.set_op(kOpNames[static_cast<int>(OpAt(op))]);
      auto& tensors = *request.mutable_tensors();
      tensors["gradOutput"] = desc(op == 0 ? grad : ping_pong[(op + 1) % 2], 0,
                                   v1::FLOAT, kElements);
      const std::string out = OpAt(op) == Op::kSoftshrink ? "gradInput" : "out";
      tensors[out] = desc(ping_pong[op % 2], 0, v1::FLOAT, kElements);
      v1::OpParams& params = *request.mutable_params();
      if (OpAt(op) == Op::kDropout) {
        tensors["mask"] = desc(masks, op * kMaskBytes, v1::UINT8, kMaskBytes);
        params.set_scale(kScale);
      } else {
        tensors["self"] = desc(selfs, op * bytes, v1::FLOAT, kElements);
      }
      params.set_threshold(kThreshold);
      params.set_lambd(kLambd);
      params.mutable_negative_slope()->set_dtype(v1::FLOAT);
      params.mutable_negative_slope()->set_value(kSlope);
      plans.push_back(Must(
          PlanExecutor(request, session, limits.max_launch_elements), "plan"));
    }
    std::unique_ptr<DeviceStream> stream =
        Must(device->CreateStream(), "CreateStream");
    for (int i = 0; i < kWarmupSteps + kSteps; ++i) {
      const Clock::time_point start = Clock::now();
      for (const std::shared_ptr<Executor>& plan : plans) {
        Must(stream->Launch(*plan->plan, nullptr, 0), "Launch");
      }
      Must(stream->Synchronize(), "Synchronize");
      if (i >= kWarmupSteps) steps.push_back(Micros(Clock::now() - start));
    }
  }
  threads->WaitForZero(absl::Minutes(1));
  return Median(steps) / kOps;
}

}  // namespace

void ReportReplay(const std::string& address, const char* path,
                  pid_t server_pid, const Inputs& inputs,
                  const std::vector<float>& expected) {
  ReplayResult r = RunReplayComparison(address, inputs, expected, server_pid);
  const double in_process = InProcessUsPerOp(inputs);
  std::printf(
      "graph replay (C++ client, %s, median of %d steps after %d): eager "
      "step %.2f ms (%.2f us/op), replayed step %.2f ms (%.2f us/op): "
      "replay/eager %.3f (target <= 0.25: %s)\n",
      path, kSteps, kWarmupSteps, r.eager_us / 1000, r.eager_us / kOps,
      r.replay_us / 1000, r.replay_us / kOps, r.replay_us / r.eager_us,
      r.replay_us <= 0.25 * r.eager_us ? "met" : "MISSED");
  const double bound = 1.2 * r.round_trip_us + kOps * in_process;
  std::printf(
      "  round trip (idle synchronize) %.0f us; in-process launch %.2f "
      "us/op; replayed step / (1.2 round trips + %d in-process launches) "
      "%.2f (target <= 1: %s); process CPU per replayed operator %.2f us "
      "(this process: the client%s)\n",
      r.round_trip_us, in_process, kOps, r.replay_us / bound,
      r.replay_us <= bound ? "met" : "MISSED", r.replay_cpu_us_per_op,
      server_pid > 0 ? "" : " and the in-process server");
  if (r.server_cpu_us_per_op >= 0) {
    std::printf(
        "  server process CPU per replayed operator (%d steps) %.2f us, "
        "%.2fx the in-process launch (target <= 2x: %s); an idle "
        "synchronize %.0f us, so %.2f us per operator beyond the step's "
        "message\n",
        kServerCpuSteps, r.server_cpu_us_per_op,
        r.server_cpu_us_per_op / in_process,
        r.server_cpu_us_per_op <= 2 * in_process ? "met" : "MISSED",
        r.server_cpu_us_per_sync,
        r.server_cpu_us_per_op - r.server_cpu_us_per_sync / kOps);
  }
  std::fflush(stdout);
}

// --replay[=OPSERVER]: the graph rows, three rounds, on loopback and
// through the delay proxy. With an opserver binary the server is a child
// process, so its CPU is measured apart from the client's; without one it
// runs in this process.
int ReplayMain(const std::string& opserver_binary) {
  std::unique_ptr<Server> in_process;
  process::OpserverProcess child;
  std::string direct;
  std::string child_out;
  if (opserver_binary.empty()) {
    Options options;
    options.listen = "127.0.0.1:0";
    options.detect_mutex_deadlocks = false;
    in_process = Must(Server::Start(options), "Server::Start");
    direct = in_process->address();
  } else {
    process::OpserverLaunch launch;
    launch.binary = process::Absolute(opserver_binary);
    // Read for its addresses.
    const char* tmp = std::getenv("TMPDIR");
    child_out = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                             "/step_bench_opserver.", getpid(), ".out");
    launch.out_path = child_out;
    child = Must(process::StartOpserver(launch), "starting opserver");
    direct = child.address;
  }
  auto proxy =
      Must(bench::DelayProxy::Start(direct, kOneWayDelay), "DelayProxy::Start");
  const std::string delayed = absl::StrCat("127.0.0.1:", proxy->port());
  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  std::printf("server: %s; proxy: %s one way\n",
              opserver_binary.empty() ? "in this process" : "child process",
              absl::FormatDuration(kOneWayDelay).c_str());
  for (int round = 0; round < 3; ++round) {
    ReportReplay(direct, "loopback", child.pid, inputs, expected);
    ReportReplay(delayed, "proxy", 0, inputs, expected);
  }
  if (child.pid > 0) {
    kill(child.pid, SIGTERM);
    waitpid(child.pid, nullptr, 0);
    std::remove(child_out.c_str());
  }
  return 0;
}

// --chain=... --replay: the graph rows through the chain, `rounds` rounds:
// the step eager and replayed on the front (--device=ascend, whose device
// captures the graph with libaclnn_remote.so's aclmdlRI, so a replay is one
// replay_graph on the backend), and the same directly on the backend.
int ChainReplayMain(const std::string& spec, int rounds) {
  absl::StatusOr<std::unique_ptr<bench::Chain>> chain =
      bench::Chain::Start(spec);
  if (!chain.ok()) Die(absl::StrCat("--chain: ", chain.status().ToString()));
  const Inputs inputs = MakeInputs();
  const std::vector<float> expected = HostChain(inputs);
  std::printf(
      "step_bench --chain --replay: %d dependent operators on %lld-element "
      "fp32 tensors, C++ client, median of %d steps after %d; eager = %d "
      "launches + one synchronize, replayed = one replay_graph + one "
      "synchronize.\n",
      kOps, static_cast<long long>(kElements), kSteps, kWarmupSteps, kOps);
  for (int round = 0; round < rounds; ++round) {
    for (const bool front : {false, true}) {
      const std::string& address =
          front ? (*chain)->front() : (*chain)->backend();
      ReplayResult r = RunReplayComparison(address, inputs, expected, 0);
      std::printf(
          "round %d %-22s eager step %8.2f ms, replayed step %8.2f ms: "
          "replay/eager %.3f%s\n",
          round + 1, front ? "ascend (chain front)" : "cpu (backend)",
          r.eager_us / 1000, r.replay_us / 1000, r.replay_us / r.eager_us,
          front ? (r.replay_us <= 0.5 * r.eager_us ? " (target <= 0.5: met)"
                                                   : " (target <= 0.5: MISSED)")
                : "");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace opserver::step_bench
