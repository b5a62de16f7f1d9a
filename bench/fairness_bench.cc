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
//   memset_flood   on the other logical device (the server runs
//                  --devices=2; the victim is on device 0): 16 streams,
//                  each keeping up to 8 Memsets of 64 MiB queued
//   copy_flood     the same with 32 MiB CopyDeviceToDevice within each
//                  stream's 64 MiB buffer
//   attach_flood   2 threads opening Attach calls on one session and
//                  holding them, up to 40,000 each
//   abandoned_syncs  a record held behind an Upload that never finishes;
//                  4 threads of SynchronizeEvent on it, each given up
//                  after 20 ms, up to 100,000 each
//   held_batches   4 sessions x 8 Pipeline channels, each sending one batch
//                  of 9 read fences of 1 MiB and a plan with a 3.9M-dim
//                  packed shape, never reading
//   alone          again, to see the machine did not drift
//
// Per phase also the server's resident memory (VmRSS; the server runs in
// this process, beside the victim's small client) before the attacker
// starts, when the phase ends, and a second after the attacker is gone.
//
// Per phase: victim steps, failures, p50 and p99 in ms, and the ratio to
// the first "alone" phase, with the targets (p99 <= 5x alone beside every
// attacker but the compute hog and the other device's memset and copy
// floods; p50 <= 3x alone beside those; no failures).
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
#include "absl/strings/match.h"
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

// VmRSS of this process (the server's, with the victim's client), in MiB.
double ResidentMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
    }
  }
  return 0;
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

// Keeps up to 8 Memsets of 64 MiB (or, with `copy`, CopyDeviceToDevice of
// 32 MiB within the buffer) queued on each of 16 streams of one session on
// device 1.
std::unique_ptr<Attack> MemsetFlood(const std::string& address, bool copy) {
  auto client = std::make_shared<std::unique_ptr<Client>>(
      Connect(address, kAttackerToken, false));
  auto created = (*client)->CreateSession(copy ? "copies" : "memsets",
                                          /*attach=*/false, /*device=*/1);
  if (!created.ok()) {
    std::fprintf(stderr, "session on device 1: %s\n",
                 created.status().ToString().c_str());
    std::exit(1);
  }
  std::shared_ptr<Session> session = *std::move(created);
  return std::make_unique<Attack>(
      16, [client, session, copy](const std::atomic<bool>& stop, int) {
        constexpr uint64_t kBytes = 64 << 20;
        auto buffer = session->Malloc(kBytes);
        if (!buffer.ok()) return;
        auto stream = session->CreateStream();
        const uint64_t s = stream.ok() ? stream->handle() : 0;
        while (!stop) {
          for (int i = 0; i < 8 && !stop; ++i) {
            if (copy) {
              session
                  ->CopyOnDevice(buffer->handle(), 0, buffer->handle(),
                                 kBytes / 2, kBytes / 2, s)
                  .IgnoreError();
            } else {
              session->Memset(buffer->handle(), 0, kBytes, i, s).IgnoreError();
            }
          }
          session->Synchronize(s).IgnoreError();
        }
      });
}

grpc::ClientContext* Authorized(grpc::ClientContext* context,
                                absl::Duration deadline) {
  context->AddMetadata("authorization",
                       absl::StrCat("Bearer ", kAttackerToken));
  context->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return context;
}

// Attach calls on one session, held open: 2 threads, up to 40,000 each.
std::unique_ptr<Attack> AttachFlood(const std::string& address) {
  auto client = std::make_shared<std::unique_ptr<Client>>(
      Connect(address, kAttackerToken, false));
  std::shared_ptr<Session> session = Open(**client, "attacher");
  return std::make_unique<Attack>(
      2, [client, session](const std::atomic<bool>& stop, int) {
        struct Held {
          std::unique_ptr<grpc::ClientContext> context;
          std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> reader;
        };
        std::vector<Held> held;
        v1::AttachRequest request;
        request.set_session(session->token());
        while (!stop && held.size() < 40000) {
          Held h;
          h.context = std::make_unique<grpc::ClientContext>();
          Authorized(h.context.get(), absl::Minutes(10));
          h.reader = (*client)->runtime().Attach(h.context.get(), request);
          held.push_back(std::move(h));
        }
        while (!stop) absl::SleepFor(absl::Milliseconds(10));
        for (Held& h : held) h.context->TryCancel();
      });
}

// SynchronizeEvent calls given up after 20 ms on a record that cannot
// complete: it is queued behind an Upload on its stream that sent its
// header and one byte of 1 MiB and then nothing (held until the server's
// transfer idle timeout, longer than a phase).
std::unique_ptr<Attack> AbandonedSyncs(const std::string& address) {
  auto client = std::make_shared<std::unique_ptr<Client>>(
      Connect(address, kAttackerToken, false));
  std::shared_ptr<Session> session = Open(**client, "syncs");
  auto stream = session->CreateStream();
  auto buffer = session->Malloc(1 << 20);
  if (!stream.ok() || !buffer.ok()) std::exit(1);
  struct Upload {
    grpc::ClientContext context;
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer;
  };
  auto upload = std::make_shared<Upload>();
  Authorized(&upload->context, absl::Minutes(10));
  upload->writer =
      (*client)->runtime().Upload(&upload->context, &upload->response);
  v1::UploadRequest first;
  first.set_session(session->token());
  first.set_buffer(buffer->handle());
  first.set_size(1 << 20);
  first.set_stream(stream->handle());
  first.set_data("x");
  upload->writer->Write(first);
  // The record must queue behind the Upload's hold: retried (a few times)
  // until it is seen incomplete.
  auto event = std::make_shared<uint64_t>(0);
  for (int attempt = 0; attempt < 50; ++attempt) {
    absl::SleepFor(absl::Milliseconds(20));
    auto created = session->CreateEvent();
    if (!created.ok()) continue;
    if (!session->RecordEvent(*created, stream->handle()).ok()) continue;
    auto done = session->QueryEvent(*created);
    if (done.ok() && !*done) {
      *event = *created;
      break;
    }
  }
  if (*event == 0) {
    std::fprintf(stderr, "abandoned_syncs: no held record\n");
    std::exit(1);
  }
  return std::make_unique<Attack>(
      4, [client, session, upload, event](const std::atomic<bool>& stop, int) {
        v1::SynchronizeEventRequest request;
        request.set_session(session->token());
        request.set_event(*event);
        for (int i = 0; i < 100000 && !stop; ++i) {
          grpc::ClientContext context;
          Authorized(&context, absl::Milliseconds(20));
          v1::SynchronizeEventResponse response;
          (*client)
              ->runtime()
              .SynchronizeEvent(&context, request, &response)
              .error_code();
        }
      });
}

// 4 sessions x 8 Pipeline channels; each sends one batch that stops at its
// read fences (9 MiB of results the channel never reads) with a plan of a
// 3.9M-dim packed shape behind them, and holds the channel open.
std::unique_ptr<Attack> HeldBatches(const std::string& address) {
  auto client = std::make_shared<std::unique_ptr<Client>>(
      Connect(address, kAttackerToken, false));
  return std::make_unique<Attack>(4, [client](const std::atomic<bool>& stop,
                                              int t) {
    std::unique_ptr<Session> session = Open(**client, absl::StrCat("held", t));
    auto buffer = session->Malloc(1 << 20);
    if (!buffer.ok()) return;
    v1::PipelineRequest batch;
    batch.set_session(session->token());
    for (uint64_t j = 1; j <= 9; ++j) {
      v1::FenceCommand* fence = batch.add_commands()->mutable_fence();
      fence->set_id(j);
      fence->set_read_buffer(buffer->handle());
      fence->set_read_size(1 << 20);
    }
    v1::PlanCommand* plan = batch.add_commands()->mutable_plan();
    plan->set_executor((uint64_t{1} << 62) + 1);
    plan->mutable_request()->set_op("ThresholdBackward");
    v1::TensorDesc& grad =
        (*plan->mutable_request()->mutable_tensors())["gradOutput"];
    grad.set_buffer(buffer->handle());
    grad.mutable_shape()->Resize(3900000, 0);
    struct Channel {
      grpc::ClientContext context;
      std::unique_ptr<
          grpc::ClientReaderWriter<v1::PipelineRequest, v1::PipelineEvent>>
          stream;
    };
    std::vector<std::unique_ptr<Channel>> channels;
    for (int c = 0; c < 8 && !stop; ++c) {
      auto channel = std::make_unique<Channel>();
      Authorized(&channel->context, absl::Minutes(10));
      channel->stream = (*client)->operators().Pipeline(&channel->context);
      channel->stream->Write(batch);
      channels.push_back(std::move(channel));
    }
    while (!stop) absl::SleepFor(absl::Milliseconds(10));
    for (auto& channel : channels) channel->context.TryCancel();
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
  } else if (name == "memset_flood" || name == "copy_flood") {
    attack = MemsetFlood(address, name == "copy_flood");
  } else if (name == "attach_flood") {
    attack = AttachFlood(address);
  } else if (name == "abandoned_syncs") {
    attack = AbandonedSyncs(address);
  } else if (name == "held_batches") {
    attack = HeldBatches(address);
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
  // Device 1 is the memset and copy floods' (the victim's is 0).
  options.devices = 2;
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
      {"alone", false},           {"giant_batches", false},
      {"malloc_churn", false},    {"big_evaluates", false},
      {"data_port", false},       {"unauth_flood", false},
      {"compute_hog", true},      {"memset_flood", true},
      {"copy_flood", true},       {"attach_flood", false},
      {"abandoned_syncs", false}, {"held_batches", false},
      {"alone", false},
  };
  const std::string data_port = absl::StrCat((*server)->data_port());
  std::printf(
      "fairness_bench: victim step = WriteValues + GetWorkspaceSize "
      "+ Execute + ReadValues (4096 fp32), %d s per phase, attacker "
      "processes at nice %d\n",
      absl::GetFlag(FLAGS_phase_s), absl::GetFlag(FLAGS_attacker_nice));
  std::printf("%-15s %7s %6s %9s %9s %8s %8s  %-28s %s\n", "phase", "steps",
              "fail", "p50 ms", "p99 ms", "p50 x", "p99 x", "target",
              "server RSS MiB: before / end / after");
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
    const double rss_before = ResidentMiB();
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
    const double rss_end = ResidentMiB();
    if (attacker != 0) {
      kill(attacker, SIGKILL);
      waitpid(attacker, nullptr, 0);
      // The server notices the connections are gone.
      absl::SleepFor(absl::Seconds(1));
    }
    const double rss_after = ResidentMiB();
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
    std::printf(
        "%-15s %7d %6d %9.2f %9.2f %8.2f %8.2f  %-28s %.0f / %.0f / %.0f\n",
        p.name, r.steps, r.failures, r.p50_ms, r.p99_ms, p50x, p99x,
        target.c_str(), rss_before, rss_end, rss_after);
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
