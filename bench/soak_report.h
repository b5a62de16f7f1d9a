// The soak's bookkeeping: what each call was expected to end with, how it
// did end, counts by RPC, code and category, and the Markdown tables of the
// report. Every outcome is either expected (OK, or an error some request or
// fault provoked on purpose, with the category that explains it) or not.
#ifndef OPSERVER_BENCH_SOAK_REPORT_H_
#define OPSERVER_BENCH_SOAK_REPORT_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.pb.h"

namespace opserver::soak {

using grpc::StatusCode;

constexpr uint32_t Bit(StatusCode code) { return 1u << static_cast<int>(code); }

const char* CodeName(int code);

// What a call is expected to end with. A valid request expects OK only; an
// invalid request or a fault names the category that explains its errors.
struct Expect {
  std::string category;  // "" = a valid request.
  uint32_t codes = Bit(StatusCode::OK);
  // Evaluate: RESOURCE_EXHAUSTED from --max_concurrent_evaluates is counted
  // as "evaluate_busy" whatever else was expected.
  bool evaluate = false;
};

Expect Valid();
Expect Invalid(std::string category, uint32_t codes);

struct Outcome {
  StatusCode code = StatusCode::OK;
  int aclnn = 0;  // From the trailing metadata; 0 when absent.
  std::string message;
  bool ok() const { return code == StatusCode::OK; }
};

// The outcome of a raw call: its status and the aclnn status from the
// trailing metadata.
Outcome FromStatus(const grpc::Status& status,
                   const grpc::ClientContext& context);
// The outcome of a client library call (same canonical codes; the aclnn
// status the library put in the payload).
Outcome FromAbsl(const absl::Status& status);

// Why each category of error happens. Every error the soak sees must be in
// one of these; anything else is unexpected.
const std::map<std::string, std::string>& Explanations();

class Stats {
 public:
  // Counts one call; returns whether its outcome was expected. Unexpected
  // outcomes are printed (the first 40) and kept for the report.
  bool Record(absl::string_view rpc, const Expect& expect, const Outcome& o) {
    std::string category = expect.category;
    bool expected = (expect.codes & Bit(o.code)) != 0;
    if (expect.evaluate && o.code == StatusCode::RESOURCE_EXHAUSTED &&
        absl::StrContains(o.message, "--max_concurrent_evaluates")) {
      category = "evaluate_busy";
      expected = true;
    }
    absl::MutexLock lock(&mu_);
    PerRpc& calls = calls_[std::string(rpc)];
    ++calls.calls;
    if (o.ok() && expected) {
      ++calls.ok;
      return true;
    }
    if (expected) {
      ++calls.expected_errors;
    } else {
      ++calls.unexpected;
    }
    if (category.empty()) category = "(valid request)";
    ++results_[ResultKey{o.code, o.aclnn, category, expected}]
          .by_rpc[std::string(rpc)];
    if (!expected) {
      NoteUnexpectedLocked(
          absl::StrCat(rpc, " [", category, "]: ", CodeName(o.code), " aclnn ",
                       o.aclnn, ": ", o.message.substr(0, 300)));
    }
    return expected;
  }

  // Something wrong that is not a call's status: a wrong result, session
  // stats that disagree with what the client holds, a lost reply.
  void Problem(absl::string_view check, absl::string_view detail) {
    absl::MutexLock lock(&mu_);
    ++problems_[std::string(check)];
    NoteUnexpectedLocked(absl::StrCat(check, ": ", detail.substr(0, 400)));
  }

  uint64_t total_calls() const {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [rpc, c] : calls_) n += c.calls;
    return n;
  }
  uint64_t unexpected() const {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [rpc, c] : calls_) n += c.unexpected;
    for (const auto& [check, count] : problems_) n += count;
    return n;
  }
  uint64_t expected_errors() const {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [rpc, c] : calls_) n += c.expected_errors;
    return n;
  }

  // Markdown tables: calls by RPC, results by code, problems, samples.
  std::string Report(bool with_rpc_table) const {
    absl::MutexLock lock(&mu_);
    std::string out;
    if (with_rpc_table) {
      absl::StrAppend(&out,
                      "| RPC | calls | OK | expected errors | unexpected |\n"
                      "|---|---:|---:|---:|---:|\n");
      PerRpc total;
      for (const auto& [rpc, c] : calls_) {
        absl::StrAppend(&out, "| ", rpc, " | ", c.calls, " | ", c.ok, " | ",
                        c.expected_errors, " | ", c.unexpected, " |\n");
        total.calls += c.calls;
        total.ok += c.ok;
        total.expected_errors += c.expected_errors;
        total.unexpected += c.unexpected;
      }
      absl::StrAppend(&out, "| **total** | **", total.calls, "** | **",
                      total.ok, "** | **", total.expected_errors, "** | **",
                      total.unexpected, "** |\n\n");
    }
    std::vector<std::pair<uint64_t, const ResultKey*>> rows;
    for (const auto& [key, result] : results_) {
      uint64_t n = 0;
      for (const auto& [rpc, count] : result.by_rpc) n += count;
      rows.emplace_back(n, &key);
    }
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
      if (a.second->expected != b.second->expected) return !a.second->expected;
      return a.first > b.first;
    });
    absl::StrAppend(&out,
                    "| gRPC code | aclnn | category | expected | count | "
                    "RPCs (count) |\n|---|---:|---|---|---:|---|\n");
    for (const auto& [n, key] : rows) {
      std::vector<std::string> rpcs;
      for (const auto& [rpc, count] : results_.at(*key).by_rpc) {
        rpcs.push_back(absl::StrCat(rpc, " ", count));
      }
      absl::StrAppend(&out, "| ", CodeName(key->code), " | ",
                      key->aclnn == 0 ? "-" : absl::StrCat(key->aclnn), " | ",
                      key->category, " | ", key->expected ? "yes" : "**NO**",
                      " | ", n, " | ", absl::StrJoin(rpcs, ", "), " |\n");
    }
    for (const auto& [check, count] : problems_) {
      absl::StrAppend(&out, "| - | - | ", check, " | **NO** | ", count,
                      " | (client-side check) |\n");
    }
    if (!samples_.empty()) {
      absl::StrAppend(&out, "\nUnexpected outcomes (first ", samples_.size(),
                      "):\n\n");
      for (const std::string& s : samples_) {
        absl::StrAppend(&out, "    ", s, "\n");
      }
    }
    return out;
  }

  std::set<std::string> categories() const {
    absl::MutexLock lock(&mu_);
    std::set<std::string> names;
    for (const auto& [key, result] : results_) {
      if (key.expected) names.insert(key.category);
    }
    return names;
  }

 private:
  struct PerRpc {
    uint64_t calls = 0, ok = 0, expected_errors = 0, unexpected = 0;
  };
  struct ResultKey {
    StatusCode code;
    int aclnn;
    std::string category;
    bool expected;
    bool operator<(const ResultKey& o) const {
      return std::tie(expected, category, code, aclnn) <
             std::tie(o.expected, o.category, o.code, o.aclnn);
    }
  };
  struct Result {
    std::map<std::string, uint64_t> by_rpc;
  };

  void NoteUnexpectedLocked(std::string line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (printed_ < 40) {
      ++printed_;
      std::fprintf(stderr, "soak: UNEXPECTED %s\n", line.c_str());
    }
    if (samples_.size() < 40) samples_.push_back(std::move(line));
  }

  mutable absl::Mutex mu_;
  std::map<std::string, PerRpc> calls_ ABSL_GUARDED_BY(mu_);
  std::map<ResultKey, Result> results_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> problems_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> samples_ ABSL_GUARDED_BY(mu_);
  int printed_ ABSL_GUARDED_BY(mu_) = 0;
};

// One sample of the server process (ReadProc) and its GetServerStats.
struct ProcSample {
  double t = 0;  // Seconds since the load started (negative: before).
  int64_t rss_kb = -1, hwm_kb = -1, threads = -1, fds = -1;
  int64_t sessions = -1, buffers = -1, buffer_bytes = -1;
  std::map<std::string, int> thread_names;  // Only when asked for.
};

// Whether the server's RSS grew in the second half of the load. Flat:
// after the first third (warm-up: the reuse cache, gRPC's and malloc's
// pools reach their working size), the last third's median RSS is at most
// 10% + 32 MiB above the middle third's, and its peak at most 25% + 64 MiB
// above the middle third's peak.
struct RssAnalysis {
  bool enough = false;  // Samples in both thirds.
  bool flat = true;
  std::string verdict;
  ProcSample middle;  // The sample nearest the middle of the load.
  // Twenty samples across the load, for the shape of the curve.
  std::vector<std::string> series;
};
RssAnalysis AnalyzeRss(const std::vector<ProcSample>& samples, double total_s,
                       bool enforced);

// The server's stderr: lines by kind, the first lines of no known kind
// (each is a failure), and whether it said "stopped".
struct ServerLog {
  std::map<std::string, uint64_t> kinds;
  std::vector<std::string> odd_lines;
  bool stopped = false;
};

// Everything the Markdown report shows.
struct RunSummary {
  std::string command;
  std::vector<std::string> server_argv;
  uint64_t seed = 0;
  int clients = 0;
  absl::Duration duration, ran, kill_interval;
  std::string load_before, load_during;
  bool secure = false;
  int library_clients = 0, hostile_clients = 0;
  std::string log;
  const Stats* stats = nullptr;
  const Stats* shutdown_stats = nullptr;
  std::string killer_report;   // Empty: no fault children.
  v1::ServerStats load_stats;  // At the end of the load.
  ProcSample start, end_of_load, after_clients;
  RssAnalysis rss;
  bool server_died = false;
  v1::ServerStats first_stats, last_stats;  // After the clients ended.
  double zero_after_s = -1;
  int idle_timeout_s = 0;
  int sigterm_clients = 0;
  uint64_t calls_before_term = 0;
  std::string exit_text;
  double exit_ms = -1;
  std::string held_text;
  ServerLog server_log;
  std::vector<std::string> failures;
};
std::string FormatReport(const RunSummary& r);

// "name count, ..." of ThreadNames.
std::string FormatNames(const std::map<std::string, int>& names);
double Median(std::vector<double> v);
// Kilobytes as MiB with one decimal; "?" when unknown (negative).
std::string Mib(int64_t kb);

}  // namespace opserver::soak

#endif  // OPSERVER_BENCH_SOAK_REPORT_H_
