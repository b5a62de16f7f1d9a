#ifndef OPSERVER_SERVER_LOG_LIMITER_H_
#define OPSERVER_SERVER_LOG_LIMITER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace opserver {

// Rate limit for log lines a peer can cause (its failed calls, gRPC core's
// lines about its failed handshakes). Lines are grouped by cause (e.g.
// "method+code"): the first `max_lines` of a cause in an interval are
// written, the rest only counted, and once the interval is over one line
// "suppressed K similar lines (CAUSE) in the last Ns" says how many. The
// number of causes tracked is bounded (kMaxCauses): past it, new causes
// share one. Thread-safe; no transport, clock and sink are injected.
class LogLimiter {
 public:
  using Clock = std::function<absl::Time()>;
  using Sink = std::function<void(absl::string_view line)>;

  LogLimiter(size_t max_lines, absl::Duration interval, Clock clock, Sink sink);

  // Writes `line` unless its cause has had max_lines in this interval.
  // `cause` must come from a bounded set (method names the server serves,
  // status codes, source locations), never a peer's free text.
  void Log(absl::string_view cause, absl::string_view line);

  // Writes the summaries of every cause with suppressed lines (at
  // shutdown, so none goes unreported).
  void Flush();

  static constexpr size_t kMaxCauses = 256;
  static constexpr char kOtherCauses[] = "other causes";

 private:
  struct Window {
    absl::Time start;
    uint64_t written = 0;
    uint64_t suppressed = 0;
  };

  // Summarizes and forgets the windows that are over at `now` (all of them
  // when `all`).
  void ExpireLocked(absl::Time now, bool all)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_lines_;
  const absl::Duration interval_;
  const Clock clock_;
  const Sink sink_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Window> windows_ ABSL_GUARDED_BY(mu_);
  // When the oldest window ends: nothing to expire before.
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_LOG_LIMITER_H_
