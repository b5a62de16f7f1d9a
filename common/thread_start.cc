#include "common/thread_start.h"

#include <atomic>
#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace opserver {
namespace {

std::atomic<bool> fail_for_testing{false};

}  // namespace

std::thread NewThread(std::function<void()> fn) {
  if (fail_for_testing.load(std::memory_order_relaxed)) {
    // What std::thread throws when pthread_create says EAGAIN.
    throw std::system_error(std::error_code(EAGAIN, std::generic_category()));
  }
  return std::thread(std::move(fn));
}

absl::StatusOr<std::thread> StartThread(absl::string_view what,
                                        std::function<void()> fn) {
  try {
    return NewThread(std::move(fn));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", what, ": ", e.what()));
  }
}

void FailThreadStartsForTesting(bool fail) {
  fail_for_testing.store(fail, std::memory_order_relaxed);
}

}  // namespace opserver
