#include "server/log_limiter.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace opserver {

LogLimiter::LogLimiter(size_t max_lines, absl::Duration interval, Clock clock,
                       Sink sink)
    : max_lines_(max_lines),
      interval_(interval),
      clock_(std::move(clock)),
      sink_(std::move(sink)) {}

void LogLimiter::Log(absl::string_view cause, absl::string_view line) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  if (now >= next_expiry_) ExpireLocked(now, /*all=*/false);
  auto it = windows_.find(cause);
  if (it == windows_.end()) {
    // A peer cannot make the table grow without bound: past kMaxCauses the
    // new causes are counted together.
    if (windows_.size() >= kMaxCauses) cause = kOtherCauses;
    it = windows_.try_emplace(cause, Window{now}).first;
    next_expiry_ = std::min(next_expiry_, now + interval_);
  }
  Window& window = it->second;
  if (window.written < max_lines_) {
    ++window.written;
    sink_(line);
  } else {
    ++window.suppressed;
  }
}

void LogLimiter::Flush() {
  absl::MutexLock lock(&mu_);
  ExpireLocked(clock_(), /*all=*/true);
}

void LogLimiter::ExpireLocked(absl::Time now, bool all) {
  // In cause order, so the summaries of one sweep come out the same way
  // every time.
  std::vector<std::string> over;
  next_expiry_ = absl::InfiniteFuture();
  for (const auto& [cause, window] : windows_) {
    const absl::Time end = window.start + interval_;
    if (all || now >= end) {
      over.push_back(cause);
    } else {
      next_expiry_ = std::min(next_expiry_, end);
    }
  }
  std::sort(over.begin(), over.end());
  for (const std::string& cause : over) {
    auto it = windows_.find(cause);
    const Window& window = it->second;
    if (window.suppressed > 0) {
      const absl::Duration elapsed =
          absl::Ceil(now - window.start, absl::Seconds(1));
      sink_(absl::StrCat("suppressed ", window.suppressed, " similar line",
                         window.suppressed == 1 ? "" : "s", " (", cause,
                         ") in the last ", absl::ToInt64Seconds(elapsed), "s"));
    }
    windows_.erase(it);
  }
}

}  // namespace opserver
