// Tenant fairness: a victim tenant's small-step latency, alone and beside
// each kind of hostile tenant, in one run against one server.
//
//   bazel run -c opt //bench:fairness_bench [-- --phase_s=8]
//
// An in-process opserver (CPU device, token authentication, data port on)
// on a free loopback port. The victim, tenant "victim" on a connection of
// its own, runs steps of four unary calls back to back: WriteValues of 4
// floats, GetWorkspaceSize and Execute of a 4096-element ThresholdBackward,
// ReadValues of 4 floats. Each phase runs the victim for --phase_s seconds
// beside one attacker (tenant "attacker", its own connections):
//
//   alone          nothing else
//   giant_batches  2 Pipeline channels sending batches of 65,536 frees at
//                  the server's command cap, plus one 60 MiB batch each
//                  second (refused by size)
//   malloc_churn   4 threads, each Malloc 256 MiB + Free, over 2 sessions
//   big_evaluates  8 threads of Evaluate on 2^20-element tensors
//   data_port      2 threads opening and closing connections to the data
//                  port as fast as they can, sending nothing
//   unauth_flood   4 threads of GetDeviceInfo with a wrong token
//   compute_hog    4 sessions x 2 streams of 2^25-element launches
//   alone          again, to see the machine did not drift
//
// Per phase: victim steps, failures, p50 and p99 in ms, and the ratio to
// the first "alone" phase, with the targets (p99 <= 5x alone beside every
// attacker but the compute hog; p50 <= 3x alone beside it; no failures).
// Every loop is bounded by the phase's time and stops by itself; all
// traffic stays on 127.0.0.1.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"

ABSL_FLAG(int, phase_s, 8, "Seconds each phase runs.");
ABSL_FLAG(std::string, phases, "",
          "Comma-separated attacker phases to run (default: all); the "
          "victim alone always runs first and last.");
ABSL_FLAG(int, attacker_nice, 0,
          "Nice value of the attacker processes. On this one host the "
          "attackers' clients share the server's two cores; at 19 their own "
          "work (building and sending requests) yields to the server and the "
          "victim, as if they ran on machines of their own.");
// Internal: the bench runs each attacker as a child process of itself.
ABSL_FLAG(std::string, attack, "", "(internal) run this attacker and exit");
ABSL_FLAG(std::string, address, "", "(internal) the server's address");
ABSL_FLAG(int, data_port, 0, "(internal) the server's data port");
ABSL_FLAG(int, attack_s, 0, "(internal) seconds the attacker runs");
ABSL_FLAG(bool, oversized_batches, true,
          "giant_batches also sends one 60 MiB batch per channel a second.");

extern char** environ;

namespace opserver {
namespace {

using kernels::DType;
using remote::Client;
using remote::ConnectOptions;
using remote::Session;
using remote::TensorDesc;

constexpr char kVictimToken[] = "victim-token-0123456789abcdef";
constexpr char kAttackerToken[] = "attacker-token-0123456789abcdef";
constexpr int64_t kStepElements = 4096;

std::unique_ptr<Client> Connect(const std::string& address,
                                const std::string& token, bool pipeline) {
  ConnectOptions options;
  options.token = token;
  options.pipeline = pipeline;
  auto client = Client::Connect(address, options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(client);
}

std::unique_ptr<Session> Open(Client& client, const std::string& name) {
  auto session = client.CreateSession(name, /*attach=*/false);
  if (!session.ok()) {
    std::fprintf(stderr, "session: %s\n", session.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(session);
}

// Runs `body(stop)` on `threads` threads until `stop` is set.
class Attack {
 public:
  Attack(int threads, std::function<void(const std::atomic<bool>&, int)> body)
      : stop_(false) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, body, i] { body(stop_, i); });
    }
  }
  ~Attack() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_;
  std::vector<std::thread> threads_;
};

struct PhaseResult {
  std::string name;
  int steps = 0;
  int failures = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  std::string first_error;
};

PhaseResult RunVictim(const std::string& name, Session& session,
                      const remote::DeviceBuffer& a,
                      const remote::DeviceBuffer& b, absl::Duration length) {
  PhaseResult result;
  result.name = name;
  std::vector<double> ms;
  const TensorDesc ta =
      TensorDesc::Contiguous(a.handle(), DType::kFloat, {kStepElements});
  const TensorDesc tb =
      TensorDesc::Contiguous(b.handle(), DType::kFloat, {kStepElements});
  const absl::Time end = absl::Now() + length;
  while (absl::Now() < end) {
    const absl::Time start = absl::Now();
    absl::Status status =
        session.WriteValues(a.handle(), 0, DType::kFloat, {1.0, 2.0, 3.0, 4.0});
    if (status.ok()) {
      auto executor = session.ThresholdBackward(ta, ta, 0.5, tb);
      status = executor.ok() ? executor->Execute() : executor.status();
    }
    if (status.ok()) {
      auto values = session.ReadValues(b.handle(), 0, DType::kFloat, 4);
      status = values.status();
      if (status.ok() && (*values)[3] != 4.0) {
        status = absl::InternalError("wrong result");
      }
    }
    if (!status.ok()) {
      if (result.failures++ == 0) result.first_error = status.ToString();
      continue;
    }
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  result.steps = static_cast<int>(ms.size());
  if (!ms.empty()) {
    std::sort(ms.begin(), ms.end());
    result.p50_ms = ms[ms.size() / 2];
    result.p99_ms = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  }
  return result;
}

// Attackers. Each returns an Attack that runs until destroyed.

std::unique_ptr<Attack> GiantBatches(const std::string& address) {
  const SessionLimits limits;  // The server's defaults.
  return std::make_unique<Attack>(2, [address, limits](
                                         const std::atomic<bool>& stop, int) {
    std::unique_ptr<Client> client = Connect(address, kAttackerToken, false);
    std::unique_ptr<Session> session = Open(*client, "giant");
    v1::PipelineRequest batch;
    batch.set_session(session->token());
    for (uint32_t i = 0; i < limits.max_pipeline_batch_commands; ++i) {
      batch.add_commands()->set_free(1000000 + i);
    }
    v1::PipelineRequest oversized;
    oversized.set_session(session->token());
    oversized.add_commands()->mutable_plan()->mutable_request()->set_op(
        std::string(60 << 20, 'x'));
    const bool send_oversized = absl::GetFlag(FLAGS_oversized_batches);
    absl::Time next_oversized = absl::Now();
    while (!stop) {
      grpc::ClientContext context;
      context.AddMetadata("authorization",
                          absl::StrCat("Bearer ", kAttackerToken));
      auto stream = client->operators().Pipeline(&context);
      std::thread reader([&] {
        v1::PipelineEvent event;
        while (stream->Read(&event)) {
        }
      });
      while (!stop) {
        const bool big = send_oversized && absl::Now() >= next_oversized;
        if (big) next_oversized = absl::Now() + absl::Seconds(1);
        if (!stream->Write(big ? oversized : batch)) break;
        if (big) break;  // The channel ends; open another.
      }
      context.TryCancel();
      reader.join();
      stream->Finish().IgnoreError();
    }
  });
}

std::unique_ptr<Attack> MallocChurn(const std::string& address) {
  return std::make_unique<Attack>(4, [address](const std::atomic<bool>& stop,
                                               int) {
    std::unique_ptr<Client> client = Connect(address, kAttackerToken, false);
    std::unique_ptr<Session> sessions[2] = {Open(*client, "churn0"),
                                            Open(*client, "churn1")};
    for (int i = 0; !stop; ++i) {
      auto buffer = sessions[i % 2]->Malloc(256 << 20);
      if (buffer.ok()) buffer->Free().IgnoreError();
    }
  });
}

std::unique_ptr<Attack> BigEvaluates(const std::string& address) {
  return std::make_unique<Attack>(
      8, [address](const std::atomic<bool>& stop, int) {
        auto channel =
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
        auto stub = v1::Operators::NewStub(channel);
        v1::EvaluateRequest request;
        request.set_op("HardswishBackward");
        for (const char* name : {"gradOutput", "self"}) {
          v1::ValueTensor& t = (*request.mutable_inputs())[name];
          t.set_dtype(v1::FLOAT);
          t.add_shape(int64_t{1} << 20);
          for (int i = 0; i < (1 << 20); ++i) t.add_values(i % 7 - 3);
        }
        request.mutable_output()->set_dtype(v1::FLOAT);
        request.mutable_output()->add_shape(int64_t{1} << 20);
        while (!stop) {
          grpc::ClientContext context;
          context.AddMetadata("authorization",
                              absl::StrCat("Bearer ", kAttackerToken));
          v1::EvaluateResponse response;
          stub->Evaluate(&context, request, &response).error_code();
        }
      });
}

std::unique_ptr<Attack> DataPortChurn(int port) {
  return std::make_unique<Attack>(
      2, [port](const std::atomic<bool>& stop, int) {
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<uint16_t>(port));
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        while (!stop) {
          int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
          if (fd < 0) continue;
          connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
          close(fd);
        }
      });
}

std::unique_ptr<Attack> UnauthenticatedFlood(const std::string& address) {
  return std::make_unique<Attack>(
      4, [address](const std::atomic<bool>& stop, int) {
        auto channel =
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
        auto stub = v1::Runtime::NewStub(channel);
        while (!stop) {
          grpc::ClientContext context;
          context.AddMetadata("authorization", "Bearer wrong-token-0123456789");
          v1::GetDeviceInfoResponse response;
          stub->GetDeviceInfo(&context, v1::GetDeviceInfoRequest(), &response)
              .error_code();
        }
      });
}

std::unique_ptr<Attack> ComputeHog(const std::string& address) {
  return std::make_unique<Attack>(
      4, [address](const std::atomic<bool>& stop, int) {
        std::unique_ptr<Client> client = Connect(address, kAttackerToken, true);
        std::unique_ptr<Session> session = Open(*client, "hog");
        constexpr int64_t kN = int64_t{1} << 25;
        auto buffer = session->Malloc(kN);
        if (!buffer.ok()) return;
        const TensorDesc t =
            TensorDesc::Contiguous(buffer->handle(), DType::kInt8, {kN});
        auto executor = session->ThresholdBackward(t, t, 0.5, t);
        if (!executor.ok() || !executor->SetRepeatable().ok()) return;
        auto streams = std::vector<remote::Stream>();
        for (int i = 0; i < 2; ++i) {
          auto stream = session->CreateStream();
          if (stream.ok()) streams.push_back(*std::move(stream));
        }
        while (!stop) {
          for (const remote::Stream& stream : streams) {
            executor->Execute(stream.handle()).IgnoreError();
          }
          for (const remote::Stream& stream : streams) {
            session->Synchronize(stream.handle()).IgnoreError();
          }
        }
      });
}

// One attacker, in a process of its own, until --attack_s seconds passed
// (the bench kills it sooner).
int RunAttacker() {
  const int nice = absl::GetFlag(FLAGS_attacker_nice);
  if (nice > 0) (void)setpriority(PRIO_PROCESS, 0, nice);
  const std::string name = absl::GetFlag(FLAGS_attack);
  const std::string address = absl::GetFlag(FLAGS_address);
  std::unique_ptr<Attack> attack;
  if (name == "giant_batches") {
    attack = GiantBatches(address);
  } else if (name == "malloc_churn") {
    attack = MallocChurn(address);
  } else if (name == "big_evaluates") {
    attack = BigEvaluates(address);
  } else if (name == "data_port") {
    attack = DataPortChurn(absl::GetFlag(FLAGS_data_port));
  } else if (name == "unauth_flood") {
    attack = UnauthenticatedFlood(address);
  } else if (name == "compute_hog") {
    attack = ComputeHog(address);
  } else {
    std::fprintf(stderr, "unknown attacker %s\n", name.c_str());
    return 2;
  }
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_attack_s)));
  std::_Exit(0);  // Whatever its threads are doing.
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_attack).empty()) return RunAttacker();
  const absl::Duration phase = absl::Seconds(absl::GetFlag(FLAGS_phase_s));
  char dir_template[] = "/tmp/fairness_bench.XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return 1;
  const std::string tokens = absl::StrCat(dir, "/tokens");
  {
    std::ofstream out(tokens);
    out << "victim " << kVictimToken << "\nattacker " << kAttackerToken << "\n";
  }
  chmod(tokens.c_str(), 0600);
  Options options;
  options.listen = "127.0.0.1:0";
  options.auth_token_file = tokens;
  options.device_memory_bytes = 4ull << 30;
  auto server = Server::Start(options);
  unlink(tokens.c_str());
  rmdir(dir);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const std::string address = (*server)->address();

  std::unique_ptr<Client> victim = Connect(address, kVictimToken, false);
  std::unique_ptr<Session> session = Open(*victim, "victim");
  auto a = session->Malloc(kStepElements * 4);
  auto b = session->Malloc(kStepElements * 4);
  if (!a.ok() || !b.ok()) return 1;
  RunVictim("warmup", *session, *a, *b, absl::Seconds(1));

  struct Phase {
    const char* name;
    bool compute;  // The p50 target instead of the p99 one.
  };
  const std::vector<Phase> phases = {
      {"alone", false},        {"giant_batches", false},
      {"malloc_churn", false}, {"big_evaluates", false},
      {"data_port", false},    {"unauth_flood", false},
      {"compute_hog", true},   {"alone", false},
  };
  const std::string data_port = absl::StrCat((*server)->data_port());
  std::printf(
      "fairness_bench: victim step = WriteValues + GetWorkspaceSize "
      "+ Execute + ReadValues (4096 fp32), %d s per phase, attacker "
      "processes at nice %d\n",
      absl::GetFlag(FLAGS_phase_s), absl::GetFlag(FLAGS_attacker_nice));
  std::printf("%-14s %7s %6s %9s %9s %8s %8s  %s\n", "phase", "steps", "fail",
              "p50 ms", "p99 ms", "p50 x", "p99 x", "target");
  PhaseResult alone;
  bool all_met = true;
  const std::vector<std::string> wanted =
      absl::StrSplit(absl::GetFlag(FLAGS_phases), ',', absl::SkipEmpty());
  for (const Phase& p : phases) {
    if (std::string(p.name) != "alone" && !wanted.empty() &&
        std::find(wanted.begin(), wanted.end(), p.name) == wanted.end()) {
      continue;
    }
    // The attacker is a process of its own, as a tenant's client would
    // be: its threads (gRPC's included) are not the server's.
    pid_t attacker = 0;
    if (std::string(p.name) != "alone") {
      std::vector<std::string> args = {
          "/proc/self/exe",
          absl::StrCat("--attack=", p.name),
          absl::StrCat("--address=", address),
          absl::StrCat("--data_port=", data_port),
          absl::StrCat("--attack_s=", absl::GetFlag(FLAGS_phase_s) + 5),
          absl::StrCat("--attacker_nice=", absl::GetFlag(FLAGS_attacker_nice))};
      std::vector<char*> argv_child;
      for (std::string& arg : args) argv_child.push_back(arg.data());
      argv_child.push_back(nullptr);
      if (posix_spawn(&attacker, "/proc/self/exe", nullptr, nullptr,
                      argv_child.data(), environ) != 0) {
        std::fprintf(stderr, "cannot start the %s attacker\n", p.name);
        return 1;
      }
      // Let the attack reach its steady state first.
      absl::SleepFor(absl::Seconds(1));
    }
    PhaseResult r = RunVictim(p.name, *session, *a, *b, phase);
    if (attacker != 0) {
      kill(attacker, SIGKILL);
      waitpid(attacker, nullptr, 0);
    }
    if (alone.steps == 0) alone = r;
    const double p50x = alone.p50_ms > 0 ? r.p50_ms / alone.p50_ms : 0;
    const double p99x = alone.p99_ms > 0 ? r.p99_ms / alone.p99_ms : 0;
    std::string target;
    if (std::string(p.name) != "alone") {
      const bool met =
          r.failures == 0 && (p.compute ? p50x <= 3.0 : p99x <= 5.0);
      all_met = all_met && met;
      target = absl::StrCat(p.compute ? "p50<=3x" : "p99<=5x",
                            ", no failure: ", met ? "met" : "MISSED");
    }
    std::printf("%-14s %7d %6d %9.2f %9.2f %8.2f %8.2f  %s\n", p.name, r.steps,
                r.failures, r.p50_ms, r.p99_ms, p50x, p99x, target.c_str());
    if (r.failures > 0) {
      std::printf("  first failure: %s\n", r.first_error.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("fairness_bench: %s\n",
              all_met ? "every target met" : "a target was missed");
  a->Free().IgnoreError();
  b->Free().IgnoreError();
  session.reset();
  victim.reset();
  server->reset();
  return 0;
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) { return opserver::Main(argc, argv); }
