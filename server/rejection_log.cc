#include "server/rejection_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/log.h"

namespace opserver {

RejectionLog::RejectionLog(const std::vector<std::string>& known_methods,
                           absl::Duration interval, Clock clock, Sink sink)
    : known_(known_methods.begin(), known_methods.end()),
      interval_(interval),
      clock_(std::move(clock)),
      sink_(std::move(sink)) {}

RejectionLog::RejectionLog(const std::vector<std::string>& known_methods)
    : RejectionLog(known_methods, absl::Seconds(10), absl::Now, LogLine) {}

void RejectionLog::Record(absl::string_view path, absl::string_view reason) {
  const bool known = known_.contains(path);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  if (counting_ && now - since_ >= interval_) FlushLocked(now);
  if (!counting_) {
    // After a quiet spell: this one alone, at once, so a single refused
    // client (a missing or mistyped token) is visible without delay.
    counting_ = true;
    since_ = now;
    sink_(absl::StrCat("rejected call to ",
                       known ? path : absl::string_view("an unknown method"),
                       ": ", reason, " (more are summarized every ",
                       absl::FormatDuration(interval_), ")"));
    return;
  }
  ++total_;
  if (known) {
    ++by_method_[path];
  } else {
    ++unknown_;
  }
}

void RejectionLog::Flush() {
  absl::MutexLock lock(&mu_);
  if (counting_) FlushLocked(clock_());
}

void RejectionLog::FlushLocked(absl::Time now) {
  if (total_ == 0) {
    // A whole interval without a refusal: the next one starts afresh.
    counting_ = false;
    return;
  }
  std::vector<std::pair<std::string, uint64_t>> methods(by_method_.begin(),
                                                        by_method_.end());
  std::sort(methods.begin(), methods.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  const absl::Duration elapsed = absl::Ceil(now - since_, absl::Seconds(1));
  std::string line =
      absl::StrCat("rejected ", total_, " unauthenticated calls in the last ",
                   absl::ToInt64Seconds(elapsed), "s:");
  const char* separator = " ";
  uint64_t others = 0;
  for (size_t i = 0; i < methods.size(); ++i) {
    if (i >= kMaxMethodsListed) {
      others += methods[i].second;
      continue;
    }
    absl::StrAppend(&line, separator, methods[i].second, " to ",
                    methods[i].first);
    separator = ", ";
  }
  if (others > 0) {
    absl::StrAppend(&line, separator, others, " to other methods");
    separator = ", ";
  }
  if (unknown_ > 0) {
    absl::StrAppend(&line, separator, unknown_, " to unknown methods");
  }
  sink_(line);
  total_ = 0;
  unknown_ = 0;
  by_method_.clear();
  since_ = now;
}

}  // namespace opserver
