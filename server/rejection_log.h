#ifndef OPSERVER_SERVER_REJECTION_LOG_H_
#define OPSERVER_SERVER_REJECTION_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace opserver {

// The log of calls refused for want of a valid token. Anyone who can reach
// the port can be refused as often as they like, with a method path of
// their choosing, so the log must not grow with them: the first refusal
// after a quiet spell is logged as one line, and the ones after it are
// counted and summarized in at most one line per interval ("rejected K
// unauthenticated calls in the last 10s: M to /opserver.v1.Operators/
// Execute, ..., L to unknown methods"). Only paths the server really
// serves are ever named; any other counts as an unknown method, so a
// caller can neither write text of its choosing into the log nor make the
// summary grow. Thread-safe.
class RejectionLog {
 public:
  using Clock = std::function<absl::Time()>;
  using Sink = std::function<void(absl::string_view line)>;

  // `known_methods`: the "/package.Service/Method" paths to name. `sink`
  // gets each line (LogLine in the server); `clock` is absl::Now there.
  RejectionLog(const std::vector<std::string>& known_methods,
               absl::Duration interval, Clock clock, Sink sink);
  // The server's: LogLine, absl::Now, a summary at most every 10 s.
  explicit RejectionLog(const std::vector<std::string>& known_methods);

  // One refused call to `path`, refused for `reason` (the server's own
  // message, never the caller's text).
  void Record(absl::string_view path, absl::string_view reason);

  // Logs the summary of the refusals counted since the last line, if any
  // (at shutdown, so none goes unreported).
  void Flush();

  // Methods named in one summary; the others are added up.
  static constexpr size_t kMaxMethodsListed = 8;

 private:
  void FlushLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::flat_hash_set<std::string> known_;
  const absl::Duration interval_;
  const Clock clock_;
  const Sink sink_;
  absl::Mutex mu_;
  // A refusal was logged and the counting since has not paused for a whole
  // interval.
  bool counting_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time since_ ABSL_GUARDED_BY(mu_);
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unknown_ ABSL_GUARDED_BY(mu_) = 0;
  // Keys are members of known_ only: bounded by the server's methods.
  absl::flat_hash_map<std::string, uint64_t> by_method_ ABSL_GUARDED_BY(mu_);
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_REJECTION_LOG_H_
