#include "bench/fairness_attackers.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"

namespace opserver::fairness {

using kernels::DType;
using remote::Client;
using remote::ConnectOptions;
using remote::Session;
using remote::TensorDesc;

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

namespace {

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

// giant_batches' 60 MiB batches (--oversized_batches).
bool send_oversized_batches = true;

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
    const bool send_oversized = send_oversized_batches;
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

}  // namespace

int RunAttacker(const AttackerOptions& options) {
  if (options.nice > 0) (void)setpriority(PRIO_PROCESS, 0, options.nice);
  send_oversized_batches = options.oversized_batches;
  const std::string& name = options.name;
  const std::string& address = options.address;
  std::unique_ptr<Attack> attack;
  if (name == "giant_batches") {
    attack = GiantBatches(address);
  } else if (name == "malloc_churn") {
    attack = MallocChurn(address);
  } else if (name == "big_evaluates") {
    attack = BigEvaluates(address);
  } else if (name == "data_port") {
    attack = DataPortChurn(options.data_port);
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
  absl::SleepFor(absl::Seconds(options.attack_s));
  std::_Exit(0);  // Whatever its threads are doing.
}

}  // namespace opserver::fairness
