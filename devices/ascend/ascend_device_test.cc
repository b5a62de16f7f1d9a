// AscendDevice against a fake CANN (fake_cann.cc, loaded with dlmopen as
// CANN would be): the calls it makes and their order, the tensors it
// describes, CANN's failures as the client sees them, and nothing CANN
// handed out left behind once sessions close.
#include "devices/ascend/ascend_device.h"

#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "devices/ascend/cann_library.h"
#include "gmock/gmock.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "proto/opserver.pb.h"
#include "server/server.h"
#include "server/upload_parser.h"

namespace opserver::ascend {
namespace {

using kernels::DType;
using remote::TensorDesc;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A library of the test's runfiles, as an absolute path (dlmopen reads a
// relative one against the working directory, which is the runfiles root).
std::string Runfile(const std::string& name) {
  char cwd[4096];
  return std::string(getcwd(cwd, sizeof(cwd))) + "/devices/ascend/" + name;
}

// One fake CANN for the whole binary: CANN is initialized once per process,
// and each load takes one of the few link-map namespaces glibc has.
std::shared_ptr<CannLibrary> Fake() {
  static std::shared_ptr<CannLibrary>* cann = [] {
    auto loaded = CannLibrary::Load({Runfile("libfake_cann.so")});
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return new std::shared_ptr<CannLibrary>(loaded.ok() ? *loaded : nullptr);
  }();
  return *cann;
}

// The fake's view, through its fake_cann_* functions.
class FakeControl {
 public:
  explicit FakeControl(const CannLibrary& cann) : cann_(cann) {}
  void Reset() { Fn<void (*)()>("fake_cann_reset")(); }
  int64_t Live(const char* kind) {
    return Fn<int64_t (*)(const char*)>("fake_cann_live")(kind);
  }
  std::vector<std::string> Log() {
    return absl::StrSplit(Fn<const char* (*)()>("fake_cann_log")(), '\n',
                          absl::SkipEmpty());
  }
  void FailNext(const char* function, int code, const char* message) {
    Fn<void (*)(const char*, int, const char*)>("fake_cann_fail_next")(
        function, code, message);
  }
  void SetWorkspace(uint64_t bytes) {
    Fn<void (*)(uint64_t)>("fake_cann_set_workspace")(bytes);
  }
  void SetMemInfo(size_t free, size_t total) {
    Fn<void (*)(size_t, size_t)>("fake_cann_set_mem_info")(free, total);
  }
  // The gate on host<->device copies (fake_cann.cc).
  void HoldHostCopies(bool on) {
    Fn<void (*)(int)>("fake_cann_hold_host_copies")(on ? 1 : 0);
  }
  void PermitHostCopies(int count) {
    Fn<void (*)(int)>("fake_cann_permit_host_copies")(count);
  }
  int HeldHostCopies() { return Fn<int (*)()>("fake_cann_held_host_copies")(); }
  // Whether an aclrtMallocHost block starts with `bytes`.
  bool HostHolds(absl::string_view bytes) {
    return Fn<int (*)(const void*, size_t)>("fake_cann_host_holds")(
               bytes.data(), bytes.size()) != 0;
  }
  // The log lines that start with one of `prefixes`, in order.
  std::vector<std::string> Calls(const std::vector<std::string>& prefixes) {
    std::vector<std::string> out;
    for (const std::string& line : Log()) {
      for (const std::string& p : prefixes) {
        if (absl::StartsWith(line, p)) {
          out.push_back(line);
          break;
        }
      }
    }
    return out;
  }

 private:
  template <class F>
  F Fn(const char* name) {
    void* f = cann_.Lookup(name);
    EXPECT_NE(f, nullptr) << name;
    return reinterpret_cast<F>(f);
  }
  const CannLibrary& cann_;
};

// A server whose device is an AscendDevice on `cann`, and a session on it.
class AscendServer {
 public:
  explicit AscendServer(std::shared_ptr<CannLibrary> cann,
                        uint64_t memory_bytes = 0,
                        uint64_t memory_cache_bytes = 1 << 20,
                        uint64_t chunk_bytes = 4 << 20,
                        const remote::ConnectOptions& connect = {},
                        uint64_t staging_chunk_bytes = 0) {
    auto device = AscendDevice::Create(std::move(cann), 0, memory_bytes,
                                       memory_cache_bytes);
    EXPECT_TRUE(device.ok()) << device.status();
    if (!device.ok()) return;
    device_ = device->get();
    Options options;
    options.listen = "127.0.0.1:0";
    options.transfer_limits.chunk_bytes = chunk_bytes;
    // 0: the data path stages in chunk_bytes too.
    options.transfer_limits.staging_chunk_bytes =
        staging_chunk_bytes != 0 ? staging_chunk_bytes : chunk_bytes;
    auto server = Server::Start(options, *std::move(device));
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    auto client = remote::Client::Connect(server_->address(), connect);
    EXPECT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  ~AscendServer() {
    client_.reset();
    server_.reset();
  }
  remote::Client& client() { return *client_; }
  AscendDevice* device() { return device_; }
  std::unique_ptr<remote::Session> Session() {
    auto session = client_->CreateSession("ascend_device_test");
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

 private:
  AscendDevice* device_ = nullptr;  // Owned by server_.
  std::unique_ptr<Server> server_;
  std::unique_ptr<remote::Client> client_;
};

class AscendDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(Fake(), nullptr);
    fake_.Reset();
  }
  // Everything CANN handed out was given back.
  void ExpectNothingLive() {
    for (const char* kind : {"tensor", "scalar", "executor", "allocation",
                             "stream", "context", "model", "host"}) {
      EXPECT_EQ(fake_.Live(kind), 0) << kind;
    }
  }
  FakeControl fake_{*Fake()};
};

// CANN's C library sets its character tables only on the threads it
// starts and the one that loaded it. The server's other threads call CANN
// too (every launch and transfer does): a character test there read
// address 2 * c, which crashed the chain's front when libaclnn_remote.so
// opened a connection from a server thread.
TEST(CannLibraryTest, CannCodeClassifiesCharactersOnAThreadTheServerStarted) {
  std::shared_ptr<CannLibrary> cann = Fake();
  ASSERT_NE(cann, nullptr);
  const auto is_alpha =
      reinterpret_cast<int (*)(int)>(cann->Lookup("fake_cann_is_alpha"));
  ASSERT_NE(is_alpha, nullptr);
  uint32_t devices = 0;
  int letter = -1;
  int digit = -1;
  std::thread([&] {
    if (cann->api().aclrtGetDeviceCount(&devices) != ACL_SUCCESS) return;
    letter = is_alpha('d');
    digit = is_alpha('7');
  }).join();
  EXPECT_GT(devices, 0u);
  EXPECT_EQ(letter, 1);
  EXPECT_EQ(digit, 0);
}

TEST_F(AscendDeviceTest, DescribesTheNpu) {
  fake_.SetMemInfo(3u << 20, 8u << 20);
  {
    auto device = AscendDevice::Create(Fake(), 2, /*memory_bytes=*/0, 0);
    ASSERT_TRUE(device.ok()) << device.status();
    DeviceDescription d = (*device)->Describe();
    EXPECT_EQ(d.kind, "ascend");
    EXPECT_EQ(d.name, "FakeAscend910B (NPU 2)");
    // What CANN reports free, unless the flag asks for less.
    EXPECT_EQ(d.memory_bytes, 3u << 20);
    auto smaller = AscendDevice::Create(Fake(), 1, 1u << 20, 0);
    ASSERT_TRUE(smaller.ok()) << smaller.status();
    EXPECT_EQ((*smaller)->Describe().memory_bytes, 1u << 20);
    auto larger = AscendDevice::Create(Fake(), 1, 1u << 30, 0);
    ASSERT_TRUE(larger.ok()) << larger.status();
    EXPECT_EQ((*larger)->Describe().memory_bytes, 3u << 20);
  }
  EXPECT_THAT(fake_.Calls({"aclrtSetDevice", "aclrtCreateContext",
                           "aclrtDestroyContext", "aclrtResetDevice"}),
              ElementsAre("aclrtSetDevice 2", "aclrtCreateContext 2",
                          "aclrtSetDevice 1", "aclrtCreateContext 1",
                          "aclrtSetDevice 1", "aclrtCreateContext 1",
                          "aclrtDestroyContext", "aclrtResetDevice 1",
                          "aclrtDestroyContext", "aclrtResetDevice 1",
                          "aclrtDestroyContext", "aclrtResetDevice 2"));
  EXPECT_FALSE(AscendDevice::Create(Fake(), 9, 0, 0).ok());
  ExpectNothingLive();
}

TEST_F(AscendDeviceTest, MemoryIsZeroedCappedAndFreed) {
  {
    AscendServer server(Fake(), /*memory_bytes=*/1 << 20);
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto buffer = session->Malloc(64);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    // The fake's memory holds 0xAB until aclrtMemset clears it: all of
    // the block, rounded up to the device's granule.
    auto values = session->ReadValues(buffer->handle(), 0, DType::kUint8, 64);
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_EQ(*values, std::vector<double>(64, 0));
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclrtMemset"}),
                ElementsAre("aclrtMalloc 512", "aclrtMemset 512"));
    // Past the cap: refused before CANN is asked.
    auto big = session->Malloc(2 << 20);
    EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
    // CANN's own refusal, with its message.
    fake_.FailNext("aclrtMalloc", 207001, "out of HBM");
    auto refused = session->Malloc(128);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(refused.status().message(), HasSubstr("207001"));
    EXPECT_THAT(refused.status().message(), HasSubstr("out of HBM"));
    ASSERT_TRUE(buffer->Free().ok());
  }
  ExpectNothingLive();
}

TEST_F(AscendDeviceTest, LaunchDescribesEveryViewAndReleasesAfterSync) {
  {
    AscendServer server(Fake());
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto grad = session->Malloc(4096);
    auto self = session->Malloc(4096);
    auto out = session->Malloc(4096);
    ASSERT_TRUE(grad.ok() && self.ok() && out.ok());
    auto stream = session->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    fake_.Reset();
    // gradOutput: a transposed [3, 2] view at element offset 5, 64 bytes
    // into its buffer; self: a [2] row broadcast over it; out: contiguous
    // with an explicit storage shape.
    TensorDesc g{grad->handle(), 64, DType::kFloat, {3, 2}, {1, 3}, 5, {}};
    TensorDesc s{self->handle(), 0, DType::kFloat, {2}, {}, 0, {}};
    TensorDesc o{out->handle(), 0, DType::kFloat, {3, 2}, {}, 0, {8}};
    auto executor = session->ThresholdBackward(g, s, 0.25, o);
    ASSERT_TRUE(executor.ok()) << executor.status();
    ASSERT_TRUE(executor->Execute(stream->handle()).ok());
    ASSERT_TRUE(session->Synchronize(stream->handle()).ok());
    EXPECT_THAT(
        fake_.Calls({"aclCreate", "aclnn", "aclSet", "aclrtSynchronizeStream",
                     "aclDestroy"}),
        ElementsAre(
            "aclCreateTensor dtype=0 shape=[3,2] strides=[1,3] offset=5 "
            "format=2 storage=[11] data=alloc+64",
            "aclCreateTensor dtype=0 shape=[2] strides=[1] offset=0 "
            "format=2 storage=[2] data=alloc+0",
            "aclCreateTensor dtype=0 shape=[3,2] strides=[2,1] offset=0 "
            "format=2 storage=[8] data=alloc+0",
            "aclCreateScalar dtype=0 value=0.25",
            "aclnnThresholdBackwardGetWorkspaceSize workspace=0",
            "aclSetAclOpExecutorRepeatable",
            "aclnnThresholdBackward workspace_size=0 no-workspace",
            "aclrtSynchronizeStream", "aclDestroyTensor", "aclDestroyTensor",
            "aclDestroyTensor", "aclDestroyScalar", "aclDestroyAclOpExecutor"));
    // Every call ran on a thread with the device's context set.
    for (const std::string& line : fake_.Log()) {
      EXPECT_THAT(line, ::testing::Not(HasSubstr("NO CONTEXT")));
    }
  }
  ExpectNothingLive();
}

// A repeatable executor is planned by CANN once, at its first launch, and
// every later launch (from any stream) reuses the same aclnn executor; its
// CANN objects go when the executor is released and its launches are done.
TEST_F(AscendDeviceTest, ARepeatableExecutorIsPlannedOnceAndReused) {
  {
    AscendServer server(Fake());
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto a = session->Malloc(64);
    ASSERT_TRUE(a.ok());
    auto t = TensorDesc::Contiguous(a->handle(), DType::kFloat, {4});
    auto stream = session->CreateStream();
    ASSERT_TRUE(stream.ok());
    fake_.Reset();
    auto executor = session->ThresholdBackward(t, t, 1.0, t);
    ASSERT_TRUE(executor.ok()) << executor.status();
    ASSERT_TRUE(executor->SetRepeatable().ok());
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(executor->Execute(stream->handle()).ok());
      ASSERT_TRUE(executor->Execute().ok());  // And on the default stream.
    }
    ASSERT_TRUE(session->Synchronize(stream->handle()).ok());
    ASSERT_TRUE(session->Synchronize().ok());
    EXPECT_EQ(fake_.Live("executor"), 1) << "kept while the executor is";
    EXPECT_THAT(
        fake_.Calls({"aclCreateTensor",
                     "aclnnThresholdBackwardGetWorkspaceSize",
                     "aclSetAclOpExecutorRepeatable", "aclDestroy"}),
        ElementsAre(HasSubstr("aclCreateTensor"), HasSubstr("aclCreateTensor"),
                    HasSubstr("aclCreateTensor"),
                    HasSubstr("aclnnThresholdBackwardGetWorkspaceSize"),
                    "aclSetAclOpExecutorRepeatable"));
    EXPECT_EQ(fake_.Calls({"aclnnThresholdBackward "}).size(), 10u);
    ASSERT_TRUE(executor->Destroy().ok());
    ASSERT_TRUE(session->Synchronize().ok());
    // Destroyed off the RPC thread (the session's work pool): wait for it.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (fake_.Live("executor") != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(fake_.Live("executor"), 0);
    EXPECT_EQ(fake_.Live("tensor"), 0);
    EXPECT_EQ(fake_.Live("scalar"), 0);
  }
  ExpectNothingLive();
}

TEST_F(AscendDeviceTest, ParametersBecomeScalarsOfTheirDtype) {
  AscendServer server(Fake());
  auto session = server.Session();
  ASSERT_NE(session, nullptr);
  auto a = session->Malloc(64);
  ASSERT_TRUE(a.ok());
  auto t = TensorDesc::Contiguous(a->handle(), DType::kFloat, {4});
  auto mask = TensorDesc::Contiguous(a->handle(), DType::kUint8, {16});
  fake_.Reset();
  ASSERT_TRUE(session->LeakyReluBackward(t, t, {DType::kInt64, 3}, true, t)
                  ->Execute()
                  .ok());
  ASSERT_TRUE(session->DropoutBackward(t, mask, 2.5, t)->Execute().ok());
  ASSERT_TRUE(session->SoftshrinkBackward(t, t, 0.5, t)->Execute().ok());
  ASSERT_TRUE(session->Synchronize().ok());
  EXPECT_THAT(
      fake_.Calls({"aclCreateScalar", "selfIsResult", "scale"}),
      ElementsAre("aclCreateScalar dtype=9 value=3", "selfIsResult=true",
                  "scale=2.5", "aclCreateScalar dtype=0 value=0.5"));
}

TEST_F(AscendDeviceTest, AnExecutorNeedingMoreWorkspaceGetsTheStreamsScratch) {
  {
    AscendServer server(Fake());
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto a = session->Malloc(64);
    ASSERT_TRUE(a.ok());
    auto t = TensorDesc::Contiguous(a->handle(), DType::kFloat, {4});
    fake_.Reset();
    fake_.SetWorkspace(4096);
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    ASSERT_TRUE(session->Synchronize().ok());
    // One scratch for both launches.
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclnnHardswishBackward "}),
                ElementsAre("aclrtMalloc 4096",
                            "aclnnHardswishBackward workspace_size=4096 "
                            "workspace",
                            "aclnnHardswishBackward workspace_size=4096 "
                            "workspace"));
  }
  ExpectNothingLive();
}

TEST_F(AscendDeviceTest, CannFailuresReachTheClientWithTheirStatus) {
  {
    AscendServer server(Fake());
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto a = session->Malloc(64);
    ASSERT_TRUE(a.ok());
    auto t = TensorDesc::Contiguous(a->handle(), DType::kFloat, {4});

    // aclnnXxxGetWorkspaceSize's aclnn status and message are the launch's,
    // reported by the stream.
    fake_.FailNext("aclnnHardswishBackwardGetWorkspaceSize", 161002,
                   "self has an unsupported format");
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    absl::Status planned = session->Synchronize();
    EXPECT_EQ(planned.code(), absl::StatusCode::kInvalidArgument) << planned;
    EXPECT_EQ(kernels::GetAclnnStatus(planned), 161002) << planned;
    EXPECT_THAT(planned.message(),
                HasSubstr("aclnnHardswishBackwardGetWorkspaceSize: self has "
                          "an unsupported format"));

    fake_.FailNext("aclnnHardswishBackward", 561000, "kernel launch failed");
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    absl::Status launched = session->Synchronize();
    EXPECT_EQ(kernels::GetAclnnStatus(launched), 561000) << launched;
    EXPECT_THAT(launched.message(), HasSubstr("kernel launch failed"));

    // An asynchronous fault, found by aclrtSynchronizeStream.
    fake_.FailNext("aclrtSynchronizeStream", 507011, "AI Core exception");
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    absl::Status synced = session->Synchronize();
    EXPECT_EQ(synced.code(), absl::StatusCode::kInternal) << synced;
    EXPECT_EQ(kernels::GetAclnnStatus(synced), 361001) << synced;
    EXPECT_THAT(synced.message(), HasSubstr("aclrtSynchronizeStream"));
    EXPECT_THAT(synced.message(), HasSubstr("507011"));
    EXPECT_THAT(synced.message(), HasSubstr("AI Core exception"));
    // The error was the stream's once: it works again.
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    EXPECT_TRUE(session->Synchronize().ok());

    // No scratch to be had: the executor is released unlaunched.
    fake_.SetWorkspace(1 << 20);
    fake_.FailNext("aclrtMalloc", 207001, "out of HBM");
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    absl::Status scratch = session->Synchronize();
    EXPECT_EQ(scratch.code(), absl::StatusCode::kResourceExhausted) << scratch;
    EXPECT_THAT(scratch.message(), HasSubstr("out of HBM"));
    EXPECT_EQ(fake_.Live("executor"), 0);
  }
  ExpectNothingLive();
}

TEST_F(AscendDeviceTest, TransfersAndStreamsAreCannsAndGoAway) {
  {
    AscendServer server(Fake());
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto a = session->Malloc(1 << 20);
    ASSERT_TRUE(a.ok());
    std::vector<uint8_t> data(1 << 20);
    for (size_t i = 0; i < data.size(); ++i) data[i] = i * 7 + 3;
    auto stream = session->CreateStream();
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(
        session
            ->Upload(a->handle(), 0, data.data(), data.size(), stream->handle())
            .ok());
    std::vector<uint8_t> back(data.size());
    ASSERT_TRUE(session
                    ->Download(a->handle(), 0, back.data(), back.size(),
                               stream->handle())
                    .ok());
    EXPECT_EQ(back, data);
    EXPECT_GE(fake_.Live("stream"), 2);  // The default and the created.
    EXPECT_EQ(fake_.Live("context"), 1);
    fake_.FailNext("aclrtCreateStream", 207000, "no more streams");
    auto refused = session->CreateStream();
    EXPECT_FALSE(refused.ok());
    EXPECT_THAT(refused.status().message(), HasSubstr("no more streams"));
  }
  ExpectNothingLive();
}

TEST_F(AscendDeviceTest, ClosingSessionsLeavesNothingInCann) {
  {
    AscendServer server(Fake());
    for (int i = 0; i < 3; ++i) {
      auto session = server.Session();
      ASSERT_NE(session, nullptr);
      auto a = session->Malloc(256);
      ASSERT_TRUE(a.ok());
      // Left for the session's close to free.
      auto t = TensorDesc::Contiguous(a->Release(), DType::kFloat, {4});
      auto stream = session->CreateStream();
      ASSERT_TRUE(stream.ok());
      auto executor = session->ThresholdBackward(t, t, 1.0, t);
      ASSERT_TRUE(executor.ok());
      ASSERT_TRUE(executor->SetRepeatable().ok());
      for (int j = 0; j < 3; ++j) {
        ASSERT_TRUE(executor->Execute(stream->handle()).ok());
      }
      executor->Release();
      stream->Release();
      // Closed with the launches possibly still queued.
    }
  }
  ExpectNothingLive();
}

// The fake's device memory is host memory: the test reads it directly.
bool AllZero(const void* block, uint64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(block);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Freed buffers are kept for reuse, as on the CPU: reuse within an owner
// calls CANN not at all; a change of owner costs one aclrtMemset, never
// an aclrtMalloc.
TEST_F(AscendDeviceTest, FreedMemoryIsReusedAndZeroedOnlyForAnotherOwner) {
  {
    auto device = AscendDevice::Create(Fake(), 0, 0, /*cache=*/1 << 20);
    ASSERT_TRUE(device.ok()) << device.status();
    AscendDevice& d = **device;
    auto a = d.Allocate(1000, 1);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclrtMemset", "aclrtFree"}),
                ElementsAre("aclrtMalloc 1024", "aclrtMemset 1024"));
    std::memset(*a, 0x5A, 1000);
    d.Deallocate(*a, 1000);
    EXPECT_EQ(d.CachedBytes(), 1024u);
    EXPECT_EQ(d.FreeBytes(), d.Describe().memory_bytes);

    fake_.Reset();
    auto same = d.Allocate(1000, 1);
    ASSERT_TRUE(same.ok());
    EXPECT_EQ(*same, *a);
    EXPECT_EQ(static_cast<unsigned char*>(*same)[999], 0x5A);
    EXPECT_EQ(d.CachedBytes(), 0u);
    EXPECT_EQ(d.FreeBytes(), d.Describe().memory_bytes - 1024);
    d.Deallocate(*same, 1000);
    // Nothing: no aclrtMalloc, no aclrtMemset, no aclrtFree.
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclrtMemset", "aclrtFree"}),
                ElementsAre());

    auto other = d.Allocate(900, 2);
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(*other, *a);
    EXPECT_TRUE(AllZero(*other, 1024));
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclrtMemset", "aclrtFree"}),
                ElementsAre("aclrtMemset 1024"));
    std::memset(*other, 0x77, 900);
    d.Deallocate(*other, 900);

    // Owner 0 (Evaluate's buffers, workspaces) is "anyone": always zeroed.
    fake_.Reset();
    for (int i = 0; i < 2; ++i) {
      auto anyone = d.Allocate(1000, 0);
      ASSERT_TRUE(anyone.ok());
      EXPECT_TRUE(AllZero(*anyone, 1024));
      std::memset(*anyone, 0x33, 1000);
      d.Deallocate(*anyone, 1000);
    }
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclrtMemset", "aclrtFree"}),
                ElementsAre("aclrtMemset 1024", "aclrtMemset 1024"));
    for (const std::string& line : fake_.Log()) {
      EXPECT_THAT(line, ::testing::Not(HasSubstr("NO CONTEXT")));
    }
    EXPECT_EQ(fake_.Live("allocation"), 1);  // The cached block.
  }
  ExpectNothingLive();
}

// The cache holds at most its cap, and gives way (aclrtFree) when an
// allocation or the stream scratch needs its bytes: buffers in use,
// scratch and cache stay within the capacity.
TEST_F(AscendDeviceTest, TheCacheRespectsItsCapAndTheCapacity) {
  {
    auto device = AscendDevice::Create(Fake(), 0, /*memory_bytes=*/8192,
                                       /*cache=*/4096);
    ASSERT_TRUE(device.ok()) << device.status();
    AscendDevice& d = **device;
    auto a = d.Allocate(3000, 1);
    auto b = d.Allocate(2000, 1);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(d.FreeBytes(), 8192u - 3072 - 2048);
    fake_.Reset();
    d.Deallocate(*b, 2000);
    EXPECT_EQ(d.CachedBytes(), 2048u);
    // 5120 bytes would pass the cap of 4096: the largest block goes.
    d.Deallocate(*a, 3000);
    EXPECT_EQ(d.CachedBytes(), 2048u);
    EXPECT_EQ(d.FreeBytes(), 8192u);
    EXPECT_THAT(fake_.Calls({"aclrtFree"}), ElementsAre("aclrtFree"));

    // 7168 fresh bytes fit beside no cache: the 2048 cached ones go first.
    fake_.Reset();
    auto c = d.Allocate(7000, 2);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_THAT(
        fake_.Calls({"aclrtMalloc", "aclrtFree", "aclrtMemset"}),
        ElementsAre("aclrtFree", "aclrtMalloc 7168", "aclrtMemset 7168"));
    EXPECT_EQ(d.CachedBytes(), 0u);
    EXPECT_EQ(d.FreeBytes(), 1024u);
    auto refused = d.Allocate(2000, 2);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(refused.status().message(), HasSubstr("aclrtGetMemInfo"));
    d.Deallocate(*c, 7000);
    EXPECT_EQ(d.CachedBytes(), 0u);  // 7168 is more than the cap.

    // Stream scratch (outside the cache) counts in the same capacity.
    auto e = d.Allocate(4000, 1);
    ASSERT_TRUE(e.ok());
    d.Deallocate(*e, 4000);
    EXPECT_EQ(d.CachedBytes(), 4096u);
    fake_.Reset();
    auto scratch = d.AllocateRaw(6000);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    EXPECT_THAT(fake_.Calls({"aclrtMalloc", "aclrtFree"}),
                ElementsAre("aclrtFree", "aclrtMalloc 6000"));
    EXPECT_EQ(d.CachedBytes(), 0u);
    EXPECT_EQ(d.FreeBytes(), 8192u - 6000);
    EXPECT_EQ(d.AllocateRaw(4000).status().code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(d.Allocate(4000, 1).status().code(),
              absl::StatusCode::kResourceExhausted);
    d.FreeRaw(*scratch, 6000);
    EXPECT_EQ(d.FreeBytes(), 8192u);
  }
  ExpectNothingLive();
}

// CANN's failures while filling the cache leave nothing held: the capacity
// is whole again and nothing CANN handed out is left.
TEST_F(AscendDeviceTest, FailedMallocOrMemsetHoldsNothing) {
  {
    auto device = AscendDevice::Create(Fake(), 0, /*memory_bytes=*/4096,
                                       /*cache=*/4096);
    ASSERT_TRUE(device.ok()) << device.status();
    AscendDevice& d = **device;
    fake_.FailNext("aclrtMalloc", 207001, "out of HBM");
    auto refused = d.Allocate(1000, 1);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(refused.status().message(), HasSubstr("out of HBM"));
    fake_.FailNext("aclrtMemset", 507899, "memset failed");
    auto unzeroed = d.Allocate(1000, 1);
    EXPECT_EQ(unzeroed.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(unzeroed.status().message(), HasSubstr("memset failed"));
    EXPECT_EQ(fake_.Live("allocation"), 0);
    // A cached block that fails to clear for its new owner is freed, not
    // kept with the old owner's bytes.
    auto a = d.Allocate(1000, 1);
    ASSERT_TRUE(a.ok());
    d.Deallocate(*a, 1000);
    fake_.FailNext("aclrtMemset", 507899, "memset failed");
    EXPECT_FALSE(d.Allocate(1000, 2).ok());
    EXPECT_EQ(fake_.Live("allocation"), 0);
    EXPECT_EQ(d.CachedBytes(), 0u);
    EXPECT_EQ(d.FreeBytes(), 4096u);
    auto whole = d.Allocate(4096, 2);
    ASSERT_TRUE(whole.ok()) << whole.status();
    d.Deallocate(*whole, 4096);
  }
  ExpectNothingLive();
}

// The device gives its cached blocks back to CANN when it is destroyed,
// from whichever thread, with its context bound and before the context
// goes away.
TEST_F(AscendDeviceTest, DestroyingTheDeviceFreesItsCache) {
  auto device = AscendDevice::Create(Fake(), 0, 0, /*cache=*/1 << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<void*> blocks;
  for (uint64_t size : {100, 5000, 70000}) {
    auto block = (*device)->Allocate(size, 1);
    ASSERT_TRUE(block.ok());
    blocks.push_back(*block);
  }
  (*device)->Deallocate(blocks[0], 100);
  (*device)->Deallocate(blocks[1], 5000);
  (*device)->Deallocate(blocks[2], 70000);
  EXPECT_EQ(fake_.Live("allocation"), 3);
  EXPECT_EQ((*device)->CachedBytes(), 512u + 5120 + 70144);
  fake_.Reset();
  std::thread([&] { device->reset(); }).join();
  EXPECT_THAT(fake_.Calls({"aclrtFree", "aclrtDestroyContext"}),
              ElementsAre("aclrtFree", "aclrtFree", "aclrtFree",
                          "aclrtDestroyContext"));
  for (const std::string& line : fake_.Log()) {
    EXPECT_THAT(line, ::testing::Not(HasSubstr("NO CONTEXT")));
  }
  ExpectNothingLive();
}

// --device=ascend: every NPU keeps options.memory_cache_bytes of its own.
TEST(AscendDeviceIdsTest, EachNpuKeepsTheWholeCache) {
  DeviceOptions options;
  options.kind = "ascend:0,1";
  options.memory_cache_bytes = 2048;
  options.cann_libraries = {Runfile("libfake_cann.so")};
  auto devices = CreateAscendDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  for (auto& device : *devices) {
    auto a = device->Allocate(2048, 1);
    ASSERT_TRUE(a.ok());
    device->Deallocate(*a, 2048);
    EXPECT_EQ(device->CachedBytes(), 2048u);
  }
}

// Device-side fills and copies (DeviceStream's Memset and CopyOnDevice
// once the server's events land): overlapping copies act as memmove.
void CheckMemsetAndCopies(std::shared_ptr<CannLibrary> cann) {
  auto device = AscendDevice::Create(std::move(cann), 0, 0, 1 << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  auto block = (*device)->Allocate(64, 1);
  ASSERT_TRUE(block.ok()) << block.status();
  {
    auto created = (*device)->CreateStream();
    ASSERT_TRUE(created.ok()) << created.status();
    auto* stream = static_cast<AscendStream*>(created->get());
    char* p = static_cast<char*>(*block);
    std::string expected(64, '\0');
    for (int i = 0; i < 64; ++i) expected[i] = static_cast<char>(i);
    ASSERT_TRUE(stream->CopyToDevice(p, expected.data(), 64).ok());
    ASSERT_TRUE(stream->Memset(p + 40, 0x1234, 8).ok());
    std::memset(&expected[40], 0x34, 8);
    ASSERT_TRUE(stream->CopyOnDevice(p + 8, p, 32).ok());  // Overlapping.
    std::memmove(&expected[8], &expected[0], 32);
    ASSERT_TRUE(stream->CopyOnDevice(p + 48, p, 16).ok());  // Disjoint.
    std::memmove(&expected[48], &expected[0], 16);
    std::string back(64, '\0');
    ASSERT_TRUE(stream->CopyFromDevice(back.data(), p, 64).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    EXPECT_EQ(back, expected);
  }
  (*device)->Deallocate(*block, 64);
}

TEST_F(AscendDeviceTest, MemsetAndCopiesOnTheDevice) {
  CheckMemsetAndCopies(Fake());
  EXPECT_THAT(fake_.Calls({"aclrtMemsetAsync"}),
              ElementsAre("aclrtMemsetAsync 8"));
  ExpectNothingLive();
}

// A runtime without aclrtCreateContext/aclrtSetCurrentContext and
// aclrtMemset (libaclnn_remote.so before its runtime calls grew them):
// threads bind with aclrtSetDevice and memory is zeroed by copies.
TEST(AscendFallbackTest, WithoutContextsOrMemset) {
  auto cann = CannLibrary::Load({Runfile("libfake_cann_no_contexts.so")});
  ASSERT_TRUE(cann.ok()) << cann.status();
  EXPECT_FALSE((*cann)->api().has_contexts());
  EXPECT_FALSE((*cann)->api().has_memset());
  FakeControl fake(**cann);
  {
    AscendServer server(*cann);
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto a = session->Malloc(64);
    ASSERT_TRUE(a.ok());
    auto values = session->ReadValues(a->handle(), 0, DType::kUint8, 64);
    ASSERT_TRUE(values.ok()) << values.status();
    EXPECT_EQ(*values, std::vector<double>(64, 0));
    auto t = TensorDesc::Contiguous(a->handle(), DType::kFloat, {4});
    ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
    ASSERT_TRUE(session->Synchronize().ok());
    EXPECT_THAT(fake.Calls({"aclrtMalloc", "aclrtMemcpy 512"}),
                ElementsAre("aclrtMalloc 512", "aclrtMemcpy 512 kind=1"));
    for (const std::string& line : fake.Log()) {
      EXPECT_THAT(line, ::testing::Not(HasSubstr("NO CONTEXT")));
    }
  }
  CheckMemsetAndCopies(*cann);
  for (const char* kind :
       {"tensor", "scalar", "executor", "allocation", "stream"}) {
    EXPECT_EQ(fake.Live(kind), 0) << kind;
  }
}

// An aclnn library without one operator: the others are served.
TEST(AscendMissingOpTest, IsLeftOutAndRefused) {
  auto cann = CannLibrary::Load({Runfile("libfake_cann_no_dropout.so")});
  ASSERT_TRUE(cann.ok()) << cann.status();
  AscendServer server(*cann);
  auto ops = server.client().ListOperators();
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::vector<std::string> names;
  for (const auto& op : ops->operators()) names.push_back(op.name());
  EXPECT_THAT(names, ElementsAre("ThresholdBackward", "SoftshrinkBackward",
                                 "HardswishBackward", "LeakyReluBackward"));
  auto session = server.Session();
  ASSERT_NE(session, nullptr);
  auto a = session->Malloc(64);
  ASSERT_TRUE(a.ok());
  auto t = TensorDesc::Contiguous(a->handle(), DType::kFloat, {4});
  auto mask = TensorDesc::Contiguous(a->handle(), DType::kUint8, {16});
  auto dropout = session->DropoutBackward(t, mask, 2.0, t);
  absl::Status status = dropout.ok() ? session->Flush() : dropout.status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(status.message(), HasSubstr("aclnnDropoutBackward"));
  ASSERT_TRUE(session->HardswishBackward(t, t, t)->Execute().ok());
  EXPECT_TRUE(session->Synchronize().ok());
}

// A graph on the device: one buffer of 64 bytes poisoned with 0xCD, a
// memset of its first half, a ThresholdBackward over it and a copy of the
// first half onto the second, recorded on a stream of the session.
class GraphSetup {
 public:
  explicit GraphSetup(AscendServer& server) : session_(server.Session()) {
    EXPECT_NE(session_, nullptr);
    if (session_ == nullptr) return;
    auto buffer = session_->Malloc(64);
    auto stream = session_->CreateStream();
    EXPECT_TRUE(buffer.ok() && stream.ok());
    if (!buffer.ok() || !stream.ok()) return;
    buffer_ = buffer->Release();
    stream_ = stream->Release();
    const std::string poison(64, '\xcd');
    EXPECT_TRUE(session_->WriteAsync(buffer_, 0, poison.data(), 64).ok());
    EXPECT_TRUE(session_->Synchronize().ok());
  }

  remote::Session& session() { return *session_; }
  uint64_t stream() const { return stream_; }

  // The three tasks (the launch's executor is consumed into them).
  std::vector<v1::PipelineCommand> Tasks() {
    std::vector<v1::PipelineCommand> tasks;
    auto memset = session_->MemsetCommand(buffer_, 0, 32, 0x5a, stream_);
    EXPECT_TRUE(memset.ok()) << memset.status();
    auto t = TensorDesc::Contiguous(buffer_, DType::kFloat, {8});
    auto executor = session_->ThresholdBackward(t, t, 1.0, t);
    EXPECT_TRUE(executor.ok()) << executor.status();
    auto launch = session_->LaunchCommand(executor->handle(), stream_, 0, 0, 0);
    EXPECT_TRUE(launch.ok()) << launch.status();
    executor->Release();
    auto copy = session_->CopyCommand(buffer_, 32, buffer_, 0, 32, stream_);
    EXPECT_TRUE(copy.ok()) << copy.status();
    tasks.push_back(*memset);
    tasks.push_back(*launch);
    tasks.push_back(*copy);
    return tasks;
  }

  // The buffer's bytes.
  std::string Bytes() {
    auto values = session_->ReadValues(buffer_, 0, DType::kUint8, 64);
    EXPECT_TRUE(values.ok()) << values.status();
    std::string bytes;
    if (values.ok()) {
      for (double v : *values) bytes.push_back(static_cast<char>(v));
    }
    return bytes;
  }

 private:
  std::unique_ptr<remote::Session> session_;
  uint64_t buffer_ = 0;
  uint64_t stream_ = 0;
};

// Waits (bounded) until the fake holds no model: a graph is released on
// whichever thread lets it go last.
void WaitForNoModel(FakeControl& fake) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (fake.Live("model") != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// A defined graph is captured with CANN's aclmdlRICaptureBegin/End on a
// stream of its own (recorded, not run: the buffer keeps its poison), each
// replay is one aclmdlRIExecuteAsync, and destroying the graph destroys the
// model.
TEST_F(AscendDeviceTest, AGraphIsCapturedOnceAndReplayedAsCannsModel) {
  {
    AscendServer server(Fake());
    EXPECT_TRUE(server.device()->captures_graphs());
    EXPECT_EQ(server.device()->StartNotice(), "");
    GraphSetup setup(server);
    std::vector<v1::PipelineCommand> tasks = setup.Tasks();
    fake_.Reset();
    auto graph = setup.session().DefineGraph(std::move(tasks));
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(setup.session().Flush().ok());
    const std::vector<std::string> graph_calls = {
        "aclmdlRI",         "aclnnThresholdBackward ", "aclrtMemsetAsync",
        "aclrtMemcpyAsync", "aclrtCreateStream",       "aclrtDestroyStream"};
    EXPECT_THAT(
        fake_.Calls(graph_calls),
        ElementsAre("aclrtCreateStream",
                    "aclmdlRICaptureBegin mode=1",  // THREAD_LOCAL
                    "aclrtMemsetAsync 32 captured",
                    "aclnnThresholdBackward workspace_size=0 no-workspace "
                    "captured",
                    "aclrtMemcpyAsync 32 kind=3 captured",
                    "aclmdlRICaptureEnd tasks=3", "aclrtDestroyStream"));
    EXPECT_EQ(fake_.Live("model"), 1);
    EXPECT_EQ(setup.Bytes(), std::string(64, '\xcd')) << "capture ran";

    fake_.Reset();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(setup.session().ReplayGraph(*graph, setup.stream()).ok());
    }
    ASSERT_TRUE(setup.session().Synchronize(setup.stream()).ok());
    EXPECT_THAT(fake_.Calls(graph_calls),
                ElementsAre("aclmdlRIExecuteAsync tasks=3",
                            "aclmdlRIExecuteAsync tasks=3",
                            "aclmdlRIExecuteAsync tasks=3"));
    EXPECT_EQ(setup.Bytes(), std::string(64, '\x5a'));

    fake_.Reset();
    ASSERT_TRUE(setup.session().DestroyGraph(*graph).ok());
    ASSERT_TRUE(setup.session().Flush().ok());
    WaitForNoModel(fake_);
    EXPECT_THAT(fake_.Calls({"aclmdlRI"}), ElementsAre("aclmdlRIDestroy"));
  }
  ExpectNothingLive();
}

// CANN's failures: while capturing (the definition is refused, naming the
// task or the capture, and nothing of it stays), and while replaying (the
// stream's deferred error, naming the tasks the model ran).
TEST_F(AscendDeviceTest, CaptureAndReplayFailuresAreNamed) {
  {
    AscendServer server(Fake());
    GraphSetup setup(server);
    fake_.FailNext("aclnnThresholdBackward", 561103, "injected launch");
    ASSERT_TRUE(setup.session().DefineGraph(setup.Tasks()).ok());
    absl::Status refused = setup.session().Flush();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInternal) << refused;
    EXPECT_THAT(refused.message(),
                HasSubstr("task 2 of 3: aclnnThresholdBackward: injected "
                          "launch"));
    EXPECT_EQ(fake_.Live("model"), 0);

    fake_.FailNext("aclmdlRICaptureEnd", 507903, "injected end");
    ASSERT_TRUE(setup.session().DefineGraph(setup.Tasks()).ok());
    refused = setup.session().Flush();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInternal) << refused;
    EXPECT_THAT(refused.message(),
                HasSubstr("tasks 1 to 3 of 3 (captured as one device graph): "
                          "aclmdlRICaptureEnd failed with acl error 507903: "
                          "injected end"));
    EXPECT_EQ(fake_.Live("model"), 0);
    EXPECT_EQ(setup.Bytes(), std::string(64, '\xcd'));

    auto graph = setup.session().DefineGraph(setup.Tasks());
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(setup.session().Flush().ok());
    fake_.FailNext("aclmdlRIExecuteAsync", 507011, "injected replay");
    ASSERT_TRUE(setup.session().ReplayGraph(*graph, setup.stream()).ok());
    absl::Status failed = setup.session().Synchronize(setup.stream());
    EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
    EXPECT_THAT(failed.message(),
                HasSubstr(absl::StrCat(
                    "replay of graph ", *graph,
                    ": tasks 1 to 3 of 3 (one device graph): "
                    "aclmdlRIExecuteAsync failed with acl error 507011: "
                    "injected replay")));
    // The next replay runs.
    ASSERT_TRUE(setup.session().ReplayGraph(*graph, setup.stream()).ok());
    ASSERT_TRUE(setup.session().Synchronize(setup.stream()).ok());
    EXPECT_EQ(setup.Bytes(), std::string(64, '\x5a'));
  }
  WaitForNoModel(fake_);
  ExpectNothingLive();
}

// A CANN that has aclmdlRI but declines a capture (ACL_ERROR_RT_FEATURE_
// NOT_SUPPORT from aclmdlRICaptureBegin, as libaclnn_remote.so does
// unpipelined): that graph is defined and replayed task by task.
TEST_F(AscendDeviceTest, ADeclinedCaptureReplaysTaskByTask) {
  {
    AscendServer server(Fake());
    GraphSetup setup(server);
    std::vector<v1::PipelineCommand> tasks = setup.Tasks();
    fake_.Reset();
    fake_.FailNext("aclmdlRICaptureBegin", 207000, "not on this runtime");
    auto graph = setup.session().DefineGraph(std::move(tasks));
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(setup.session().Flush().ok());
    ASSERT_TRUE(setup.session().ReplayGraph(*graph, setup.stream()).ok());
    ASSERT_TRUE(setup.session().Synchronize(setup.stream()).ok());
    EXPECT_THAT(
        fake_.Calls({"aclmdlRI", "aclnnThresholdBackward ", "aclrtMemsetAsync",
                     "aclrtMemcpyAsync 32"}),
        ElementsAre("aclmdlRICaptureBegin FAILED 207000", "aclrtMemsetAsync 32",
                    "aclnnThresholdBackward workspace_size=0 no-workspace",
                    "aclrtMemcpyAsync 32 kind=3"));
    EXPECT_EQ(setup.Bytes(), std::string(64, '\x5a'));
  }
  ExpectNothingLive();
}

// A CANN without aclmdlRI: the server says so at start and replays the
// graph task by task, with the same result.
TEST(AscendGraphFallbackTest, WithoutCaptureTheTasksAreReplayedOneByOne) {
  auto cann = CannLibrary::Load({Runfile("libfake_cann_no_graphs.so")});
  ASSERT_TRUE(cann.ok()) << cann.status();
  EXPECT_FALSE((*cann)->api().has_graphs());
  FakeControl fake(**cann);
  {
    AscendServer server(*cann);
    EXPECT_FALSE(server.device()->captures_graphs());
    EXPECT_EQ(server.device()->StartNotice(),
              "Ascend device 0: the loaded CANN has no graph capture "
              "(aclmdlRICaptureBegin, aclmdlRICaptureEnd, "
              "aclmdlRIExecuteAsync, aclmdlRIDestroy and aclrtMemsetAsync): "
              "graphs are replayed task by task");
    GraphSetup setup(server);
    std::vector<v1::PipelineCommand> tasks = setup.Tasks();
    fake.Reset();
    auto graph = setup.session().DefineGraph(std::move(tasks));
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(setup.session().Flush().ok());
    EXPECT_EQ(setup.Bytes(), std::string(64, '\xcd'));
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(setup.session().ReplayGraph(*graph, setup.stream()).ok());
    }
    ASSERT_TRUE(setup.session().Synchronize(setup.stream()).ok());
    EXPECT_THAT(
        fake.Calls({"aclmdlRI", "aclnnThresholdBackward ", "aclrtMemsetAsync",
                    "aclrtMemcpyAsync 32"}),
        ElementsAre("aclrtMemsetAsync 32",
                    "aclnnThresholdBackward workspace_size=0 no-workspace",
                    "aclrtMemcpyAsync 32 kind=3", "aclrtMemsetAsync 32",
                    "aclnnThresholdBackward workspace_size=0 no-workspace",
                    "aclrtMemcpyAsync 32 kind=3"));
    EXPECT_EQ(setup.Bytes(), std::string(64, '\x5a'));
  }
  for (const char* kind :
       {"tensor", "scalar", "executor", "allocation", "stream"}) {
    EXPECT_EQ(fake.Live(kind), 0) << kind;
  }
}

// ---- Staged transfers ------------------------------------------------------

// Waits (bounded) until `condition` holds; false if it never did.
bool WaitUntil(const std::function<bool()>& condition) {
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// `size` bytes no two chunks of a test share.
std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<char>(i * 7 + i / 251);
  return bytes;
}

// A device, a stream on it and a zeroed block of device memory (the fake's
// device memory is host memory: the test reads and writes it directly).
class StagedTransferTest : public AscendDeviceTest {
 protected:
  void SetUp() override {
    AscendDeviceTest::SetUp();
    // Staging for two transfers of three chunks at once (kStagingCap).
    auto device = AscendDevice::Create(Fake(), 0, 0, 0, kStagingCap);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
    auto stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *std::move(stream);
    auto block = device_->Allocate(kSize, 1);
    ASSERT_TRUE(block.ok()) << block.status();
    block_ = static_cast<char*>(*block);
    fake_.Reset();
  }
  void TearDown() override {
    fake_.HoldHostCopies(false);
    if (block_ != nullptr) device_->Deallocate(block_, kSize);
    stream_.reset();
    device_.reset();
    ExpectNothingLive();
  }
  std::string DeviceBytes() const { return std::string(block_, kSize); }
  // Fills the next chunk of `upload` with its part of `data` and commits
  // it; only its first `bytes` when the upload ends short there.
  static constexpr uint64_t kWholeChunk = ~uint64_t{0};
  void Put(StagedUpload& upload, const std::string& data, uint64_t at,
           uint64_t bytes = kWholeChunk) {
    absl::StatusOr<absl::Span<char>> chunk = upload.Next();
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    bytes = std::min<uint64_t>(bytes, chunk->size());
    std::memcpy(chunk->data(), data.data() + at, bytes);
    ASSERT_TRUE(upload.Commit(bytes).ok());
  }
  // A whole upload of `data` on the stream, which must land.
  void ExpectAnUploadLands(const std::string& data) {
    std::unique_ptr<StagedUpload> upload =
        stream_->StageUpload(block_, kSize, kChunk);
    for (uint64_t at = 0; at < kSize; at += kChunk) Put(*upload, data, at);
    EXPECT_TRUE(upload->Finish().ok());
    EXPECT_EQ(DeviceBytes(), data);
  }
  // An upload of `data` whose chunk 0's copy is held (as every host copy
  // from now on, until the hold is lifted).
  std::unique_ptr<StagedUpload> UploadWithChunk0Held(const std::string& data) {
    fake_.HoldHostCopies(true);
    std::unique_ptr<StagedUpload> upload =
        stream_->StageUpload(block_, kSize, kChunk);
    Put(*upload, data, 0);
    EXPECT_TRUE(WaitUntil([&] { return fake_.HeldHostCopies() == 1; }));
    return upload;
  }
  // The first `n` bytes of `data`, then zeros (the block's untouched rest).
  static std::string Received(const std::string& data, uint64_t n) {
    return data.substr(0, n) + std::string(data.size() - n, '\0');
  }

  // Three chunks: two whole, one half.
  static constexpr uint64_t kSize = 2500;
  static constexpr uint64_t kChunk = 1000;
  static constexpr uint64_t kStagingCap = 6 * kChunk;
  std::unique_ptr<AscendDevice> device_;
  std::unique_ptr<DeviceStream> stream_;
  char* block_ = nullptr;
};

// The point of staging: while the copy of chunk 0 is still running, the
// caller gets chunk 1's staging memory and fills it; the second lane copies
// chunk 1 only once chunk 0's copy is done (its side stream is not ordered
// after the work before the transfer), and chunk 2 takes the third buffer
// meanwhile. The bytes land bit-exact, the three page-locked buffers go
// back to the device with the transfer and the next transfer takes them,
// and the lane's side stream is made once.
TEST_F(StagedTransferTest, AnUploadTakesTheNextChunkWhileACopyRuns) {
  const std::string data = Pattern(kSize);
  std::unique_ptr<StagedUpload> upload = UploadWithChunk0Held(data);
  Put(*upload, data, kChunk);
  EXPECT_EQ(fake_.HeldHostCopies(), 1);  // Chunk 0's copy, still held.
  fake_.PermitHostCopies(1);
  Put(*upload, data, 2 * kChunk);
  fake_.HoldHostCopies(false);
  ASSERT_TRUE(upload->Finish().ok());
  EXPECT_EQ(DeviceBytes(), data);
  EXPECT_EQ(upload->Next().status().code(), absl::StatusCode::kOutOfRange);
  upload.reset();
  std::vector<std::string> calls =
      fake_.Calls({"aclrtMallocHost", "aclrtFreeHost",
                   "aclrtMemcpyAsync 1000 kind=1 held"});
  ASSERT_GE(calls.size(), 3u);
  EXPECT_THAT(
      std::vector<std::string>(calls.begin(), calls.begin() + 3),
      ElementsAre("aclrtMallocHost 1000", "aclrtMemcpyAsync 1000 kind=1 held",
                  "aclrtMallocHost 1000"));
  const std::vector<std::string> three_blocks = {
      "aclrtMallocHost 1000", "aclrtMallocHost 1000", "aclrtMallocHost 1000"};
  EXPECT_EQ(fake_.Calls({"aclrtMallocHost", "aclrtFreeHost"}), three_blocks);
  EXPECT_THAT(fake_.Calls({"aclrtMemcpyAsync 1000 kind=1",
                           "aclrtMemcpyAsync 500 kind=1"}),
              ::testing::Contains("aclrtMemcpyAsync 500 kind=1"));
  EXPECT_EQ(fake_.Calls({"aclrtCreateStream"}).size(), 1u);
  // The next transfer on the stream keeps its side stream and its staging.
  ExpectAnUploadLands(data);
  EXPECT_EQ(fake_.Calls({"aclrtCreateStream"}).size(), 1u);
  EXPECT_EQ(fake_.Calls({"aclrtMallocHost", "aclrtFreeHost"}), three_blocks);
}

// The device's running transfers stage through at most kStagingCap of
// page-locked memory: two transfers of three chunks hold all of it, a
// third is RESOURCE_EXHAUSTED naming the flag (and holds nothing), and
// once one ends, the next transfer lands.
TEST_F(StagedTransferTest, StagingMemoryIsCappedAcrossTransfers) {
  const std::string data = Pattern(kSize);
  auto other = device_->CreateStream();
  auto third = device_->CreateStream();
  ASSERT_TRUE(other.ok() && third.ok());
  // Filled, not finished: each holds its three buffers.
  std::unique_ptr<StagedUpload> first =
      stream_->StageUpload(block_, kSize, kChunk);
  std::unique_ptr<StagedUpload> second =
      (*other)->StageUpload(block_, kSize, kChunk);
  for (uint64_t at = 0; at < kSize; at += kChunk) {
    Put(*first, data, at);
    Put(*second, data, at);
  }
  std::unique_ptr<StagedDownload> refused =
      (*third)->StageDownload(block_, kSize, kChunk);
  absl::StatusOr<absl::Span<const char>> none = refused->Next();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::HasSubstr("--max_staging_bytes"));
  refused.reset();
  EXPECT_EQ(fake_.Calls({"aclrtMallocHost"}).size(), 6u);
  ASSERT_TRUE(first->Finish().ok());
  ASSERT_TRUE(second->Finish().ok());
  first.reset();
  ExpectAnUploadLands(data);
  second.reset();
  third->reset();
  other->reset();
}

// Downloads the other way round: once the caller has chunk 0, the copy of
// chunk 1 runs while it sends chunk 0.
TEST_F(StagedTransferTest, ADownloadCopiesTheNextChunkWhileOneIsSent) {
  const std::string data = Pattern(kSize);
  std::memcpy(block_, data.data(), kSize);
  fake_.HoldHostCopies(true);
  std::unique_ptr<StagedDownload> download =
      stream_->StageDownload(block_, kSize, kChunk);
  absl::StatusOr<absl::Span<const char>> first;
  std::thread taker([&] { first = download->Next(); });
  ASSERT_TRUE(WaitUntil([&] { return fake_.HeldHostCopies() == 1; }));
  fake_.PermitHostCopies(1);
  taker.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(std::string(first->data(), first->size()), data.substr(0, kChunk));
  // Chunks 1 and 2 are being copied (held), one per lane, while the caller
  // holds chunk 0.
  EXPECT_TRUE(WaitUntil([&] { return fake_.HeldHostCopies() == 2; }));
  fake_.HoldHostCopies(false);
  for (uint64_t at = kChunk; at < kSize; at += kChunk) {
    absl::StatusOr<absl::Span<const char>> chunk = download->Next();
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_EQ(std::string(chunk->data(), chunk->size()),
              data.substr(at, kChunk));
  }
  EXPECT_EQ(download->Next().status().code(), absl::StatusCode::kOutOfRange);
  download.reset();
  // Kept for the next transfer (TearDown sees them freed with the device).
  EXPECT_THAT(fake_.Calls({"aclrtMallocHost", "aclrtFreeHost"}),
              ElementsAre("aclrtMallocHost 1000", "aclrtMallocHost 1000",
                          "aclrtMallocHost 1000"));
}

// A range of one chunk takes one buffer of its own size, copied on the
// caller's thread.
TEST_F(StagedTransferTest, OneChunkTakesOneBufferOfItsSize) {
  const std::string data = Pattern(kSize);
  std::unique_ptr<StagedUpload> upload =
      stream_->StageUpload(block_, kSize, 4 * kSize);
  Put(*upload, data, 0);
  ASSERT_TRUE(upload->Finish().ok());
  EXPECT_EQ(DeviceBytes(), data);
  std::unique_ptr<StagedDownload> download =
      stream_->StageDownload(block_, kSize, kSize);
  absl::StatusOr<absl::Span<const char>> back = download->Next();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::string(back->data(), back->size()), data);
  upload.reset();
  download.reset();
  // Both were held at once; both are kept.
  EXPECT_THAT(fake_.Calls({"aclrtMallocHost", "aclrtFreeHost"}),
              ElementsAre("aclrtMallocHost 2500", "aclrtMallocHost 2500"));
  EXPECT_EQ(device_->KeptStagingBlocks(), 2u);
}

// Staging blocks kept from finished transfers count against the cap, and
// give way to a transfer that needs their room: three 1000-byte blocks are
// kept, and a transfer through 2000-byte chunks needs 6000 of the cap's
// 6000. Its second chunk frees them, and the transfer lands.
TEST_F(StagedTransferTest, KeptStagingGivesWayToATransferThatNeedsRoom) {
  ExpectAnUploadLands(Pattern(kSize));
  EXPECT_EQ(fake_.Live("host"), 3);
  constexpr uint64_t kLarge = 3 * 2000;
  absl::StatusOr<void*> large = device_->Allocate(kLarge, 1);
  ASSERT_TRUE(large.ok()) << large.status();
  const std::string data = Pattern(kLarge);
  std::unique_ptr<StagedUpload> upload =
      stream_->StageUpload(*large, kLarge, 2000);
  for (uint64_t at = 0; at < kLarge; at += 2000) Put(*upload, data, at);
  ASSERT_TRUE(upload->Finish().ok());
  upload.reset();
  EXPECT_EQ(std::string(static_cast<char*>(*large), kLarge), data);
  EXPECT_THAT(fake_.Calls({"aclrtMallocHost", "aclrtFreeHost"}),
              ElementsAre("aclrtMallocHost 1000", "aclrtMallocHost 1000",
                          "aclrtMallocHost 1000", "aclrtMallocHost 2000",
                          "aclrtFreeHost", "aclrtFreeHost", "aclrtFreeHost",
                          "aclrtMallocHost 2000", "aclrtMallocHost 2000"));
  EXPECT_EQ(fake_.Live("host"), 3);
  device_->Deallocate(*large, kLarge);
}

// Only the last kKeptStagingBlocks blocks given back are kept: after
// one-chunk transfers of seven sizes, the oldest block (100 bytes) was
// freed; a transfer of the newest size takes its kept block, one of the
// oldest size allocates again.
TEST_F(StagedTransferTest, OnlyTheLastStagingBlocksGivenBackAreKept) {
  constexpr size_t kKept = AscendDevice::kKeptStagingBlocks;
  const std::string data = Pattern(kSize);
  auto upload_of = [&](uint64_t bytes) {
    std::unique_ptr<StagedUpload> upload =
        stream_->StageUpload(block_, bytes, kChunk);
    Put(*upload, data, 0);
    EXPECT_TRUE(upload->Finish().ok());
  };
  for (uint64_t n = 1; n <= kKept + 1; ++n) upload_of(100 * n);
  EXPECT_EQ(fake_.Calls({"aclrtMallocHost"}).size(), kKept + 1);
  EXPECT_THAT(fake_.Calls({"aclrtFreeHost"}), ElementsAre("aclrtFreeHost"));
  EXPECT_EQ(fake_.Live("host"), static_cast<int64_t>(kKept));
  upload_of(100 * (kKept + 1));
  EXPECT_EQ(fake_.Calls({"aclrtMallocHost"}).size(), kKept + 1);
  upload_of(100);
  EXPECT_EQ(fake_.Calls({"aclrtMallocHost"}).size(), kKept + 2);
  EXPECT_EQ(DeviceBytes(), Received(data, 100 * (kKept + 1)));
}

// An upload that ends early (its sender failed) commits the chunk it was
// filling as far as it got: that part is copied after the chunk still
// held before it, the rest of the range is untouched, and the transfer is
// over.
TEST_F(StagedTransferTest, AShortCommitLandsAfterTheQueuedChunksAndEnds) {
  const std::string data = Pattern(kSize);
  std::unique_ptr<StagedUpload> upload = UploadWithChunk0Held(data);
  Put(*upload, data, kChunk, 300);
  fake_.HoldHostCopies(false);
  ASSERT_TRUE(upload->Finish().ok());
  EXPECT_EQ(DeviceBytes(), Received(data, kChunk + 300));
  // As the default staging answers (devices/device_test.cc).
  EXPECT_EQ(upload->Next().status(), StagedTransferEnded(kChunk + 300, kSize));
  EXPECT_THAT(fake_.Calls({"aclrtMemcpyAsync"}),
              ElementsAre("aclrtMemcpyAsync 1000 kind=1 held",
                          "aclrtMemcpyAsync 1000 kind=1",
                          "aclrtMemcpyAsync 300 kind=1"));
}

// A range of one chunk, copied on the caller's thread, committed short; a
// commit past the chunk's size is refused and copies nothing.
TEST_F(StagedTransferTest, OneChunkCommittedShortOrPastItsSize) {
  const std::string data = Pattern(kSize);
  std::unique_ptr<StagedUpload> upload =
      stream_->StageUpload(block_, kSize, 4 * kSize);
  absl::StatusOr<absl::Span<char>> chunk = upload->Next();
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(upload->Commit(kSize + 1), CheckStagedCommit(kSize + 1, kSize));
  std::memcpy(chunk->data(), data.data(), 100);
  ASSERT_TRUE(upload->Commit(100).ok());
  ASSERT_TRUE(upload->Finish().ok());
  EXPECT_EQ(DeviceBytes(), Received(data, 100));
  EXPECT_EQ(upload->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(fake_.Calls({"aclrtMemcpyAsync"}),
              ElementsAre("aclrtMemcpyAsync 100 kind=1"));
}

// A failed copy fails the transfer with CANN's error, for every later call
// too; the staging goes back to the device all the same.
TEST_F(StagedTransferTest, ACopysFailureIsTheTransfersWithItsAclError) {
  const std::string data = Pattern(kSize);
  std::unique_ptr<StagedUpload> upload =
      stream_->StageUpload(block_, kSize, kChunk);
  fake_.FailNext("aclrtMemcpyAsync", 507899, "copy engine fault");
  Put(*upload, data, 0);
  absl::Status failed = upload->Finish();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_EQ(kernels::GetAclnnStatus(failed), 361001) << failed;
  EXPECT_THAT(failed.message(),
              HasSubstr("aclrtMemcpyAsync (host to device) failed with acl "
                        "error 507899: copy engine fault"));
  EXPECT_EQ(upload->Next().status(), failed);
  EXPECT_EQ(upload->Commit(kChunk), failed);
  upload.reset();

  // The stream's synchronize, on a download.
  std::unique_ptr<StagedDownload> download =
      stream_->StageDownload(block_, kSize, kChunk);
  fake_.FailNext("aclrtSynchronizeStream", 507011, "AI Core exception");
  absl::Status synced = download->Next().status();
  EXPECT_EQ(kernels::GetAclnnStatus(synced), 361001) << synced;
  EXPECT_THAT(synced.message(),
              HasSubstr("aclrtSynchronizeStream failed with acl error 507011: "
                        "AI Core exception"));
  EXPECT_EQ(download->Next().status(), synced);
  download.reset();

  // One chunk, copied on the caller's thread: Commit says so.
  upload = stream_->StageUpload(block_, kChunk, kChunk);
  fake_.FailNext("aclrtMemcpyAsync", 507899, "copy engine fault");
  absl::StatusOr<absl::Span<char>> chunk = upload->Next();
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_THAT(upload->Commit(kChunk).message(), HasSubstr("acl error 507899"));
  upload.reset();

  // Every block CANN handed out is back with the device.
  EXPECT_EQ(fake_.Live("host"),
            static_cast<int64_t>(device_->KeptStagingBlocks()));

  // No page-locked memory to be had (for a chunk size none of the kept
  // blocks has).
  upload = stream_->StageUpload(block_, kSize, 900);
  fake_.FailNext("aclrtMallocHost", 207001, "out of host memory");
  absl::Status staged = upload->Next().status();
  EXPECT_EQ(staged.code(), absl::StatusCode::kResourceExhausted) << staged;
  EXPECT_THAT(staged.message(),
              HasSubstr("aclrtMallocHost of 900 bytes (transfer staging) "
                        "failed with acl error 207001: out of host memory"));
  upload.reset();
  EXPECT_EQ(fake_.Live("host"),
            static_cast<int64_t>(device_->KeptStagingBlocks()));
  // The stream works on.
  ExpectAnUploadLands(data);
}

// No stream for the second copy lane: the transfer fails with CANN's
// error at its first commit, and stays failed; the next transfer makes
// the stream and works.
TEST_F(StagedTransferTest, NoStreamForTheSecondLaneFailsTheTransfer) {
  const std::string data = Pattern(kSize);
  std::unique_ptr<StagedUpload> upload =
      stream_->StageUpload(block_, kSize, kChunk);
  fake_.FailNext("aclrtCreateStream", 207000, "no stream left");
  absl::StatusOr<absl::Span<char>> chunk = upload->Next();
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  const absl::Status failed = upload->Commit(kChunk);
  EXPECT_THAT(failed.message(),
              HasSubstr("aclrtCreateStream (a copy lane) failed with acl "
                        "error 207000: no stream left"));
  EXPECT_EQ(upload->Next().status(), failed);
  EXPECT_EQ(upload->Finish(), failed);
  upload.reset();
  EXPECT_EQ(fake_.Live("host"),
            static_cast<int64_t>(device_->KeptStagingBlocks()));
  ExpectAnUploadLands(data);
}

// A transfer abandoned with a copy running (the client went away, the
// session closed) waits for that copy, then gives its staging back.
TEST_F(StagedTransferTest, AnAbandonedTransferWaitsForItsCopyAndFrees) {
  const std::string data = Pattern(kSize);
  fake_.HoldHostCopies(true);
  std::unique_ptr<StagedUpload> upload =
      stream_->StageUpload(block_, kSize, kChunk);
  Put(*upload, data, 0);
  Put(*upload, data, kChunk);
  ASSERT_TRUE(WaitUntil([&] { return fake_.HeldHostCopies() == 1; }));
  std::thread abandon([&] { upload.reset(); });
  fake_.HoldHostCopies(false);
  abandon.join();
  EXPECT_EQ(fake_.Live("host"), 2);
  EXPECT_EQ(device_->KeptStagingBlocks(), 2u);
  EXPECT_TRUE(stream_->Synchronize().ok());
}

// `bytes` as one gRPC message.
grpc::ByteBuffer Message(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// `data` as an UploadRequest's data field, serialized.
std::string UploadData(const std::string& data) {
  v1::UploadRequest request;
  request.set_data(data);
  return request.SerializeAsString();
}

// The gRPC Upload's writer (server/upload_parser.h): an upload that fails
// at a chunk's end, with a whole chunk queued behind a copy still running.
// The failed Write returns only once that chunk is copied too, so the
// device holds every byte received, as one the host addresses would (the
// writer goes when the call ends, and a staged upload drops the copies
// still queued when it goes).
TEST_F(StagedTransferTest, AFailedUploadWriteCopiesTheChunksQueued) {
  const std::string data = Pattern(kSize);
  std::shared_ptr<DeviceStream> stream = std::move(stream_);
  fake_.HoldHostCopies(true);
  std::optional<UploadWriter> writer;
  writer.emplace(device_.get(), stream, block_, kSize, kChunk);
  grpc::ByteBuffer two_chunks = Message(UploadData(data.substr(0, 2 * kChunk)));
  ASSERT_TRUE(writer->Write(&two_chunks).ok());
  // Chunk 0's copy is held, chunk 1's queued behind it.
  ASSERT_TRUE(WaitUntil([&] { return fake_.HeldHostCopies() == 1; }));
  // The next message ends a byte into its data field's announced length.
  std::string cut = UploadData(data.substr(2 * kChunk));
  cut.resize(cut.size() - 1);
  grpc::ByteBuffer malformed = Message(cut);
  // Whenever the copies are let go, the Write below cannot return before.
  std::thread release([&] { fake_.HoldHostCopies(false); });
  const absl::Status failed = writer->Write(&malformed);
  const std::vector<std::string> copied =
      fake_.Calls({"aclrtMemcpyAsync 1000 kind=1"});
  release.join();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInvalidArgument) << failed;
  EXPECT_EQ(failed.message(),
            "malformed UploadRequest message: data field of 500 bytes, but "
            "only 499 left in the message");
  EXPECT_THAT(copied, ElementsAre("aclrtMemcpyAsync 1000 kind=1 held",
                                  "aclrtMemcpyAsync 1000 kind=1",
                                  "aclrtMemcpyAsync 1000 kind=1"));
  writer.reset();
  EXPECT_EQ(DeviceBytes(), Received(data, 2 * kChunk));
}

// Through the server, over gRPC Upload/Download and over the data path:
// chunk 1 of an upload arrives in the device's staging while the copy of
// chunk 0 is still held, then everything lands bit-exact; the staging
// goes back to the device when the call returns, and the next call takes
// it.
class StagedServerTest : public AscendDeviceTest,
                         public ::testing::WithParamInterface<bool> {};

TEST_P(StagedServerTest, UploadsReceiveTheNextChunkWhileOneIsCopied) {
  constexpr uint64_t kChunk = 64 << 10;
  constexpr uint64_t kSize = 4 * kChunk;
  remote::ConnectOptions connect;
  connect.data_path = GetParam();
  connect.data_path_bytes = kChunk;
  connect.upload_chunk_bytes = kChunk;
  {
    AscendServer server(Fake(), 0, 1 << 20, kChunk, connect);
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto buffer = session->Malloc(kSize);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const std::string data = Pattern(kSize);
    fake_.Reset();
    fake_.HoldHostCopies(true);
    absl::Status uploaded;
    std::thread uploader([&] {
      uploaded = session->Upload(buffer->handle(), 0, data.data(), kSize);
    });
    EXPECT_TRUE(WaitUntil([&] { return fake_.HeldHostCopies() == 1; }));
    EXPECT_TRUE(WaitUntil([&] {
      return fake_.HostHolds(data.substr(kChunk, kChunk));
    })) << "chunk 1 never reached the staging while chunk 0 was copied";
    EXPECT_EQ(fake_.HeldHostCopies(), 1);
    fake_.HoldHostCopies(false);
    uploader.join();
    ASSERT_TRUE(uploaded.ok()) << uploaded;
    // Three buffers for a transfer of four chunks, kept for the next.
    EXPECT_EQ(fake_.Live("host"), 3);
    std::string back(kSize, '\0');
    ASSERT_TRUE(
        session->Download(buffer->handle(), 0, back.data(), kSize).ok());
    EXPECT_TRUE(back == data);
    // The download took the upload's three.
    EXPECT_EQ(fake_.Live("host"), 3);
    EXPECT_EQ(fake_.Calls({"aclrtMallocHost"}),
              std::vector<std::string>(3, "aclrtMallocHost 65536"));
  }
  ExpectNothingLive();
}

INSTANTIATE_TEST_SUITE_P(GrpcAndDataPath, StagedServerTest, ::testing::Bool());

// Data-path transfers stage in --staging_chunk_bytes (each chunk is one
// device copy, a whole transfer to the backend through the chain), gRPC
// ones in --chunk_bytes (a download's message is a staging chunk): a
// transfer of 2.5 staging chunks is two whole copies and a half one, each
// way (the two lanes' copies in either order), through three buffers of one
// staging chunk.
class StagingChunkTest : public AscendDeviceTest,
                         public ::testing::WithParamInterface<bool> {};

TEST_P(StagingChunkTest, TheDataPathStagesInItsOwnChunk) {
  constexpr uint64_t kChunk = 64 << 10;
  constexpr uint64_t kStaging = 4 * kChunk;
  constexpr uint64_t kSize = 10 * kChunk;
  const bool data_path = GetParam();
  remote::ConnectOptions connect;
  connect.data_path = data_path;
  connect.data_path_bytes = kChunk;
  connect.upload_chunk_bytes = kChunk;
  connect.transfer_connections = 1;
  {
    AscendServer server(Fake(), 0, 1 << 20, kChunk, connect, kStaging);
    auto session = server.Session();
    ASSERT_NE(session, nullptr);
    auto buffer = session->Malloc(kSize);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const std::string data = Pattern(kSize);
    fake_.Reset();
    ASSERT_TRUE(
        session->Upload(buffer->handle(), 0, data.data(), kSize).ok());
    std::string back(kSize, '\0');
    ASSERT_TRUE(
        session->Download(buffer->handle(), 0, back.data(), kSize).ok());
    EXPECT_TRUE(back == data);
    EXPECT_EQ(fake_.Live("host"), 3);
    const uint64_t chunk = data_path ? kStaging : kChunk;
    // The upload's copies, then the download's (it starts once the upload
    // has returned).
    for (const char* kind : {"1", "2"}) {
      std::vector<std::string> expected;
      for (uint64_t at = 0; at < kSize; at += chunk) {
        expected.push_back(absl::StrCat("aclrtMemcpyAsync ",
                                        std::min(chunk, kSize - at),
                                        " kind=", kind));
      }
      std::vector<std::string> of_kind;
      for (const std::string& call : fake_.Calls({"aclrtMemcpyAsync"})) {
        if (absl::EndsWith(call, absl::StrCat("kind=", kind))) {
          of_kind.push_back(call);
        }
      }
      EXPECT_THAT(of_kind, ::testing::UnorderedElementsAreArray(expected));
    }
    const std::vector<std::string> calls = fake_.Calls({"aclrtMemcpyAsync"});
    const auto first_download =
        std::find_if(calls.begin(), calls.end(), [](const std::string& c) {
          return absl::EndsWith(c, "kind=2");
        });
    EXPECT_TRUE(std::all_of(first_download, calls.end(),
                            [](const std::string& c) {
                              return absl::EndsWith(c, "kind=2");
                            }));
    // The download took the upload's three buffers.
    EXPECT_EQ(
        fake_.Calls({"aclrtMallocHost"}),
        std::vector<std::string>(3, absl::StrCat("aclrtMallocHost ", chunk)));
  }
  ExpectNothingLive();
}

INSTANTIATE_TEST_SUITE_P(GrpcAndDataPath, StagingChunkTest,
                         ::testing::Bool());

TEST(AscendDeviceIdsTest, ParsesTheDeviceFlag) {
  EXPECT_THAT(*AscendDeviceIds("ascend"), ElementsAre(0));
  EXPECT_THAT(*AscendDeviceIds("ascend:3"), ElementsAre(3));
  EXPECT_THAT(*AscendDeviceIds("ascend:0,2,1"), ElementsAre(0, 2, 1));
  for (const char* bad :
       {"ascend:", "ascend:x", "ascend:-1", "ascend:1,,2", "ascend:1,1"}) {
    EXPECT_EQ(AscendDeviceIds(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(AscendDeviceIdsTest, SeveralNpusShareOneCann) {
  DeviceOptions options;
  options.kind = "ascend:1,3";
  options.cann_libraries = {Runfile("libfake_cann.so")};
  auto devices = CreateAscendDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  EXPECT_EQ((*devices)[0]->Describe().name, "FakeAscend910B (NPU 1)");
  EXPECT_EQ((*devices)[1]->Describe().name, "FakeAscend910B (NPU 3)");
  options.devices = 2;
  EXPECT_THAT(CreateAscendDevices(options).status().message(),
              HasSubstr("name the NPUs instead"));
}

// A staging cap no transfer fits is refused before CANN is touched; one
// that holds exactly one transfer's chunks is enough.
TEST(AscendDeviceIdsTest, TheStagingCapMustHoldOneTransfer) {
  DeviceOptions options;
  options.kind = "ascend";
  options.cann_libraries = {"/nonexistent/libascendcl.so"};
  options.staging_chunk_bytes = 1000;
  options.staging_bytes = kStagingChunksPerTransfer * 1000 - 1;
  absl::Status refused = CreateAscendDevices(options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "--max_staging_bytes (2999) must hold one transfer's 3 staging "
            "chunks of the larger of --chunk_bytes and --staging_chunk_bytes: "
            "at least 3000");
  options.staging_bytes += 1;
  options.cann_libraries = {Runfile("libfake_cann.so")};
  EXPECT_TRUE(CreateAscendDevices(options).ok());
}

TEST(CannLibraryTest, AMissingLibraryOrSymbolIsOneLineNamingIt) {
  auto missing = CannLibrary::Load({"/nonexistent/libascendcl.so"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      missing.status().message(),
      HasSubstr("cannot load CANN library /nonexistent/libascendcl.so"));
  auto no_sync = CannLibrary::Load({Runfile("libfake_cann_no_sync.so")});
  EXPECT_EQ(no_sync.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_sync.status().message(),
              HasSubstr("CANN symbol aclrtSynchronizeStream is in none of"));
  for (const auto& status : {missing.status(), no_sync.status()}) {
    EXPECT_FALSE(absl::StrContains(status.message(), "\n")) << status;
  }
}

// The namespace's libc numbers its thread keys from its own table; the
// load splits the numbers so that no key of CANN's is a number the server
// uses, before or after the load (cann_library.cc says why).
TEST(CannLibraryTest, ThreadKeysOfTheNamespaceAreNumbersTheServerNeverUses) {
  std::vector<pthread_key_t> before(3), after(3), theirs(4);
  for (pthread_key_t& key : before) ASSERT_EQ(pthread_key_create(&key, 0), 0);
  auto cann = CannLibrary::Load({Runfile("libfake_cann_no_dropout.so")});
  ASSERT_TRUE(cann.ok()) << cann.status();
  auto create = reinterpret_cast<int (*)(pthread_key_t*, void (*)(void*))>(
      (*cann)->Lookup("pthread_key_create"));
  ASSERT_NE(create, nullptr);
  for (pthread_key_t& key : theirs) ASSERT_EQ(create(&key, nullptr), 0);
  for (pthread_key_t& key : after) ASSERT_EQ(pthread_key_create(&key, 0), 0);
  for (pthread_key_t key : theirs) {
    EXPECT_THAT(before, ::testing::Not(::testing::Contains(key)));
    EXPECT_THAT(after, ::testing::Not(::testing::Contains(key)));
  }
  for (pthread_key_t key : before) pthread_key_delete(key);
  for (pthread_key_t key : after) pthread_key_delete(key);
}

// Threads of the namespace's libc come and go (CANN's pools, gRPC's in
// libaclnn_remote.so), each with blocks of dynamic TLS that the dynamic
// loader allocated with the server's malloc; a new thread on a cached stack
// has the namespace's libc free its predecessor's blocks. That free must be
// the server's (cann_heap.c): with the namespace's own malloc it aborted
// ("free(): invalid pointer") under ASan and crashed without it.
TEST(CannLibraryTest, ThreadsOfTheNamespaceReuseStacksWithTheirTls) {
  auto run =
      reinterpret_cast<int (*)(int)>(Fake()->Lookup("fake_cann_run_threads"));
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run(8), 8);
  EXPECT_EQ(run(8), 8);
}

// Memory of one side freed by the other: the namespace's malloc is the
// server's.
TEST(CannLibraryTest, TheNamespaceAllocatesFromTheServersHeap) {
  auto ns_malloc =
      reinterpret_cast<void* (*)(size_t)>(Fake()->Lookup("fake_cann_malloc"));
  auto ns_free =
      reinterpret_cast<void (*)(void*)>(Fake()->Lookup("fake_cann_free"));
  ASSERT_NE(ns_malloc, nullptr);
  ASSERT_NE(ns_free, nullptr);
#if !defined(__SANITIZE_ADDRESS__)
  // glibc's count of the server's heap (ASan's allocator keeps none) sees
  // what the namespace allocates.
  const size_t before = mallinfo2().uordblks;
  void* block = ns_malloc(64 << 10);
  ASSERT_NE(block, nullptr);
  EXPECT_GE(mallinfo2().uordblks, before + (64 << 10));
  ns_free(block);
#endif
  // Under ASan, a free of the other heap's memory aborts.
  void* theirs = ns_malloc(100);
  ASSERT_NE(theirs, nullptr);
  free(theirs);
  void* ours = malloc(100);
  ns_free(ours);
}

TEST(CannLibraryTest, ResolvesBareNamesUnderAscendHomePath) {
  EXPECT_EQ(CannLibrary::Resolve("/a/b/libx.so"), "/a/b/libx.so");
  const std::string home = std::string(getenv("TEST_TMPDIR")) + "/cann";
  ASSERT_EQ(system(("mkdir -p " + home + "/lib64 && touch " + home +
                    "/lib64/libascendcl.so")
                       .c_str()),
            0);
  setenv("ASCEND_HOME_PATH", home.c_str(), 1);
  EXPECT_EQ(CannLibrary::Resolve("libascendcl.so"),
            home + "/lib64/libascendcl.so");
  // Not there: left to the loader's search (LD_LIBRARY_PATH).
  EXPECT_EQ(CannLibrary::Resolve("libopapi.so"), "libopapi.so");
  unsetenv("ASCEND_HOME_PATH");
}

}  // namespace
}  // namespace opserver::ascend
