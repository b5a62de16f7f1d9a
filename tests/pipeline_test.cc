// The pipelined path (Operators.Pipeline, the client's default) against the
// unary one on the same server: the same numbers and the same phase-one
// statuses, deferred errors reported by the next synchronize with their
// exact code, issue order across transfers, streams and unary calls, a
// small window, and a raw channel's hostile commands.

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "server/server.h"
#include "tests/tensor_desc.h"

namespace opserver {
namespace remote {
namespace {

using kernels::DType;
using kernels::GetAclnnStatus;
using ::testing::HasSubstr;

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opserver::Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    // A launch the client cannot refuse (only the server knows its limit).
    options.session_limits.max_launch_elements = 1024;
    auto server = opserver::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    piped_ = Connect(true);
    unary_ = Connect(false);
  }

  struct Side {
    std::unique_ptr<Client> client;
    std::unique_ptr<Session> session;
  };

  Side Connect(bool pipeline, ChannelWindow window = {}) {
    ConnectOptions options;
    options.pipeline = pipeline;
    options.pipeline_window = window;
    auto client = Client::Connect(server_->address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    auto session = (*client)->CreateSession(pipeline ? "piped" : "unary");
    EXPECT_TRUE(session.ok()) << session.status();
    EXPECT_EQ((*session)->pipelined(), pipeline);
    return Side{*std::move(client), *std::move(session)};
  }

  static DeviceBuffer Floats(Session& session, const std::vector<float>& v) {
    auto buffer = session.Malloc(v.size() * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(
        session.Upload(buffer->handle(), 0, v.data(), v.size() * sizeof(float))
            .ok());
    return *std::move(buffer);
  }

  static std::vector<float> Read(Session& session, const DeviceBuffer& buffer,
                                 size_t n) {
    std::vector<float> out(n);
    absl::Status status =
        session.Download(buffer.handle(), 0, out.data(), n * sizeof(float));
    EXPECT_TRUE(status.ok()) << status;
    return out;
  }

  static TensorDesc F32(const DeviceBuffer& b, std::vector<int64_t> shape) {
    return TensorDesc::Contiguous(b.handle(), DType::kFloat, std::move(shape));
  }

  std::unique_ptr<opserver::Server> server_;
  Side piped_;
  Side unary_;
};

// Plans one operator over (grad, self-or-mask, out) of `session`.
using PlanFn = std::function<absl::StatusOr<Executor>(
    Session&, const TensorDesc&, const TensorDesc&, const TensorDesc&)>;

std::vector<std::pair<std::string, PlanFn>> EveryOperator() {
  return {
      {"ThresholdBackward",
       [](Session& s, const TensorDesc& g, const TensorDesc& x,
          const TensorDesc& o) { return s.ThresholdBackward(g, x, 0.25, o); }},
      {"SoftshrinkBackward",
       [](Session& s, const TensorDesc& g, const TensorDesc& x,
          const TensorDesc& o) { return s.SoftshrinkBackward(g, x, 0.5, o); }},
      {"HardswishBackward",
       [](Session& s, const TensorDesc& g, const TensorDesc& x,
          const TensorDesc& o) { return s.HardswishBackward(g, x, o); }},
      {"LeakyReluBackward",
       [](Session& s, const TensorDesc& g, const TensorDesc& x,
          const TensorDesc& o) {
         return s.LeakyReluBackward(g, x, ScalarValue{DType::kFloat, 0.125},
                                    false, o);
       }},
      {"DropoutBackward",
       [](Session& s, const TensorDesc& g, const TensorDesc& x,
          const TensorDesc& o) {
         // A bit mask of align(n, 128) / 8 bytes: the float bytes of `x`.
         const int64_t n = g.shape[0];
         TensorDesc mask = TensorDesc::Contiguous(x.buffer, DType::kUint8,
                                                  {(n + 127) / 128 * 16});
         return s.DropoutBackward(g, mask, 2.0, o);
       }},
  };
}

TEST_F(PipelineTest, EveryOperatorGivesTheUnaryPathsNumbers) {
  std::vector<float> grad, self;
  for (int i = 0; i < 37; ++i) {
    grad.push_back(0.5f * i - 7.25f);
    self.push_back(0.3f * i - 5.0f);
  }
  for (const auto& [name, plan] : EveryOperator()) {
    std::vector<std::vector<float>> results;
    for (Side* side : {&piped_, &unary_}) {
      Session& s = *side->session;
      DeviceBuffer g = Floats(s, grad);
      DeviceBuffer x = Floats(s, self);
      DeviceBuffer o = Floats(s, std::vector<float>(grad.size(), -1));
      const int64_t n = static_cast<int64_t>(grad.size());
      auto executor = plan(s, F32(g, {n}), F32(x, {n}), F32(o, {n}));
      ASSERT_TRUE(executor.ok())
          << name << ": " << executor.status().ToString();
      ASSERT_TRUE(executor->Execute().ok()) << name;
      ASSERT_TRUE(s.Synchronize().ok()) << name;
      results.push_back(Read(s, o, grad.size()));
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(),
                             results[0].size() * sizeof(float)))
        << name;
    // The output was written (not left at -1 everywhere).
    EXPECT_NE(results[0], std::vector<float>(grad.size(), -1)) << name;
  }
}

// One table of bad arguments, run through both paths: phase one answers
// the same status, aclnn code and message whether the client or the server
// checks it.
TEST_F(PipelineTest, PhaseOneStatusesMatchTheServers) {
  struct Case {
    std::string what;
    std::function<absl::StatusOr<Executor>(Session&, const DeviceBuffer&,
                                           const DeviceBuffer&)>
        plan;
  };
  const std::vector<Case> cases = {
      {"shapes do not broadcast",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         return s.ThresholdBackward(F32(a, {4}), F32(b, {3}), 1, F32(a, {4}));
       }},
      {"out has the wrong shape",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         return s.HardswishBackward(F32(a, {4}), F32(b, {4}), F32(a, {2}));
       }},
      {"view beyond its buffer",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         return s.HardswishBackward(F32(a, {64}), F32(b, {64}), F32(a, {64}));
       }},
      {"unknown buffer",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer&) {
         return s.HardswishBackward(
             TensorDesc::Contiguous(999, DType::kFloat, {4}), F32(a, {4}),
             F32(a, {4}));
       }},
      {"unsupported dtype",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         TensorDesc ints = F32(b, {4});
         ints.dtype = DType::kInt32;
         return s.SoftshrinkBackward(F32(a, {4}), ints, 0.5, F32(a, {4}));
       }},
      {"negative lambd",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         return s.SoftshrinkBackward(F32(a, {4}), F32(b, {4}), -1, F32(a, {4}));
       }},
      {"dropout scale in (0, 1)",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         TensorDesc mask = F32(b, {4});
         mask.dtype = DType::kUint8;
         return s.DropoutBackward(F32(a, {4}), mask, 0.5, F32(a, {4}));
       }},
      {"missing negativeSlope dtype is integer but value fractional",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         return s.LeakyReluBackward(F32(a, {4}), F32(b, {4}),
                                    ScalarValue{DType::kInt32, 0.5}, false,
                                    F32(a, {4}));
       }},
      {"missing tensor",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         v1::OpParams params;
         return s.GetWorkspaceSize(
             "HardswishBackward", params,
             {{"gradOutput", F32(a, {4})}, {"self", F32(b, {4})}});
       }},
      {"unknown argument name",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         v1::OpParams params;
         return s.GetWorkspaceSize("HardswishBackward", params,
                                   {{"gradOutput", F32(a, {4})},
                                    {"self", F32(b, {4})},
                                    {"result", F32(a, {4})}});
       }},
      {"negative dimension",
       [](Session& s, const DeviceBuffer& a, const DeviceBuffer& b) {
         return s.HardswishBackward(F32(a, {-4}), F32(b, {4}), F32(a, {4}));
       }},
  };
  Session& p = *piped_.session;
  Session& u = *unary_.session;
  DeviceBuffer pa = Floats(p, {1, 2, 3, 4}), pb = Floats(p, {1, 2, 3, 4});
  DeviceBuffer ua = Floats(u, {1, 2, 3, 4}), ub = Floats(u, {1, 2, 3, 4});
  // Same handle numbers on both sides, so messages naming them match.
  ASSERT_EQ(pa.handle(), ua.handle());
  ASSERT_EQ(pb.handle(), ub.handle());
  for (const Case& c : cases) {
    absl::Status local = c.plan(p, pa, pb).status();
    absl::Status remote = c.plan(u, ua, ub).status();
    ASSERT_FALSE(remote.ok())
        << c.what << " passed the server; locally: " << local;
    EXPECT_EQ(local.code(), remote.code()) << c.what << ": " << local;
    EXPECT_EQ(GetAclnnStatus(local), GetAclnnStatus(remote))
        << c.what << ": " << local << " vs " << remote;
    EXPECT_EQ(std::string(local.message()), std::string(remote.message()))
        << c.what;
  }
}

// Only the server knows --max_launch_elements: the plan is accepted here,
// refused there, and the launch fails its stream with the exact code at
// the next synchronize; another stream's work goes on.
TEST_F(PipelineTest, ServerRefusalIsReportedBySynchronizeWithItsCode) {
  Session& s = *piped_.session;
  DeviceBuffer big = Floats(s, std::vector<float>(2048, 1));
  DeviceBuffer small_grad = Floats(s, {1, 2, 3, 4});
  DeviceBuffer small_self = Floats(s, {0.5, 1.5, 2.5, 3.5});
  DeviceBuffer small_out = Floats(s, {0, 0, 0, 0});
  auto bad_stream = s.CreateStream();
  auto good_stream = s.CreateStream();
  ASSERT_TRUE(bad_stream.ok() && good_stream.ok());
  auto bad =
      s.HardswishBackward(F32(big, {2048}), F32(big, {2048}), F32(big, {2048}));
  ASSERT_TRUE(bad.ok()) << "phase one is local: " << bad.status();
  ASSERT_TRUE(bad->Execute(bad_stream->handle()).ok());
  auto good = s.ThresholdBackward(F32(small_grad, {4}), F32(small_self, {4}),
                                  1.0, F32(small_out, {4}));
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(good->Execute(good_stream->handle()).ok());

  absl::Status deferred = bad_stream->Synchronize();
  EXPECT_EQ(deferred.code(), absl::StatusCode::kResourceExhausted) << deferred;
  EXPECT_EQ(GetAclnnStatus(deferred), 161002) << deferred;
  EXPECT_THAT(deferred.message(), HasSubstr("--max_launch_elements"));
  // Reported once.
  EXPECT_TRUE(bad_stream->Synchronize().ok());
  EXPECT_TRUE(good_stream->Synchronize().ok());
  EXPECT_EQ(Read(s, small_out, 4), (std::vector<float>{0, 2, 3, 4}));
}

// WriteAsync and ReadAsync ride the channel in order with the launches
// around them, on both kinds of session (unary: an Upload and a Download);
// a launch's error is the read's, and reads dropped unwaited write nothing.
TEST_F(PipelineTest, AsyncWritesAndReadsAreOrderedWithLaunches) {
  for (Side* side : {&piped_, &unary_}) {
    Session& s = *side->session;
    auto grad = s.Malloc(16);
    auto self = s.Malloc(16);
    auto out = s.Malloc(16);
    auto stream = s.CreateStream();
    ASSERT_TRUE(grad.ok() && self.ok() && out.ok() && stream.ok());
    const uint64_t on = stream->handle();
    const std::vector<float> g = {4.5, 4.4, 4.3, 4.2};
    const std::vector<float> x = {0.2, 1.2, 2.2, 3.2};
    std::vector<float> result(4, -1), middle(2, -1);
    ASSERT_TRUE(s.WriteAsync(grad->handle(), 0, g.data(), 16, on).ok());
    ASSERT_TRUE(s.WriteAsync(self->handle(), 0, x.data(), 16, on).ok());
    auto plan = s.ThresholdBackward(F32(*grad, {4}), F32(*self, {4}), 1.0,
                                    F32(*out, {4}));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(plan->Execute(on).ok());
    auto read = s.ReadAsync(out->handle(), 0, result.data(), 16, on);
    auto part = s.ReadAsync(out->handle(), 4, middle.data(), 8, on);
    ASSERT_TRUE(read.ok() && part.ok());
    // Written before the launch ran: the write is ordered after it.
    const std::vector<float> zeros(4, 0);
    ASSERT_TRUE(s.WriteAsync(out->handle(), 0, zeros.data(), 16, on).ok());
    EXPECT_TRUE(read->Wait().ok());
    EXPECT_TRUE(part->Wait().ok());
    EXPECT_EQ(result, (std::vector<float>{0, 4.4f, 4.3f, 4.2f}));
    EXPECT_EQ(middle, (std::vector<float>{4.4f, 4.3f}));
    EXPECT_EQ(Read(s, *out, 4), zeros);

    // Unknown buffer, out of range, unknown stream (a unary session's
    // read learns it from its Download, when it is waited for).
    EXPECT_EQ(s.WriteAsync(999, 0, g.data(), 4).code(),
              absl::StatusCode::kNotFound);
    auto outside = s.ReadAsync(out->handle(), 8, result.data(), 16);
    EXPECT_TRUE(!outside.ok() || !outside->Wait().ok());
    EXPECT_FALSE(s.WriteAsync(out->handle(), 0, g.data(), 4, 12345).ok());
    const bool piped = side == &piped_;
    if (piped) {
      // A failed launch is the next read's error; the read writes nothing.
      DeviceBuffer big = Floats(s, std::vector<float>(2048, 1));
      auto bad = s.HardswishBackward(F32(big, {2048}), F32(big, {2048}),
                                     F32(big, {2048}));
      ASSERT_TRUE(bad.ok());
      ASSERT_TRUE(bad->Execute(on).ok());
      std::vector<float> untouched(4, -7);
      auto after = s.ReadAsync(out->handle(), 0, untouched.data(), 16, on);
      ASSERT_TRUE(after.ok());
      absl::Status waited = after->Wait();
      EXPECT_EQ(waited.code(), absl::StatusCode::kResourceExhausted) << waited;
      EXPECT_EQ(untouched, std::vector<float>(4, -7));
    }
    // Reads dropped without Wait leave their destination alone.
    {
      std::vector<float> dropped(4, -9);
      auto forgotten = s.ReadAsync(out->handle(), 0, dropped.data(), 16, on);
      ASSERT_TRUE(forgotten.ok());
      forgotten = PendingRead();
      EXPECT_TRUE(stream->Synchronize().ok());
      if (piped) {
        EXPECT_EQ(dropped, std::vector<float>(4, -9));
      }
    }
  }
}

// Upload, launch, launch, download on one stream; a second stream after a
// synchronize; unary WriteValues/ReadValues between pipelined launches:
// always the issue-order result.
TEST_F(PipelineTest, CallsTakeEffectInIssueOrder) {
  Session& s = *piped_.session;
  constexpr int kN = 1000;
  DeviceBuffer a = Floats(s, std::vector<float>(kN, 3));
  DeviceBuffer b = Floats(s, std::vector<float>(kN, 0));
  DeviceBuffer x = Floats(s, std::vector<float>(kN, 1));  // self > 0.5
  auto stream = s.CreateStream();
  ASSERT_TRUE(stream.ok());
  for (int round = 0; round < 20; ++round) {
    // b = a (threshold passes grad where self > 0.5); then a = b.
    std::vector<float> fresh(kN, static_cast<float>(round));
    ASSERT_TRUE(s.Upload(a.handle(), 0, fresh.data(), kN * sizeof(float),
                         stream->handle())
                    .ok());
    auto copy =
        s.ThresholdBackward(F32(a, {kN}), F32(x, {kN}), 0.5, F32(b, {kN}));
    ASSERT_TRUE(copy.ok());
    ASSERT_TRUE(copy->Execute(stream->handle()).ok());
    // Unary, after a pipelined launch: sees b.
    auto seen = s.ReadValues(b.handle(), 4 * (kN - 1), DType::kFloat, 1,
                             stream->handle());
    ASSERT_TRUE(seen.ok()) << seen.status();
    EXPECT_EQ((*seen)[0], round);
    ASSERT_TRUE(
        s.WriteValues(x.handle(), 0, DType::kFloat, {0.0}, stream->handle())
            .ok());
    auto back =
        s.ThresholdBackward(F32(b, {kN}), F32(x, {kN}), 0.5, F32(a, {kN}));
    ASSERT_TRUE(back.ok());
    ASSERT_TRUE(back->Execute(stream->handle()).ok());
    std::vector<float> got = Read(s, a, kN);
    EXPECT_EQ(got[0], 0) << "the WriteValues before the launch took effect";
    EXPECT_EQ(got[kN - 1], round);
    ASSERT_TRUE(
        s.WriteValues(x.handle(), 0, DType::kFloat, {1.0}, stream->handle())
            .ok());
  }
  // Across streams: a launch on stream 0 after a synchronize of the other.
  ASSERT_TRUE(stream->Synchronize().ok());
  auto last = s.HardswishBackward(F32(a, {kN}), F32(a, {kN}), F32(b, {kN}));
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(last->Execute().ok());
  // hardswish'(19) = 1: b = a.
  EXPECT_EQ(Read(s, b, kN)[kN - 1], 19.0f);
}

// A window of 3 commands: thousands of launches still all run, in order.
TEST_F(PipelineTest, SmallWindowBlocksAndLosesNothing) {
  ChannelWindow window;
  window.commands = 3;
  window.bytes = 1;  // One command at a time by bytes.
  Side side = Connect(true, window);
  Session& s = *side.session;
  DeviceBuffer acc = Floats(s, {0});
  DeviceBuffer one = Floats(s, {1});
  auto forward =
      s.ThresholdBackward(F32(one, {1}), F32(one, {1}), 0.0, F32(acc, {1}));
  ASSERT_TRUE(forward.ok());
  ASSERT_TRUE(forward->SetRepeatable().ok());
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(forward->Execute().ok()) << i;
  }
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(Read(s, acc, 1)[0], 1);
  ASSERT_TRUE(forward->Destroy().ok());
}

// Errors the client can see are immediate, as on a device: a consumed
// executor, a too-small workspace, an unknown stream, a freed buffer.
TEST_F(PipelineTest, ClientVisibleErrorsAreImmediate) {
  Session& s = *piped_.session;
  DeviceBuffer g = Floats(s, {1, 2, 3, 4});
  auto executor = s.HardswishBackward(F32(g, {4}), F32(g, {4}), F32(g, {4}));
  ASSERT_TRUE(executor.ok());
  const uint64_t handle = executor->handle();
  absl::Status unknown_stream = s.ExecuteHandle(handle, 12345, 0, 0, 0);
  EXPECT_EQ(unknown_stream.code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(executor->Execute().ok());
  absl::Status again = s.ExecuteHandle(handle, 0, 0, 0, 0);
  EXPECT_EQ(GetAclnnStatus(again), kernels::kAclnnErrInnerNullptr) << again;
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  const uint64_t buffer = g.handle();
  ASSERT_TRUE(g.Free().ok());
  absl::Status twice = s.FreeBuffer(buffer);
  EXPECT_EQ(twice.code(), absl::StatusCode::kNotFound) << twice;
  EXPECT_TRUE(s.Synchronize().ok());
}

// A raw channel (what a hostile or buggy client sends): commands the server
// refuses become deferred errors of the session or stream, never a crash,
// and the channel goes on.
TEST_F(PipelineTest, RawChannelRefusalsAreDeferredNotFatal) {
  Session& s = *piped_.session;
  auto buffer = s.Malloc(64);
  ASSERT_TRUE(buffer.ok());
  grpc::ClientContext context;
  auto stream = piped_.client->operators().Pipeline(&context);
  v1::PipelineRequest open;
  open.set_session(s.token());
  ASSERT_TRUE(stream->Write(open));
  v1::PipelineEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.acknowledged(), 0u);

  v1::PipelineRequest batch;
  batch.add_commands();                           // Empty.
  batch.add_commands()->set_free(77777);          // Unknown buffer.
  batch.add_commands()->set_destroy_executor(5);  // Unknown executor.
  v1::PlanCommand* reused = batch.add_commands()->mutable_plan();
  reused->set_executor(3);  // Below 2^62: not a client id.
  reused->mutable_request()->set_op("HardswishBackward");
  (*reused->mutable_request()->mutable_tensors())["gradOutput"] =
      Desc(buffer->handle(), v1::FLOAT, {4});
  (*reused->mutable_request()->mutable_tensors())["self"] =
      Desc(buffer->handle(), v1::FLOAT, {4});
  (*reused->mutable_request()->mutable_tensors())["out"] =
      Desc(buffer->handle(), v1::FLOAT, {4});
  v1::ExecuteRequest* launch = batch.add_commands()->mutable_launch();
  launch->set_executor(3);
  launch->set_stream(0);
  v1::FenceCommand* stream_fence = batch.add_commands()->mutable_fence();
  stream_fence->set_id(1);
  v1::FenceCommand* session_fence = batch.add_commands()->mutable_fence();
  session_fence->set_id(2);
  session_fence->set_session(true);
  v1::FenceCommand* again = batch.add_commands()->mutable_fence();
  again->set_id(3);
  again->set_session(true);
  ASSERT_TRUE(stream->Write(batch));
  std::map<uint64_t, v1::FenceResult> fences;
  uint64_t acknowledged = 0;
  while (fences.size() < 3 || acknowledged < 8) {
    ASSERT_TRUE(stream->Read(&event));
    acknowledged = event.acknowledged();
    for (const auto& f : event.fences()) fences[f.id()] = f;
  }
  EXPECT_EQ(acknowledged, 8u);
  // The launch of the refused plan failed the default stream with the
  // plan's error (161002).
  EXPECT_EQ(fences[1].aclnn_status(), 161002) << fences[1].message();
  EXPECT_THAT(fences[1].message(), HasSubstr("2^62"));
  // The session's first deferred error: the empty command.
  EXPECT_EQ(fences[2].code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument))
      << fences[2].message();
  // Reported once: the later ones were not kept behind it.
  EXPECT_EQ(fences[3].code(), 0) << fences[3].message();
  stream->WritesDone();
  while (stream->Read(&event)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
  // The session is unharmed.
  EXPECT_TRUE(s.Malloc(64).ok());
}

// A fence the server answers inline (on an idle stream, after a replay
// that ran inline on the Pipeline worker) leaves in the same event (one
// write) as its batch's acknowledgement: each write is a wake-up of the
// server's threads, and before, such a batch took two (the fence's result,
// then the acknowledgement alone).
TEST_F(PipelineTest, AFenceAnsweredInlineLeavesWithItsBatchsAcknowledgement) {
  Session& s = *piped_.session;
  auto buffer = s.Malloc(64);
  ASSERT_TRUE(buffer.ok());
  grpc::ClientContext context;
  auto stream = piped_.client->operators().Pipeline(&context);
  v1::PipelineRequest open;
  open.set_session(s.token());
  ASSERT_TRUE(stream->Write(open));
  v1::PipelineEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.acknowledged(), 0u);

  // A graph of one small memset on the default stream: its replay runs on
  // the worker that applies it (the stream is idle), and so is the fence
  // behind it answered there.
  constexpr uint64_t kGraph = uint64_t{1} << 62;
  v1::PipelineRequest define;
  v1::DefineGraphCommand* graph = define.add_commands()->mutable_define_graph();
  graph->set_graph(kGraph);
  v1::MemsetRequest* memset = graph->add_tasks()->mutable_memset();
  memset->set_buffer(buffer->handle());
  memset->set_size(64);
  memset->set_value(7);
  ASSERT_TRUE(stream->Write(define));
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.acknowledged(), 1u);
  EXPECT_EQ(event.fences_size(), 0);

  uint64_t acknowledged = 1;
  for (uint64_t fence = 1; fence <= 3; ++fence) {
    SCOPED_TRACE(fence);
    v1::PipelineRequest step;
    v1::ReplayGraphRequest* replay =
        step.add_commands()->mutable_replay_graph();
    replay->set_graph(kGraph);
    step.add_commands()->mutable_fence()->set_id(fence);
    acknowledged += 2;
    ASSERT_TRUE(stream->Write(step));
    // One event: the fence's result and the batch's acknowledgement. A
    // second event of this batch would be read as the next step's first.
    ASSERT_TRUE(stream->Read(&event));
    ASSERT_EQ(event.fences_size(), 1) << event.DebugString();
    EXPECT_EQ(event.fences(0).id(), fence);
    EXPECT_EQ(event.fences(0).code(), 0) << event.fences(0).message();
    EXPECT_EQ(event.acknowledged(), acknowledged) << event.DebugString();
  }
  stream->WritesDone();
  // Nothing more was written for those batches.
  EXPECT_FALSE(stream->Read(&event)) << event.DebugString();
  EXPECT_TRUE(stream->Finish().ok());
  std::vector<uint8_t> bytes(64);
  ASSERT_TRUE(s.Download(buffer->handle(), 0, bytes.data(), 64).ok());
  EXPECT_EQ(bytes, std::vector<uint8_t>(64, 7));
}

TEST_F(PipelineTest, ChannelOnAnotherSessionIsNotFound) {
  grpc::ClientContext context;
  auto stream = piped_.client->operators().Pipeline(&context);
  v1::PipelineRequest open;
  open.set_session("no-such-session");
  ASSERT_TRUE(stream->Write(open));
  v1::PipelineEvent event;
  EXPECT_FALSE(stream->Read(&event));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

// SIGTERM's path with a client waiting: synchronizing a stream with seconds
// of queued work (a pipelined fence or a unary SynchronizeStream), or with
// its channel waiting for room in a full stream. Server destruction ends
// soon after the grace (the queued work is then cancelled; before, a
// waiting synchronize held it until the whole queue had run), and the
// waiting call returns an error.
// (max_queued_per_stream, pipelined client)
class PipelineShutdownTest
    : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(PipelineShutdownTest, ShutdownEndsWaitingFencesAndBlockedChannels) {
  opserver::Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  options.shutdown_grace = absl::Milliseconds(300);
  // 8: the channel waits for room; 16384: the fence waits for the queue.
  options.session_limits.max_queued_per_stream = std::get<0>(GetParam());
  auto server = opserver::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ConnectOptions connect;
  connect.pipeline = std::get<1>(GetParam());
  auto client = Client::Connect((*server)->address(), connect);
  ASSERT_TRUE(client.ok());
  auto session = (*client)->CreateSession("shutdown", /*attach=*/false);
  ASSERT_TRUE(session.ok());
  Session& s = **session;
  ASSERT_EQ(s.pipelined(), connect.pipeline);
  constexpr int64_t kN = int64_t{1} << 24;  // 64 MiB: milliseconds a launch.
  auto big = s.Malloc(kN * 4);
  ASSERT_TRUE(big.ok());
  TensorDesc t = TensorDesc::Contiguous(big->handle(), DType::kFloat, {kN});
  auto executor = s.ThresholdBackward(t, t, 0.5, t);
  ASSERT_TRUE(executor.ok());
  ASSERT_TRUE(executor->SetRepeatable().ok());
  // Unary launches beyond a full queue are refused; that is fine here.
  for (int i = 0; i < 2000; ++i) executor->Execute().IgnoreError();
  absl::Status synchronized;
  std::thread waiter([&] { synchronized = s.Synchronize(); });
  absl::SleepFor(absl::Milliseconds(100));
  server->reset();  // Must return: the test's timeout is the assertion.
  waiter.join();
  // With a long queue the wait was cut short (with 8 launches queued a
  // unary synchronize may simply have finished).
  if (std::get<0>(GetParam()) > 8) {
    EXPECT_FALSE(synchronized.ok());
  }
  executor->Release();
  big->Release();
}

INSTANTIATE_TEST_SUITE_P(QueueLimitsAndPaths, PipelineShutdownTest,
                         ::testing::Combine(::testing::Values(8, 16384),
                                            ::testing::Bool()));

}  // namespace
}  // namespace remote
}  // namespace opserver
