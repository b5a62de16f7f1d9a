#include "bench/step_callbacks.h"

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "bench/step_workload.h"
#include "server/server.h"

namespace opserver::step_bench {
namespace {

constexpr int kLaunches = 1000;
constexpr int kBatches = 7;  // The first is a warm-up.
constexpr int kQueries = 100000;

// One batch: `launches` launches of a repeatable 16-element executor on
// `stream`, with a NO_BLOCK callback
// after each when `callbacks`, then one synchronize; microseconds.
double CallbackBatchUs(aclOpExecutor* executor, aclrtStream stream,
                       int launches, bool callbacks, std::atomic<int>* ran) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < launches; ++i) {
    CHECK_ACL(aclnnThresholdBackward(nullptr, 0, executor, stream));
    if (callbacks) {
      CHECK_ACL(aclrtLaunchCallback(
          +[](void* count) { ++*static_cast<std::atomic<int>*>(count); }, ran,
          ACL_CALLBACK_NO_BLOCK, stream));
    }
  }
  CHECK_ACL(aclrtSynchronizeStream(stream));
  return Micros(Clock::now() - start);
}

// MindSpore's callback thread: subscribed to the stream, pumping its
// reports until Stop.
class ReportPump {
 public:
  explicit ReportPump(aclrtStream stream) : stream_(stream) {
    pump_ = std::thread([this] {
      thread_id_ = static_cast<uint64_t>(pthread_self());
      while (!stop_) {
        const aclError ret = aclrtProcessReport(100);
        if (ret != ACL_SUCCESS && ret != ACL_ERROR_RT_REPORT_TIMEOUT &&
            ret != ACL_ERROR_RT_THREAD_SUBSCRIBE) {
          Die(absl::StrCat("aclrtProcessReport: ", ret));
        }
      }
    });
    while (thread_id_ == 0) std::this_thread::yield();
    CHECK_ACL(aclrtSubscribeReport(thread_id_, stream_));
  }
  void Stop() {
    CHECK_ACL(aclrtUnSubscribeReport(thread_id_, stream_));
    stop_ = true;
    pump_.join();
  }

 private:
  const aclrtStream stream_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> thread_id_{0};
  std::thread pump_;
};

// aclrtStreamQuery of `stream`, which the library knows idle, kQueries
// times; microseconds per query.
double IdleQueryUs(aclrtStream stream) {
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kQueries; ++i) {
    aclrtStreamStatus status = ACL_STREAM_STATUS_NOT_READY;
    CHECK_ACL(aclrtStreamQuery(stream, &status));
    if (status != ACL_STREAM_STATUS_COMPLETE) Die("an idle stream not ready");
  }
  return Micros(Clock::now() - start) / kQueries;
}

}  // namespace

// --callbacks: see the top of step_bench.cc.
int CallbacksMain() {
  Options options;
  options.listen = "127.0.0.1:0";
  options.detect_mutex_deadlocks = false;
  std::unique_ptr<Server> server =
      Must(Server::Start(options), "Server::Start");
  setenv("OPSERVER_ADDRESS", server->address().c_str(), 1);
  setenv("OPSERVER_PIPELINE", "1", 1);
  CHECK_ACL(aclInit(nullptr));
  CHECK_ACL(aclrtSetDevice(0));
  aclrtStream stream = nullptr;
  CHECK_ACL(aclrtCreateStream(&stream));
  ReportPump pump(stream);
  void* data = DeviceAlloc(16 * sizeof(float));
  const ThresholdCall call = PlanThreshold(data, /*repeatable=*/true);
  const double rtt = RoundTripUs(stream);
  std::atomic<int> ran{0};
  std::vector<double> alone, with;
  for (int batch = 0; batch < kBatches; ++batch) {
    const double a =
        CallbackBatchUs(call.executor, stream, kLaunches, false, &ran);
    const double w =
        CallbackBatchUs(call.executor, stream, kLaunches, true, &ran);
    if (batch > 0) {
      alone.push_back(a);
      with.push_back(w);
    }
  }
  // NO_BLOCK: the synchronize does not wait for the functions; they are
  // all counted before the thread stops.
  while (ran < kBatches * kLaunches) std::this_thread::yield();
  // The stream is idle now, and the library knows it (the synchronize
  // found it so).
  const double query_us = IdleQueryUs(stream);
  const double extra_us = (Median(with) - Median(alone)) / kLaunches;
  std::printf(
      "loopback RTT (mean idle aclrtSynchronizeStream): %.1f us\n"
      "%d launches + %d NO_BLOCK callbacks + 1 synchronize: median %.2f ms; "
      "the launches alone: median %.2f ms (%d batches each)\n"
      "cost per callback: %.2f us = %.3f round trips (target <= 0.1)\n"
      "aclrtStreamQuery on a known-idle stream: %.3f us = %.4f round trips "
      "(%d queries; target: none)\n",
      rtt, kLaunches, kLaunches, Median(with) / 1000, Median(alone) / 1000,
      kBatches - 1, extra_us, extra_us / rtt, query_us, query_us / rtt,
      kQueries);
  pump.Stop();
  DestroyThreshold(call);
  CHECK_ACL(aclrtFree(data));
  CHECK_ACL(aclrtDestroyStream(stream));
  CHECK_ACL(aclrtResetDevice(0));
  CHECK_ACL(aclFinalize());
  return 0;
}

}  // namespace opserver::step_bench
