// Graphs end to end through the C++ client (issue 31, part 2): a graph
// defined from recorded commands is not run at definition; its replays are
// bit-identical to the same work run eagerly, for every operator and dtype,
// with views, broadcast and scalars, on the definition stream and another;
// two graphs replay side by side; destroying a graph or closing its session
// with replays queued (on a held stream); a freed buffer; limits; unknown
// handles; the unary calls.

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/validate.h"
#include "server/server.h"

namespace opserver {
namespace remote {
namespace {

using kernels::DType;
using ::testing::HasSubstr;

class GraphE2eTest : public ::testing::Test {
 protected:
  // `fake`: on a FakeDevice, whose streams a test can hold.
  void Start(opserver::Options options = {}, bool fake = false) {
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    options.shutdown_grace = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<opserver::Server>> server;
    if (fake) {
      auto device = std::make_unique<FakeDevice>();
      fake_ = device.get();
      server = opserver::Server::Start(options, std::move(device));
    } else {
      server = opserver::Server::Start(options);
    }
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = Client::Connect(server_->address(), ConnectOptions{});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("graph_e2e_test");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    ASSERT_TRUE(session_->pipelined());
  }

  void TearDown() override {
    if (fake_ != nullptr) {
      for (const auto& record : fake_->streams()) record->ReleaseLaunches();
    }
    session_.reset();
    client_.reset();
    server_.reset();
  }

  DeviceBuffer Bytes(const std::string& bytes) {
    auto buffer = session_->Malloc(bytes.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(
        session_->Upload(buffer->handle(), 0, bytes.data(), bytes.size()).ok());
    return *std::move(buffer);
  }
  std::string Read(const DeviceBuffer& buffer) {
    std::string out(buffer.size(), '\0');
    absl::Status status =
        session_->Download(buffer.handle(), 0, out.data(), out.size());
    EXPECT_TRUE(status.ok()) << status;
    return out;
  }
  static std::vector<float> AsFloats(const std::string& bytes) {
    std::vector<float> v(bytes.size() / sizeof(float));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    return v;
  }
  static std::string FromFloats(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()),
                       v.size() * sizeof(float));
  }

  // out = ThresholdBackward(grad, self, 1.0) over `n` floats, planned now;
  // its launch is recorded (not sent) on `stream`.
  v1::PipelineCommand RecordThreshold(const DeviceBuffer& grad,
                                      const DeviceBuffer& self,
                                      const DeviceBuffer& out, int64_t n,
                                      uint64_t stream = 0) {
    auto desc = [n](const DeviceBuffer& b) {
      return TensorDesc::Contiguous(b.handle(), DType::kFloat, {n});
    };
    absl::StatusOr<Executor> executor =
        session_->ThresholdBackward(desc(grad), desc(self), 1.0, desc(out));
    EXPECT_TRUE(executor.ok()) << executor.status();
    absl::StatusOr<v1::PipelineCommand> launch =
        session_->LaunchCommand(executor->handle(), stream, 0, 0, 0);
    EXPECT_TRUE(launch.ok()) << launch.status();
    executor->Release();  // Consumed into the graph.
    return *std::move(launch);
  }

  // grad = 1..n, self alternating 0 and 2: out = 0, 2, 0, 4, ...
  struct Step {
    DeviceBuffer grad, self, out;
    std::vector<float> expected;
  };
  Step MakeStep(int64_t n, float scale = 1) {
    std::vector<float> grad(n), self(n), expected(n);
    for (int64_t i = 0; i < n; ++i) {
      grad[i] = scale * static_cast<float>(i + 1);
      self[i] = i % 2 == 0 ? 0.0f : 2.0f;
      expected[i] = i % 2 == 0 ? 0.0f : grad[i];
    }
    return Step{Bytes(FromFloats(grad)), Bytes(FromFloats(self)),
                Bytes(std::string(n * sizeof(float), '\xab')),
                std::move(expected)};
  }

  std::unique_ptr<opserver::Server> server_;
  FakeDevice* fake_ = nullptr;  // Owned by server_.
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

// One operator call of the registry: its tensors' descriptors and params.
struct OpCase {
  std::string label;
  std::string op;
  std::string self_name, out_name;  // The registry's tensor names.
  v1::OpParams params;
  DType g, s, o;
  std::vector<int64_t> shape;         // gradOutput's and out's.
  std::vector<int64_t> self_shape;    // self's (or the mask's) view.
  std::vector<int64_t> self_strides;  // Empty: contiguous.
  int64_t self_elements = 0;          // Elements its buffer holds.
};

std::vector<OpCase> EveryOpCase() {
  std::vector<OpCase> cases;
  for (const kernels::OpInfo& op : kernels::OpRegistry()) {
    v1::OpParams params;
    params.set_threshold(0.25);
    params.set_lambd(0.5);
    params.set_scale(2.0);
    params.mutable_negative_slope()->set_dtype(v1::FLOAT);
    params.mutable_negative_slope()->set_value(0.125);
    for (DType g : op.tensors[0].dtypes) {
      if (std::find(op.tensors[2].dtypes.begin(), op.tensors[2].dtypes.end(),
                    g) == op.tensors[2].dtypes.end()) {
        continue;
      }
      const DType s = op.bit_mask_input ? DType::kUint8 : g;
      const std::string name =
          absl::StrCat(op.name, " ", kernels::DTypeName(g));
      const std::string self_name(op.tensors[1].name);
      const std::string out_name(op.tensors[2].name);
      if (op.bit_mask_input) {
        // A bit mask of align(n, 128) / 8 bytes; and a 0-dim call.
        cases.push_back(OpCase{name + " contiguous",
                               std::string(op.name),
                               self_name,
                               out_name,
                               params,
                               g,
                               s,
                               g,
                               {300},
                               {48},
                               {},
                               48});
        cases.push_back(OpCase{name + " scalar",
                               std::string(op.name),
                               self_name,
                               out_name,
                               params,
                               g,
                               s,
                               g,
                               {},
                               {16},
                               {},
                               16});
        continue;
      }
      cases.push_back(OpCase{name + " contiguous",
                             std::string(op.name),
                             self_name,
                             out_name,
                             params,
                             g,
                             s,
                             g,
                             {300},
                             {300},
                             {},
                             300});
      // self broadcast along the rows (stride 0), a strided view of 3x40
      // over a buffer of 40 elements.
      cases.push_back(OpCase{name + " broadcast",
                             std::string(op.name),
                             self_name,
                             out_name,
                             params,
                             g,
                             s,
                             g,
                             {3, 40},
                             {3, 40},
                             {0, 1},
                             40});
      cases.push_back(OpCase{name + " scalar",
                             std::string(op.name),
                             self_name,
                             out_name,
                             params,
                             g,
                             s,
                             g,
                             {},
                             {},
                             {},
                             1});
    }
  }
  return cases;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every operator and dtype: the eager launch and the graph's replays (on
// the definition stream and another) write the same bytes; the definition
// alone writes none.
TEST_F(GraphE2eTest, ReplaysAreBitIdenticalToEagerForEveryOperator) {
  Start();
  absl::StatusOr<Stream> capture = session_->CreateStream();
  absl::StatusOr<Stream> other = session_->CreateStream();
  ASSERT_TRUE(capture.ok() && other.ok());
  std::mt19937 random(31);
  const std::vector<OpCase> cases = EveryOpCase();
  ASSERT_GE(cases.size(), 15u);
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.label);
    const size_t g_bytes = Elements(c.shape) * kernels::DTypeSize(c.g);
    const size_t s_bytes = c.self_elements * kernels::DTypeSize(c.s);
    auto random_bytes = [&](size_t n) {
      std::string bytes(n, '\0');
      // Bytes that make finite values of every float type: small
      // exponents, both signs.
      for (char& b : bytes) b = static_cast<char>(random() & 0x3f);
      return bytes;
    };
    DeviceBuffer grad = Bytes(random_bytes(g_bytes));
    DeviceBuffer self = Bytes(random_bytes(s_bytes));
    const std::string poison(g_bytes, '\xab');
    DeviceBuffer eager = Bytes(poison);
    DeviceBuffer replayed = Bytes(poison);
    auto plan = [&](const DeviceBuffer& out) {
      TensorDesc g = TensorDesc::Contiguous(grad.handle(), c.g, c.shape);
      TensorDesc s = TensorDesc::Contiguous(self.handle(), c.s, c.self_shape);
      if (!c.self_strides.empty()) {
        s.strides = c.self_strides;
        s.storage_shape = {c.self_elements};
      }
      TensorDesc o = TensorDesc::Contiguous(out.handle(), c.o, c.shape);
      return session_->GetWorkspaceSize(
          c.op, c.params,
          {{"gradOutput", g}, {c.self_name, s}, {c.out_name, o}});
    };
    absl::StatusOr<Executor> eager_plan = plan(eager);
    ASSERT_TRUE(eager_plan.ok()) << eager_plan.status();
    ASSERT_TRUE(eager_plan->Execute(0).ok());
    absl::StatusOr<Executor> graph_plan = plan(replayed);
    ASSERT_TRUE(graph_plan.ok()) << graph_plan.status();
    absl::StatusOr<v1::PipelineCommand> launch = session_->LaunchCommand(
        graph_plan->handle(), capture->handle(), 0, 0, 0);
    ASSERT_TRUE(launch.ok()) << launch.status();
    graph_plan->Release();
    absl::StatusOr<uint64_t> graph = session_->DefineGraph({*launch});
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(session_->Flush().ok());
    const std::string expected = Read(eager);
    ASSERT_NE(expected, poison);
    EXPECT_EQ(Read(replayed), poison) << "the definition ran";
    ASSERT_TRUE(session_->ReplayGraph(*graph, capture->handle()).ok());
    ASSERT_TRUE(session_->Synchronize(capture->handle()).ok());
    EXPECT_EQ(Read(replayed), expected);
    ASSERT_TRUE(session_->Memset(replayed.handle(), 0, g_bytes, 0xab).ok());
    ASSERT_TRUE(session_->Synchronize(0).ok());
    ASSERT_EQ(Read(replayed), poison);
    ASSERT_TRUE(session_->ReplayGraph(*graph, other->handle()).ok());
    ASSERT_TRUE(session_->Synchronize(other->handle()).ok());
    EXPECT_EQ(Read(replayed), expected);
    ASSERT_TRUE(session_->DestroyGraph(*graph).ok());
  }
  ASSERT_TRUE(session_->Flush().ok());
  absl::StatusOr<v1::SessionStats> stats = session_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->graphs(), 0u);
  EXPECT_EQ(stats->executors(), 0u);
}

// Two graphs alive at once, each replayed on its own stream, interleaved,
// with a memset, a copy and a write recorded among the launches.
TEST_F(GraphE2eTest, TwoGraphsReplaySideBySide) {
  Start();
  absl::StatusOr<Stream> s1 = session_->CreateStream();
  absl::StatusOr<Stream> s2 = session_->CreateStream();
  ASSERT_TRUE(s1.ok() && s2.ok());
  constexpr int64_t kN = 512;
  Step a = MakeStep(kN, 1);
  Step b = MakeStep(kN, -3);
  DeviceBuffer copy_a = Bytes(std::string(kN * 4, '\0'));
  DeviceBuffer copy_b = Bytes(std::string(kN * 4, '\0'));
  auto define = [&](Step& step, DeviceBuffer& copy, uint64_t stream) {
    std::vector<v1::PipelineCommand> tasks;
    tasks.push_back(
        *session_->MemsetCommand(step.out.handle(), 0, kN * 4, 0, stream));
    tasks.push_back(
        RecordThreshold(step.grad, step.self, step.out, kN, stream));
    tasks.push_back(*session_->CopyCommand(copy.handle(), 0, step.out.handle(),
                                           0, kN * 4, stream));
    const float marker = 7.5f;
    tasks.push_back(*session_->WriteCommand(copy.handle(), 0, &marker,
                                            sizeof(marker), stream));
    absl::StatusOr<uint64_t> graph = session_->DefineGraph(std::move(tasks));
    EXPECT_TRUE(graph.ok()) << graph.status();
    return *graph;
  };
  const uint64_t ga = define(a, copy_a, s1->handle());
  const uint64_t gb = define(b, copy_b, s2->handle());
  ASSERT_TRUE(session_->Flush().ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(session_->ReplayGraph(ga, s1->handle()).ok());
    ASSERT_TRUE(session_->ReplayGraph(gb, s2->handle()).ok());
  }
  ASSERT_TRUE(session_->Synchronize(s1->handle()).ok());
  ASSERT_TRUE(session_->Synchronize(s2->handle()).ok());
  EXPECT_EQ(AsFloats(Read(a.out)), a.expected);
  EXPECT_EQ(AsFloats(Read(b.out)), b.expected);
  std::vector<float> copied = AsFloats(Read(copy_b));
  EXPECT_EQ(copied[0], 7.5f);
  EXPECT_EQ(copied[1], b.expected[1]);
  EXPECT_EQ(copied[kN - 1], b.expected[kN - 1]);
  absl::StatusOr<v1::SessionStats> stats = session_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->graphs(), 2u);
  EXPECT_EQ(stats->graph_tasks(), 8u);
}

// Held launches keep the first replay running and the second queued while
// the graph is destroyed: both still run, on memory the graph kept.
TEST_F(GraphE2eTest, DestroyWithReplaysQueued) {
  Start({}, /*fake=*/true);
  absl::StatusOr<Stream> stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::shared_ptr<FakeStreamRecord> record = fake_->streams().back();
  constexpr int64_t kN = 20000;
  Step step = MakeStep(kN);
  absl::StatusOr<uint64_t> graph = session_->DefineGraph(
      {RecordThreshold(step.grad, step.self, step.out, kN, stream->handle())});
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(session_->Flush().ok());
  record->HoldLaunches();
  ASSERT_TRUE(session_->ReplayGraph(*graph, stream->handle()).ok());
  ASSERT_TRUE(session_->ReplayGraph(*graph, stream->handle()).ok());
  // The first replay's launch is held: the second is queued behind it.
  for (int i = 0; i < 60000 && record->WaitingLaunches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(record->WaitingLaunches(), 1);
  ASSERT_TRUE(session_->DestroyGraph(*graph).ok());
  // (No Flush: a session fence would wait for the held stream.)
  absl::StatusOr<v1::SessionStats> stats = session_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->graphs(), 0u);
  EXPECT_EQ(session_->ReplayGraph(*graph, stream->handle()).code(),
            absl::StatusCode::kNotFound);
  record->ReleaseLaunches();
  ASSERT_TRUE(session_->Synchronize(stream->handle()).ok());
  EXPECT_EQ(record->launches.load(), 2);
  EXPECT_EQ(AsFloats(Read(step.out)), step.expected);
}

// Closing the session (and shutting the server down) with replays running
// and queued ends them: nothing waits for the held launch, nothing is
// touched after the session's memory went (ASan).
TEST_F(GraphE2eTest, CloseSessionAndShutdownWithReplaysQueued) {
  Start({}, /*fake=*/true);
  absl::StatusOr<Stream> stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::shared_ptr<FakeStreamRecord> record = fake_->streams().back();
  constexpr int64_t kN = 20000;
  Step step = MakeStep(kN);
  absl::StatusOr<uint64_t> graph = session_->DefineGraph(
      {RecordThreshold(step.grad, step.self, step.out, kN, stream->handle())});
  ASSERT_TRUE(graph.ok());
  record->HoldLaunches();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(session_->ReplayGraph(*graph, stream->handle()).ok());
  }
  for (int i = 0; i < 60000 && record->WaitingLaunches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(record->WaitingLaunches(), 1);
  step = Step{};  // The client's handles go first: the graph holds them.
  // CloseSession itself: the client's Close would first wait for the held
  // stream (a session fence).
  {
    auto runtime = v1::Runtime::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::CloseSessionRequest request;
    request.set_session(session_->token());
    v1::CloseSessionResponse response;
    ASSERT_TRUE(runtime->CloseSession(&context, request, &response).ok());
  }
  stream->Release();  // Gone with its session.
  session_.reset();
  // A second session with a graph replaying on a held stream, cut off by
  // shutdown.
  auto second = client_->CreateSession("second");
  ASSERT_TRUE(second.ok());
  session_ = *std::move(second);
  absl::StatusOr<Stream> held = session_->CreateStream();
  ASSERT_TRUE(held.ok());
  std::shared_ptr<FakeStreamRecord> held_record = fake_->streams().back();
  Step again = MakeStep(kN);
  absl::StatusOr<uint64_t> g2 = session_->DefineGraph(
      {RecordThreshold(again.grad, again.self, again.out, kN, held->handle())});
  ASSERT_TRUE(g2.ok());
  held_record->HoldLaunches();
  ASSERT_TRUE(session_->ReplayGraph(*g2, held->handle()).ok());
  ASSERT_TRUE(session_->ReplayGraph(*g2, held->handle()).ok());
  for (int i = 0; i < 60000 && held_record->WaitingLaunches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(held_record->WaitingLaunches(), 1);
  again = Step{};
  held->Release();
  server_->Shutdown();
  session_.reset();
  client_.reset();
  server_.reset();  // Returns: nothing waits on the held launch.
  fake_ = nullptr;
}

TEST_F(GraphE2eTest, AReplayAfterAFreeIsTheStreamsError) {
  Start();
  constexpr int64_t kN = 64;
  Step step = MakeStep(kN);
  absl::StatusOr<uint64_t> graph = session_->DefineGraph(
      {RecordThreshold(step.grad, step.self, step.out, kN)});
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(session_->Flush().ok());
  const uint64_t out = step.out.handle();
  ASSERT_TRUE(step.out.Free().ok());
  // A new buffer, maybe at the freed one's address: never written.
  DeviceBuffer fresh = Bytes(std::string(kN * 4, '\x11'));
  ASSERT_TRUE(session_->ReplayGraph(*graph).ok());
  absl::Status error = session_->Synchronize(0);
  EXPECT_EQ(error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(error.message(),
              HasSubstr(absl::StrCat("replay of graph ", *graph,
                                     ": task 1 of 1: buffer ", out,
                                     " was freed after the graph was "
                                     "defined")));
  EXPECT_EQ(Read(fresh), std::string(kN * 4, '\x11'));
}

TEST_F(GraphE2eTest, LimitsAndUnknownHandles) {
  opserver::Options options;
  options.session_limits.max_graphs_per_session = 1;
  options.session_limits.max_graph_tasks_per_session = 4;
  Start(options);
  constexpr int64_t kN = 64;
  Step step = MakeStep(kN);
  absl::StatusOr<uint64_t> first = session_->DefineGraph(
      {*session_->MemsetCommand(step.out.handle(), 0, 4, 0, 0)});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(session_->Flush().ok());
  absl::StatusOr<uint64_t> second = session_->DefineGraph(
      {*session_->MemsetCommand(step.out.handle(), 0, 4, 0, 0)});
  ASSERT_TRUE(second.ok());  // Refused by the server: the session's error.
  absl::Status error = session_->Flush();
  EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(error.message(), HasSubstr("--max_graphs_per_session"));
  ASSERT_TRUE(session_->DestroyGraph(*first).ok());
  std::vector<v1::PipelineCommand> five(
      5, *session_->MemsetCommand(step.out.handle(), 0, 4, 0, 0));
  ASSERT_TRUE(session_->DefineGraph(five).ok());
  error = session_->Flush();
  EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(error.message(),
              HasSubstr("a graph of 5 tasks is over the limit of 4"));
  // A handle the server does not know, in a task the client did not
  // check: the whole definition is refused.
  v1::PipelineCommand unknown;
  unknown.mutable_memset()->set_buffer(999999);
  unknown.mutable_memset()->set_size(4);
  absl::StatusOr<uint64_t> bad = session_->DefineGraph(
      {*session_->MemsetCommand(step.out.handle(), 0, 4, 0, 0), unknown});
  ASSERT_TRUE(bad.ok());
  error = session_->Flush();
  EXPECT_EQ(error.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(error.message(),
              HasSubstr(absl::StrCat("DefineGraph ", *bad,
                                     ": task 2 of 2: no buffer 999999")));
  absl::StatusOr<v1::SessionStats> stats = session_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->graphs(), 0u);
  // The refused graph's replay: the client cannot know, the server's
  // refusal is the stream's error.
  ASSERT_TRUE(session_->ReplayGraph(*bad).ok());
  error = session_->Synchronize(0);
  EXPECT_EQ(error.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(error.message(),
              HasSubstr(absl::StrCat("ReplayGraph: no graph ", *bad)));
  // The client refuses what it knows is wrong, at once.
  EXPECT_EQ(session_->ReplayGraph(*bad + 100).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DestroyGraph(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DefineGraph({}).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::PipelineCommand fence;
  fence.mutable_fence()->set_session(true);
  EXPECT_EQ(session_->DefineGraph({fence}).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::PipelineCommand big;
  big.mutable_write()->set_data(std::string(kMaxGraphDefinitionBytes, 'x'));
  EXPECT_EQ(session_->DefineGraph({big}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(session_->Flush().ok());
}

// ListGraphs, DescribeGraph, ReplayGraph and DestroyGraph, as grpcurl
// would call them.
TEST_F(GraphE2eTest, UnaryCalls) {
  Start();
  constexpr int64_t kN = 64;
  Step step = MakeStep(kN);
  absl::StatusOr<uint64_t> graph = session_->DefineGraph(
      {*session_->MemsetCommand(step.out.handle(), 0, kN * 4, 0, 0),
       RecordThreshold(step.grad, step.self, step.out, kN)});
  ASSERT_TRUE(graph.ok());
  ASSERT_TRUE(session_->Flush().ok());
  auto stub = v1::Operators::NewStub(grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::ListGraphsRequest request;
    request.set_session(session_->token());
    v1::ListGraphsResponse response;
    ASSERT_TRUE(stub->ListGraphs(&context, request, &response).ok());
    ASSERT_EQ(response.graphs_size(), 1);
    EXPECT_EQ(response.graphs(0).graph(), *graph);
    EXPECT_EQ(response.graphs(0).tasks(), 2u);
    EXPECT_EQ(response.graphs(0).replays(), 0u);
  }
  {
    grpc::ClientContext context;
    v1::ReplayGraphRequest request;
    request.set_session(session_->token());
    request.set_graph(*graph);
    v1::ReplayGraphResponse response;
    ASSERT_TRUE(stub->ReplayGraph(&context, request, &response).ok());
  }
  ASSERT_TRUE(session_->Synchronize(0).ok());
  EXPECT_EQ(AsFloats(Read(step.out)), step.expected);
  {
    grpc::ClientContext context;
    v1::DescribeGraphRequest request;
    request.set_session(session_->token());
    request.set_graph(*graph);
    v1::DescribeGraphResponse response;
    ASSERT_TRUE(stub->DescribeGraph(&context, request, &response).ok());
    EXPECT_EQ(response.info().replays(), 1u);
    EXPECT_EQ(response.info().pending_replays(), 0u);
    ASSERT_EQ(response.tasks_size(), 2);
    EXPECT_EQ(response.tasks(0),
              absl::StrCat("1: memset buffer ", step.out.handle(),
                           " [0, +256) to 0 (stream 0)"));
    EXPECT_THAT(response.tasks(1),
                HasSubstr("2: launch ThresholdBackward FLOAT[64] (executor "));
  }
  {
    grpc::ClientContext context;
    v1::ReplayGraphRequest request;
    request.set_session(session_->token());
    request.set_graph(*graph + 1);
    v1::ReplayGraphResponse response;
    grpc::Status status = stub->ReplayGraph(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), HasSubstr("no graph"));
  }
  {
    grpc::ClientContext context;
    v1::DestroyGraphRequest request;
    request.set_session(session_->token());
    request.set_graph(*graph);
    v1::DestroyGraphResponse response;
    ASSERT_TRUE(stub->DestroyGraph(&context, request, &response).ok());
  }
  {
    grpc::ClientContext context;
    v1::DescribeGraphRequest request;
    request.set_session(session_->token());
    request.set_graph(*graph);
    v1::DescribeGraphResponse response;
    EXPECT_EQ(stub->DescribeGraph(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    // Another session's token names nothing.
    grpc::ClientContext context;
    v1::ListGraphsRequest request;
    request.set_session("no-such-session");
    v1::ListGraphsResponse response;
    EXPECT_EQ(stub->ListGraphs(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
}

}  // namespace
}  // namespace remote
}  // namespace opserver
