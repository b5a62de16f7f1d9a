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

// What the watching thread shares with the listener. Never freed: gtest
// deletes its listeners at exit, while the thread still waits on this.
struct Watch {
  std::chrono::seconds limit;
  std::mutex mu;
  std::condition_variable changed;
  std::string name;
  std::chrono::steady_clock::time_point deadline;
  bool running = false;
};

[[noreturn]] void Run(Watch* w) {
  std::unique_lock<std::mutex> lock(w->mu);
  for (;;) {
    w->changed.wait(lock, [w] { return w->running; });
    const auto deadline = w->deadline;
    if (w->changed.wait_until(lock, deadline, [w, deadline] {
          return !w->running || w->deadline != deadline;
        })) {
      continue;  // It ended, or the next one started.
    }
    std::fprintf(stderr,
                 "\n[hang watchdog] %s is still running after %lld s; the "
                 "stacks of every thread follow, then abort\n",
                 w->name.c_str(), static_cast<long long>(w->limit.count()));
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

class HangWatchdog : public ::testing::EmptyTestEventListener {
 public:
  explicit HangWatchdog(std::chrono::seconds limit) : watch_(new Watch) {
    watch_->limit = limit;
    // gdb, started below as our child, must be allowed to attach to us.
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    std::thread(Run, watch_).detach();  // Lives with the process.
  }

  void OnTestStart(const ::testing::TestInfo& test) override {
    std::lock_guard<std::mutex> lock(watch_->mu);
    watch_->name = std::string(test.test_suite_name()) + "." + test.name();
    watch_->deadline = std::chrono::steady_clock::now() + watch_->limit;
    watch_->running = true;
    watch_->changed.notify_all();
  }

  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(watch_->mu);
    watch_->running = false;
    watch_->changed.notify_all();
  }

 private:
  Watch* const watch_;
};

const bool registered = [] {
  long long seconds = 120;
  if (const char* env = std::getenv("OPSERVER_TEST_HANG_SECONDS")) {
    seconds = std::atoll(env);
  }
  if (seconds <= 0) return false;  // Off.
  // gtest owns the listener (and deletes it at exit).
  ::testing::UnitTest::GetInstance()->listeners().Append(
      new HangWatchdog(std::chrono::seconds(seconds)));
  return true;
}();

}  // namespace
}  // namespace opserver
