// Turns a hung test into a diagnosable failure: a test still running after
// OPSERVER_TEST_HANG_SECONDS (default 120) gets its name and every thread's
// stack (from gdb, where the machine has it) printed to stderr, and the
// process aborts. Without it a rare deadlock shows only as Bazel's TIMEOUT
// of the whole binary minutes later, with no clue where it stood (one did,
// once, in a cold CI run and never again in 76 runs under load).
//
// Link it (alwayslink) into a gtest binary; it registers itself.

#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace opserver {
namespace {

class HangWatchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit HangWatchdog(std::chrono::seconds limit) : limit_(limit) {
    // gdb, started below as our child, must be allowed to attach to us.
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    std::thread(&HangWatchdog::Watch, this).detach();  // Lives with the process.
  }

  void OnTestStart(const ::testing::TestInfo& test) override {
    std::lock_guard<std::mutex> lock(mu_);
    name_ = std::string(test.test_suite_name()) + "." + test.name();
    deadline_ = std::chrono::steady_clock::now() + limit_;
    running_ = true;
    changed_.notify_all();
  }

  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    changed_.notify_all();
  }

 private:
  void Watch() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      changed_.wait(lock, [this] { return running_; });
      const auto deadline = deadline_;
      if (changed_.wait_until(lock, deadline, [this, deadline] {
            return !running_ || deadline_ != deadline;
          })) {
        continue;  // It ended, or the next one started.
      }
      std::fprintf(stderr,
                   "\n[hang watchdog] %s is still running after %lld s; the "
                   "stacks of every thread follow, then abort\n",
                   name_.c_str(), static_cast<long long>(limit_.count()));
      std::fflush(stderr);
      const std::string gdb =
          "command -v gdb >/dev/null && timeout 120 gdb -p " +
          std::to_string(getpid()) +
          " -batch -nx -ex 'set pagination off' -ex 'thread apply all bt' "
          "</dev/null 1>&2 || echo '[hang watchdog] no gdb: no stacks' 1>&2";
      if (std::system(gdb.c_str()) != 0) {
        std::fprintf(stderr, "[hang watchdog] gdb failed\n");
      }
      std::abort();
    }
  }

  const std::chrono::seconds limit_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::string name_;
  std::chrono::steady_clock::time_point deadline_;
  bool running_ = false;
};

const bool registered = [] {
  long long seconds = 120;
  if (const char* env = std::getenv("OPSERVER_TEST_HANG_SECONDS")) {
    seconds = std::atoll(env);
  }
  if (seconds <= 0) return false;  // Off.
  // gtest owns (and never frees before exit) what it is given.
  ::testing::UnitTest::GetInstance()->listeners().Append(
      new HangWatchdog(std::chrono::seconds(seconds)));
  return true;
}();

}  // namespace
}  // namespace opserver
