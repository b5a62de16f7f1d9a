// Soak and faults: a bounded program that runs the real `opserver` binary as
// a child process on loopback and leans on it the way many careless, hostile
// and unlucky clients would, then checks that it is none the worse for it.
//
//   bazel run -c opt //bench:soak -- --clients=64 --duration=10m
//
// Phases (each bounded; a watchdog ends the program if one hangs):
//  1. Start `opserver --listen=127.0.0.1:0` (port read from its "listening
//     on" line) and sample its RSS, threads and fds while idle.
//  2. For --duration, --clients threads each loop over randomly chosen
//     scenarios that together call every RPC of Runtime, Operators and
//     grpc.health.v1: valid work whose results are checked against a host
//     reference (all five operators, every dtype, strided/broadcast/packed/
//     in-place layouts, workspaces, repeatable executors, ExecuteStream,
//     streams, transfers of up to 16 MiB), invalid requests made on purpose
//     (bad and foreign handles, bad shapes and dtypes, oversized requests,
//     bad ranges and uploads, ...), and calls abandoned mid-upload,
//     mid-download and mid-ExecuteStream (TryCancel, deadlines, CloseSession
//     under a running pipeline, cancelled Attach calls). Meanwhile a killer
//     thread starts child client processes (this binary in --fault_child
//     mode) every --kill_interval and SIGKILLs each in the middle of an
//     upload, a download or a pipeline, so the server sees real connection
//     resets. Every call's outcome is classified: OK, an expected error (the
//     category of invalid request or fault that provoked it) or unexpected.
//  3. Clients end (closing, dropping their Attach call, or abandoning their
//     session to the idle reaper), then GetServerStats must reach zero
//     sessions, buffers and bytes, and the server's fds their idle count.
//  4. A fresh batch of load starts (--sigterm_clients threads of valid work,
//     two of them 64 MiB transfers paced to outlast the grace, plus an
//     Attach call and a health Watch held open), the server gets SIGTERM in
//     the middle of it, and must exit with status 0 within its shutdown
//     grace (5 s) + 3 s; the Attach must see "server shutting down" and the
//     Watch NOT_SERVING.
//
// The report (Markdown, on stdout and in --report) has calls by RPC, results
// by gRPC code and aclnn status with what provoked each, server RSS at
// start/middle/end, leaks and the exit status. The exit status is 1 when
// anything was unexpected: an error no request provoked on purpose, a wrong
// result, a leak, RSS growth in the second half of the load (the last
// third's median more than 10% + 32 MiB above the middle third's, or its
// peak more than 25% + 64 MiB above; enforced for runs of 3 minutes or
// more), a server crash, a slow or non-zero exit after SIGTERM, or a server
// log line of a kind it should not write.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/half.h"
#include "proto/opserver.grpc.pb.h"

extern char** environ;

ABSL_FLAG(std::string, opserver, "",
          "Path of the opserver binary to run (bazel run passes it).");
ABSL_FLAG(int, clients, 64, "Concurrent client threads.");
ABSL_FLAG(absl::Duration, duration, absl::Minutes(10),
          "How long the clients run (e.g. 10m, 10s).");
ABSL_FLAG(uint64_t, seed, 0, "Random seed (0 = from the clock; printed).");
ABSL_FLAG(absl::Duration, kill_interval, absl::Milliseconds(500),
          "Pause between child client processes killed with SIGKILL in the "
          "middle of a transfer (0 = no child processes).");
ABSL_FLAG(int, idle_timeout_s, 20,
          "The server's --idle_timeout_s: sessions of killed unattached "
          "children are reaped after it, so the leak check waits that long.");
ABSL_FLAG(uint64_t, memory_cache_bytes, 256ull << 20,
          "The server's --memory_cache_bytes (freed device memory it keeps "
          "for reuse; bounded so that RSS reaches its plateau early).");
ABSL_FLAG(std::vector<std::string>, server_flags, {},
          "More flags for the server, comma-separated.");
ABSL_FLAG(int, sigterm_clients, 16,
          "Client threads running while the server gets SIGTERM.");
ABSL_FLAG(std::string, rss_check, "auto",
          "on, off, or auto (on when --duration is at least 3 minutes): "
          "fail when RSS grows in the second half of the run.");
ABSL_FLAG(std::string, report, "", "Also write the report to this file.");
ABSL_FLAG(std::string, log_dir, "",
          "Where the server's stderr goes (default: "
          "$TEST_UNDECLARED_OUTPUTS_DIR, else a new directory under /tmp).");
// Internal: the child client processes that get killed.
ABSL_FLAG(std::string, fault_child, "",
          "Internal: upload, download or pipeline.");
ABSL_FLAG(std::string, server, "", "Internal: the server a fault child dials.");
ABSL_FLAG(bool, attach, false,
          "Internal: the fault child attaches its session.");
ABSL_FLAG(int, parent_pid, 0, "Internal: the soak process.");

namespace opserver::soak {
namespace {

using grpc::StatusCode;
using v1::DataType;

constexpr char kAclnnKey[] = "opserver-aclnn-status";
constexpr absl::Duration kCallDeadline = absl::Seconds(60);
constexpr absl::Duration kTransferDeadline = absl::Seconds(120);
// The server's --max_values default; requests just past it are "oversized".
constexpr uint64_t kMaxValues = 1u << 20;

constexpr uint32_t Bit(StatusCode code) { return 1u << static_cast<int>(code); }

const char* CodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  if (code >= 0 && code <= 16) return kNames[code];
  return "?";
}

// ============================================================ classification

// What a call is expected to end with. A valid request expects OK only; an
// invalid request or a fault names the category that explains its errors.
struct Expect {
  std::string category;  // "" = a valid request.
  uint32_t codes = Bit(StatusCode::OK);
  // Evaluate: RESOURCE_EXHAUSTED from --max_concurrent_evaluates is counted
  // as "evaluate_busy" whatever else was expected.
  bool evaluate = false;
};

Expect Valid() { return Expect(); }
Expect Invalid(std::string category, uint32_t codes) {
  Expect e;
  e.category = std::move(category);
  e.codes = codes;
  return e;
}

struct Outcome {
  StatusCode code = StatusCode::OK;
  int aclnn = 0;  // From the trailing metadata; 0 when absent.
  std::string message;
  bool ok() const { return code == StatusCode::OK; }
};

Outcome FromStatus(const grpc::Status& status,
                   const grpc::ClientContext& context) {
  Outcome o;
  o.code = status.error_code();
  if (status.ok()) return o;
  o.message = status.error_message();
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kAclnnKey);
  if (it != trailers.end()) {
    absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                     &o.aclnn);
  }
  return o;
}

// Why each category of error happens. Every error the soak sees must be in
// one of these; anything else is unexpected.
const std::map<std::string, std::string>& Explanations() {
  static const auto* const kText = new std::map<std::string, std::string>{
      {"bad_session",
       "a made-up session token: NOT_FOUND, exactly as for a closed or "
       "timed-out session"},
      {"empty_session",
       "an empty session field: INVALID_ARGUMENT (CloseSession of \"\" is "
       "NOT_FOUND: nothing to close)"},
      {"closed_session",
       "a call naming a session after its CloseSession, and a second "
       "CloseSession: NOT_FOUND"},
      {"foreign_handle",
       "a buffer, stream or executor number taken from another client's "
       "session (and not one of this session's) used with this client's "
       "session: NOT_FOUND (aclnn 161002 inside GetWorkspaceSize and "
       "workspaces, 561103 for executors); Execute of such an executor is "
       "FAILED_PRECONDITION 561103 when the number is below this session's "
       "next handle (indistinguishable from a consumed one)"},
      {"unknown_handle",
       "handle numbers no session ever made (2^60): NOT_FOUND (561103 for "
       "executors)"},
      {"freed_buffer", "a buffer used or freed again after Free: NOT_FOUND"},
      {"consumed_executor",
       "a single-use executor launched a second time: FAILED_PRECONDITION, "
       "aclnn 561103; destroyed or made repeatable after its launch: "
       "NOT_FOUND 561103"},
      {"bad_shape",
       "tensor views the operator refuses: more than 8 dims, a negative dim, "
       "a view reaching past its buffer or starting past it, an output that "
       "overlaps itself, huge strides, shapes that do not match or "
       "broadcast, a wrong out shape or mask size: INVALID_ARGUMENT, aclnn "
       "161002"},
      {"bad_dtype",
       "a dtype number that is no aclDataType (5, 99), or one the operator "
       "or argument does not take: INVALID_ARGUMENT, aclnn 161002"},
      {"bad_param",
       "operator parameters and names the API refuses: unknown operator or "
       "tensor name, lambd < 0, scale in (0, 1) or NaN, a non-integer "
       "integer negativeSlope, a negative slope with selfIsResult "
       "(INVALID_ARGUMENT 161002); negativeSlope or a tensor missing "
       "(INVALID_ARGUMENT 161001); Evaluate with a values count that does "
       "not match its shape"},
      {"oversized",
       "requests past a server limit: Malloc of 2^40 and 2^64-1 bytes "
       "(--session_memory_bytes), ReadValues/WriteValues/Evaluate of more "
       "than --max_values values: RESOURCE_EXHAUSTED"},
      {"bad_range",
       "a transfer, typed-values or workspace range reaching outside its "
       "buffer (including offset + size overflowing 2^64): INVALID_ARGUMENT "
       "(161002 for a workspace)"},
      {"bad_upload",
       "an Upload that sends more or fewer bytes than its header announced, "
       "or ends before any message: INVALID_ARGUMENT"},
      {"bad_value",
       "typed values that are not in the dtype (1.5 or NaN into INT32, 300 "
       "into INT8, -1 into UINT8, 2 into BOOL): INVALID_ARGUMENT"},
      {"small_workspace",
       "Execute with less workspace than GetWorkspaceSize reported "
       "(INVALID_ARGUMENT 161002) or no workspace buffer (NOT_FOUND 161002); "
       "the executor survives and the retry with the right workspace is OK"},
      {"stream0",
       "DestroyStream of stream 0, the default stream: INVALID_ARGUMENT"},
      {"destroyed_stream", "a stream used after DestroyStream: NOT_FOUND"},
      {"stream_limit",
       "CreateStream until the session has --max_streams_per_session (16) "
       "streams: the next is RESOURCE_EXHAUSTED"},
      {"long_name",
       "CreateSession with a 257-byte client_name: INVALID_ARGUMENT"},
      {"unknown_health_service",
       "grpc.health.v1 Check of a service the server does not have: "
       "NOT_FOUND"},
      {"evaluate_busy",
       "Evaluate refused because --max_concurrent_evaluates (4) calls were "
       "already computing: RESOURCE_EXHAUSTED, the designed admission limit "
       "(64 clients share 4 slots)"},
      {"cancel_upload",
       "the client cancelled (TryCancel) or let a short deadline expire in "
       "the middle of an Upload: CANCELLED or DEADLINE_EXCEEDED, reported by "
       "the client library; OK when the upload won the race"},
      {"cancel_download",
       "the client cancelled before or after reading some chunks of a "
       "Download, or let a short deadline expire: CANCELLED or "
       "DEADLINE_EXCEEDED; OK when the download won the race"},
      {"cancel_pipeline",
       "the client cancelled an ExecuteStream with launches in flight: "
       "CANCELLED (the launches it queued still run; the stream then "
       "synchronizes OK)"},
      {"close_mid_pipeline",
       "CloseSession while the session's ExecuteStream is running: launches "
       "that reach the server after the close are answered NOT_FOUND in "
       "their reply, one already past the session lookup when the close "
       "lands CANCELLED \"the stream's session was closed\" (the call "
       "itself ends OK)"},
      {"attach_cancel",
       "the client cancels the Attach call its session is bound to: the "
       "Attach ends CANCELLED (OK when the server ended it first, after "
       "CloseSession), and once the server has closed the session the "
       "client's calls on it are NOT_FOUND"},
      {"close_mid_transfer",
       "CloseSession from another thread while the session's Upload or "
       "Download is running: the server ends the transfer (review finding "
       "5c), which sees CANCELLED (an Upload with aclnn 361001 'transfer "
       "ended: its stream was destroyed or its session closed'; a Download "
       "without, since no status can follow its unread chunks), OK when it "
       "had finished first, or NOT_FOUND when the close came before it "
       "started; the memory is released when it ends"},
      {"watch_end",
       "the client cancels its grpc.health.v1 Watch after the first status: "
       "CANCELLED"},
      {"unread_pipeline",
       "an ExecuteStream client that writes 3000 launches and never reads a "
       "reply, under a 1-3 s deadline: DEADLINE_EXCEEDED once the server "
       "stops reading at --max_pending_replies and flow control blocks the "
       "writer; OK when the transport absorbed every reply first"},
      {"server_shutdown",
       "calls running or starting while the server stops after SIGTERM: "
       "UNAVAILABLE (connection closing or refused) or CANCELLED (still "
       "running when the grace period ended)"},
  };
  return *kText;
}

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

// ================================================================== dtypes

int DSize(DataType dt) {
  switch (dt) {
    case v1::FLOAT:
    case v1::INT32:
    case v1::UINT32:
      return 4;
    case v1::DOUBLE:
    case v1::INT64:
    case v1::UINT64:
      return 8;
    case v1::FLOAT16:
    case v1::BF16:
    case v1::INT16:
    case v1::UINT16:
      return 2;
    default:
      return 1;
  }
}

bool IsIntegral(DataType dt) {
  return dt == v1::INT32 || dt == v1::INT8 || dt == v1::UINT8;
}

void EncodeValue(DataType dt, double v, char* p) {
  switch (dt) {
    case v1::FLOAT: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case v1::DOUBLE:
      std::memcpy(p, &v, 8);
      break;
    case v1::FLOAT16: {
      uint16_t h = kernels::FloatToHalf(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case v1::BF16: {
      uint16_t b = kernels::FloatToBFloat16(static_cast<float>(v));
      std::memcpy(p, &b, 2);
      break;
    }
    case v1::INT32: {
      int32_t i = static_cast<int32_t>(v);
      std::memcpy(p, &i, 4);
      break;
    }
    case v1::INT8:
      *p = static_cast<char>(static_cast<int8_t>(v));
      break;
    default:  // UINT8 (the mask too)
      *p = static_cast<char>(static_cast<uint8_t>(v));
      break;
  }
}

double DecodeValue(DataType dt, const char* p) {
  switch (dt) {
    case v1::FLOAT: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case v1::DOUBLE: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case v1::FLOAT16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return kernels::HalfToFloat(h);
    }
    case v1::BF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return kernels::BFloat16ToFloat(b);
    }
    case v1::INT32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case v1::INT8:
      return static_cast<int8_t>(*p);
    default:
      return static_cast<uint8_t>(*p);
  }
}

double RoundTo(DataType dt, double v) {
  char bytes[8];
  EncodeValue(dt, v, bytes);
  return DecodeValue(dt, bytes);
}

std::string Encode(DataType dt, const std::vector<double>& values) {
  std::string out(values.size() * DSize(dt), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    EncodeValue(dt, values[i], out.data() + i * DSize(dt));
  }
  return out;
}

// ================================================================ operators

enum Op { kThreshold, kSoftshrink, kHardswish, kLeaky, kDropout, kNumOps };
const char* const kOpNames[] = {"ThresholdBackward", "SoftshrinkBackward",
                                "HardswishBackward", "LeakyReluBackward",
                                "DropoutBackward"};
const char* SecondName(int op) { return op == kDropout ? "mask" : "self"; }
const char* OutName(int op) { return op == kSoftshrink ? "gradInput" : "out"; }

std::vector<DataType> OpDTypes(int op) {
  switch (op) {
    case kThreshold:
      return {v1::FLOAT, v1::FLOAT16, v1::BF16, v1::INT32, v1::INT8, v1::UINT8};
    case kLeaky:
      return {v1::FLOAT, v1::FLOAT16, v1::BF16, v1::DOUBLE};
    default:
      return {v1::FLOAT, v1::FLOAT16, v1::BF16};
  }
}

v1::TensorDesc Desc(uint64_t buffer, DataType dt, std::vector<int64_t> shape,
                    std::vector<int64_t> strides = {}, int64_t offset = 0,
                    uint64_t buffer_offset = 0) {
  v1::TensorDesc d;
  d.set_buffer(buffer);
  d.set_buffer_offset(buffer_offset);
  d.set_dtype(dt);
  for (int64_t s : shape) d.add_shape(s);
  for (int64_t s : strides) d.add_strides(s);
  d.set_offset(offset);
  return d;
}

// The kernels' formulas (kernels/ops/), computed the same way in
// float so that results compare within rounding.
double Reference(int op, DataType dt, const v1::OpParams& p, double g, double x,
                 bool bit) {
  const float gf = static_cast<float>(g);
  const float xf = static_cast<float>(x);
  switch (op) {
    case kThreshold:
      if (IsIntegral(dt)) return x > p.threshold() ? g : 0;
      return xf <= static_cast<float>(p.threshold()) ? 0.0 : g;
    case kSoftshrink:
      return std::fabs(xf) <= static_cast<float>(p.lambd()) ? 0.0 : g;
    case kHardswish: {
      const float d =
          xf < -3.0f ? 0.0f : (xf <= 3.0f ? xf / 3.0f + 0.5f : 1.0f);
      return RoundTo(dt, gf * d);
    }
    case kLeaky: {
      const double slope = p.negative_slope().value();
      if (dt == v1::DOUBLE) return x > 0 ? g : g * slope;
      return RoundTo(dt, xf > 0 ? gf : gf * static_cast<float>(slope));
    }
    default:  // Dropout: scale 0 zeroes, scale 1 copies, else the mask.
      if (p.scale() == 0) return 0.0;
      if (p.scale() == 1) return g;
      return bit ? RoundTo(dt, gf * static_cast<float>(p.scale())) : 0.0;
  }
}

bool CloseEnough(DataType dt, double got, double want, double g) {
  if (std::isnan(want)) return std::isnan(got);
  double tol = 0;
  switch (dt) {
    case v1::FLOAT16:
      tol = 2e-3;
      break;
    case v1::BF16:
      tol = 1.6e-2;
      break;
    case v1::FLOAT:
      tol = 1e-6;
      break;
    case v1::DOUBLE:
      tol = 1e-12;
      break;
    default:
      return got == want;
  }
  return std::fabs(got - want) <= tol * std::max(std::fabs(want), std::fabs(g));
}

// ============================================================== connections

struct Conn {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Runtime::Stub> rt;
  std::unique_ptr<v1::Operators::Stub> ops;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

// `own_connection`: a TCP connection of its own rather than one shared with
// every other channel of the process that has the same arguments.
std::shared_ptr<Conn> Connect(const std::string& address, bool own_connection) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto conn = std::make_shared<Conn>();
  conn->channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args);
  conn->rt = v1::Runtime::NewStub(conn->channel);
  conn->ops = v1::Operators::NewStub(conn->channel);
  conn->health = grpc::health::v1::Health::NewStub(conn->channel);
  return conn;
}

void SetDeadline(grpc::ClientContext* context, absl::Duration d) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + d));
}

// ================================================================== sessions

// A session as its client knows it: every handle it holds, so that stats,
// foreign handles and cleanup can be checked exactly.
struct SessionState {
  std::string token;
  bool attached = false;
  std::unique_ptr<grpc::ClientContext> attach_context;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attach_reader;
  std::map<uint64_t, uint64_t> buffers;  // handle -> size
  std::set<uint64_t> streams;
  std::set<uint64_t> executors;  // Not yet consumed (or repeatable).
  std::set<uint64_t> repeatable;
  bool open() const { return !token.empty(); }
  bool Owns(uint64_t handle) const {
    return buffers.count(handle) || streams.count(handle) ||
           executors.count(handle);
  }
};

// Handles other clients hold, for the foreign-handle requests.
class ForeignHandles {
 public:
  void Publish(char kind, uint64_t handle) {
    absl::MutexLock lock(&mu_);
    auto& ring = rings_[kind];
    if (ring.size() < 512) {
      ring.push_back(handle);
    } else {
      ring[next_[kind]++ % ring.size()] = handle;
    }
  }
  // A handle of `kind` some other session made, or 0.
  uint64_t Pick(char kind, std::mt19937_64& rng) {
    absl::MutexLock lock(&mu_);
    auto& ring = rings_[kind];
    if (ring.empty()) return 0;
    return ring[rng() % ring.size()];
  }

 private:
  absl::Mutex mu_;
  std::map<char, std::vector<uint64_t>> rings_ ABSL_GUARDED_BY(mu_);
  std::map<char, size_t> next_ ABSL_GUARDED_BY(mu_);
};

ForeignHandles* foreign = new ForeignHandles();

// ================================================================== clients

enum class Mode {
  kSoak,      // Everything: valid, invalid, faults.
  kShutdown,  // Valid work only, while the server is told to stop.
};

class Client {
 public:
  Client(int id, std::string address, std::shared_ptr<Conn> shared,
         Stats* stats, uint64_t seed, Mode mode)
      : id_(id),
        address_(std::move(address)),
        conn_(std::move(shared)),
        stats_(stats),
        rng_(seed),
        mode_(mode) {
    if (conn_ == nullptr) conn_ = Connect(address_, true);
  }

  // Loops over scenarios until `end` or `stop`, then ends its session.
  void Run(absl::Time end, const std::atomic<bool>* stop) {
    while (absl::Now() < end && !stop->load()) {
      if (mode_ == Mode::kShutdown) {
        if (!RunShutdownScenario()) break;  // The server is going away.
        continue;
      }
      RunSoakScenario();
    }
    EndClient();
  }

  // Shutdown mode: a transfer of 64 MiB that takes about 20 s (a slow
  // writer or a slow reader), so it is still running when the server's
  // shutdown grace ends.
  void SlowTransfer(bool upload) {
    if (!EnsureSession()) return;
    const uint64_t size = 64 << 20;
    const uint64_t b = Malloc(&main_, size);
    if (b == 0) return;
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    if (upload) {
      v1::UploadResponse response;
      auto writer = conn_->rt->Upload(&context, &response);
      v1::UploadRequest message;
      message.set_session(main_.token);
      message.set_buffer(b);
      message.set_size(size);
      const std::string chunk(1 << 20, 's');
      for (uint64_t sent = 0; sent < size; sent += chunk.size()) {
        message.set_data(chunk);
        if (!writer->Write(message)) break;
        message.Clear();
        absl::SleepFor(absl::Milliseconds(300));
      }
      writer->WritesDone();
      Record("Upload (slow writer)", V(), writer->Finish(), context);
    } else {
      v1::DownloadRequest request;
      request.set_session(main_.token);
      request.set_buffer(b);
      request.set_size(size);
      auto reader = conn_->rt->Download(&context, request);
      v1::DownloadResponse chunk;
      while (reader->Read(&chunk)) absl::SleepFor(absl::Milliseconds(1250));
      Record("Download (slow reader)", V(), reader->Finish(), context);
    }
  }

 private:
  // ------------------------------------------------------------ helpers

  uint64_t Rand(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool Chance(double p) {
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  template <typename T>
  const T& PickOf(const std::vector<T>& v) {
    return v[Rand(v.size())];
  }

  // In shutdown mode every valid call may also meet the server stopping.
  Expect V() {
    if (mode_ == Mode::kShutdown) {
      return Invalid("server_shutdown", Bit(StatusCode::OK) |
                                            Bit(StatusCode::UNAVAILABLE) |
                                            Bit(StatusCode::CANCELLED));
    }
    return Valid();
  }

  Outcome Record(const char* rpc, const Expect& e, const grpc::Status& status,
                 const grpc::ClientContext& context) {
    Outcome o = FromStatus(status, context);
    stats_->Record(rpc, e, o);
    return o;
  }

  template <typename Req, typename Resp, typename Fn>
  Outcome Unary(const char* rpc, Fn fn, const Req& request, Resp* response,
                const Expect& e, absl::Duration deadline = kCallDeadline) {
    grpc::ClientContext context;
    SetDeadline(&context, deadline);
    grpc::Status status = fn(&context, request, response);
    return Record(rpc, e, status, context);
  }

#define SOAK_RT(method)                                    \
  [this](grpc::ClientContext* c, const auto& r, auto* p) { \
    return conn_->rt->method(c, r, p);                     \
  }
#define SOAK_OPS(method)                                   \
  [this](grpc::ClientContext* c, const auto& r, auto* p) { \
    return conn_->ops->method(c, r, p);                    \
  }

  std::string RandomToken() {
    return absl::StrFormat("%016x%016x", rng_(), rng_());
  }

  // ------------------------------------------------------------ sessions

  bool OpenSession(SessionState* s, bool attach) {
    v1::CreateSessionRequest request;
    request.set_client_name(absl::StrCat("soak client ", id_));
    v1::CreateSessionResponse response;
    if (!Unary("CreateSession", SOAK_RT(CreateSession), request, &response, V())
             .ok()) {
      return false;
    }
    *s = SessionState();
    s->token = response.session();
    if (attach) {
      s->attach_context = std::make_unique<grpc::ClientContext>();
      // Longer than the run: the server closes the session when it ends.
      SetDeadline(s->attach_context.get(), absl::Hours(2));
      v1::AttachRequest attach_request;
      attach_request.set_session(s->token);
      s->attach_reader =
          conn_->rt->Attach(s->attach_context.get(), attach_request);
      v1::AttachEvent event;
      if (!s->attach_reader->Read(&event) || event.event() != "attached") {
        EndAttach(s, V());
        if (mode_ == Mode::kSoak) {
          stats_->Problem("attach", "no 'attached' event");
        }
        return false;
      }
      s->attached = true;
    }
    return true;
  }

  // Cancels the session's Attach call and records how it ended.
  void EndAttach(SessionState* s, const Expect& e) {
    if (s->attach_reader == nullptr) return;
    s->attach_context->TryCancel();
    v1::AttachEvent event;
    while (s->attach_reader->Read(&event)) {
    }
    grpc::Status status = s->attach_reader->Finish();
    Record("Attach", e, status, *s->attach_context);
    s->attach_reader.reset();
    s->attach_context.reset();
    s->attached = false;
  }

  Expect AttachEnd() {
    // Ended by our cancel (CANCELLED) or by the server after CloseSession
    // or at shutdown (OK).
    Expect e = Invalid("attach_cancel",
                       Bit(StatusCode::OK) | Bit(StatusCode::CANCELLED));
    if (mode_ == Mode::kShutdown) e.codes |= Bit(StatusCode::UNAVAILABLE);
    return e;
  }

  void CloseSession(SessionState* s) {
    if (!s->open()) return;
    v1::CloseSessionRequest request;
    request.set_session(s->token);
    v1::CloseSessionResponse response;
    Unary("CloseSession", SOAK_RT(CloseSession), request, &response, V());
    EndAttach(s, AttachEnd());
    *s = SessionState();
  }

  // The server closes the session when its Attach call ends.
  void DropAttach(SessionState* s) {
    EndAttach(s, AttachEnd());
    *s = SessionState();
  }

  bool EnsureSession() {
    if (main_.open()) return true;
    return OpenSession(&main_, Chance(0.6));
  }

  // ------------------------------------------------------------ memory

  uint64_t Malloc(SessionState* s, uint64_t size, const Expect& e) {
    v1::MallocRequest request;
    request.set_session(s->token);
    request.set_size(size);
    v1::MallocResponse response;
    if (!Unary("Malloc", SOAK_RT(Malloc), request, &response, e).ok()) return 0;
    s->buffers[response.buffer()] = size;
    foreign->Publish('b', response.buffer());
    return response.buffer();
  }
  uint64_t Malloc(SessionState* s, uint64_t size) {
    return Malloc(s, size, V());
  }

  Outcome Free(SessionState* s, uint64_t buffer, const Expect& e) {
    v1::FreeRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    v1::FreeResponse response;
    Outcome o = Unary("Free", SOAK_RT(Free), request, &response, e);
    if (o.ok()) s->buffers.erase(buffer);
    return o;
  }
  bool Free(SessionState* s, uint64_t buffer) {
    return Free(s, buffer, V()).ok();
  }

  // ------------------------------------------------------------ streams

  uint64_t CreateStream(SessionState* s, const Expect& e) {
    v1::CreateStreamRequest request;
    request.set_session(s->token);
    v1::CreateStreamResponse response;
    if (!Unary("CreateStream", SOAK_RT(CreateStream), request, &response, e)
             .ok()) {
      return 0;
    }
    s->streams.insert(response.stream());
    foreign->Publish('s', response.stream());
    return response.stream();
  }

  Outcome DestroyStream(SessionState* s, uint64_t stream, const Expect& e) {
    v1::DestroyStreamRequest request;
    request.set_session(s->token);
    request.set_stream(stream);
    v1::DestroyStreamResponse response;
    Outcome o = Unary("DestroyStream", SOAK_RT(DestroyStream), request,
                      &response, e, kTransferDeadline);
    if (o.ok()) s->streams.erase(stream);
    return o;
  }

  Outcome Sync(SessionState* s, uint64_t stream, const Expect& e) {
    v1::SynchronizeStreamRequest request;
    request.set_session(s->token);
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    return Unary("SynchronizeStream", SOAK_RT(SynchronizeStream), request,
                 &response, e, kTransferDeadline);
  }
  bool Sync(SessionState* s, uint64_t stream) {
    return Sync(s, stream, V()).ok();
  }

  // A stream of the main session to run on: 0 or one of up to 3 others.
  uint64_t PickStream() {
    if (Chance(0.5)) return 0;
    if (main_.streams.size() < 3) {
      uint64_t stream = CreateStream(&main_, V());
      if (stream != 0) return stream;
      return 0;
    }
    auto it = main_.streams.begin();
    std::advance(it, Rand(main_.streams.size()));
    return *it;
  }

  // ------------------------------------------------------------ transfers

  // Streams `data` into buffer[offset, +size) in chunks of `chunk` bytes;
  // the first message carries data or only the header.
  Outcome Upload(SessionState* s, uint64_t buffer, uint64_t offset,
                 const std::string& data, uint64_t stream, uint64_t chunk,
                 const Expect& e, bool header_alone = false,
                 uint64_t announced = UINT64_MAX) {
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    v1::UploadResponse response;
    auto writer = conn_->rt->Upload(&context, &response);
    v1::UploadRequest message;
    message.set_session(s->token);
    message.set_buffer(buffer);
    message.set_offset(offset);
    message.set_size(announced == UINT64_MAX ? data.size() : announced);
    message.set_stream(stream);
    bool ok = true;
    if (header_alone) ok = writer->Write(message);
    message.Clear();
    if (!header_alone) {
      message.set_session(s->token);
      message.set_buffer(buffer);
      message.set_offset(offset);
      message.set_size(announced == UINT64_MAX ? data.size() : announced);
      message.set_stream(stream);
    }
    size_t at = 0;
    bool first = !header_alone;
    while (ok && (at < data.size() || first)) {
      const size_t n = std::min<size_t>(chunk, data.size() - at);
      message.set_data(data.data() + at, n);
      ok = writer->Write(message);
      message.Clear();
      at += n;
      first = false;
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    Outcome o = Record("Upload", e, status, context);
    if (o.ok() && response.bytes_written() != data.size() &&
        mode_ == Mode::kSoak) {
      stats_->Problem(
          "upload_bytes_written",
          absl::StrCat(response.bytes_written(), " of ", data.size()));
    }
    return o;
  }

  Outcome Download(SessionState* s, uint64_t buffer, uint64_t offset,
                   uint64_t size, uint64_t stream, std::string* out,
                   const Expect& e) {
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    v1::DownloadRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_size(size);
    request.set_stream(stream);
    auto reader = conn_->rt->Download(&context, request);
    out->clear();
    v1::DownloadResponse chunk;
    while (reader->Read(&chunk)) out->append(chunk.data());
    grpc::Status status = reader->Finish();
    Outcome o = Record("Download", e, status, context);
    if (o.ok() && out->size() != size && mode_ == Mode::kSoak) {
      stats_->Problem("download_size",
                      absl::StrCat("got ", out->size(), " of ", size));
    }
    return o;
  }

  Outcome WriteValues(SessionState* s, uint64_t buffer, uint64_t offset,
                      DataType dt, const std::vector<double>& values,
                      uint64_t stream, const Expect& e) {
    v1::WriteValuesRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_dtype(dt);
    request.mutable_values()->Add(values.begin(), values.end());
    request.set_stream(stream);
    v1::WriteValuesResponse response;
    return Unary("WriteValues", SOAK_RT(WriteValues), request, &response, e);
  }

  Outcome ReadValues(SessionState* s, uint64_t buffer, uint64_t offset,
                     DataType dt, uint64_t count, uint64_t stream,
                     std::vector<double>* values, const Expect& e) {
    v1::ReadValuesRequest request;
    request.set_session(s->token);
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_dtype(dt);
    request.set_count(count);
    request.set_stream(stream);
    v1::ReadValuesResponse response;
    Outcome o = Unary("ReadValues", SOAK_RT(ReadValues), request, &response, e);
    if (values != nullptr) {
      values->assign(response.values().begin(), response.values().end());
    }
    return o;
  }

  // ------------------------------------------------------------ executors

  uint64_t GetWorkspaceSize(SessionState* s,
                            v1::GetWorkspaceSizeRequest request,
                            uint64_t* workspace, const Expect& e) {
    request.set_session(s->token);
    v1::GetWorkspaceSizeResponse response;
    Outcome o = Unary("GetWorkspaceSize", SOAK_OPS(GetWorkspaceSize), request,
                      &response, e);
    if (!o.ok()) return 0;
    if (response.aclnn_status() != 0 && mode_ == Mode::kSoak) {
      stats_->Problem("gws_status", "OK call with a non-zero aclnn_status");
    }
    if (workspace != nullptr) *workspace = response.workspace_size();
    s->executors.insert(response.executor());
    foreign->Publish('e', response.executor());
    return response.executor();
  }

  v1::ExecuteRequest LaunchRequest(SessionState* s, uint64_t executor,
                                   uint64_t stream, uint64_t ws_buffer = 0,
                                   uint64_t ws_offset = 0,
                                   uint64_t ws_size = 0) {
    v1::ExecuteRequest request;
    request.set_session(s->token);
    request.set_executor(executor);
    request.set_stream(stream);
    request.set_workspace_buffer(ws_buffer);
    request.set_workspace_offset(ws_offset);
    request.set_workspace_size(ws_size);
    return request;
  }

  void NoteLaunched(SessionState* s, uint64_t executor) {
    if (!s->repeatable.count(executor)) s->executors.erase(executor);
  }

  Outcome Execute(SessionState* s, const v1::ExecuteRequest& request,
                  const Expect& e) {
    v1::ExecuteResponse response;
    Outcome o = Unary("Execute", SOAK_OPS(Execute), request, &response, e);
    if (o.ok()) NoteLaunched(s, request.executor());
    return o;
  }

  // Sends every launch on one ExecuteStream call (reading replies as they
  // come) and checks each reply against its expectation.
  bool ExecuteStream(SessionState* s,
                     const std::vector<v1::ExecuteRequest>& launches,
                     const std::vector<Expect>& expects, const Expect& call) {
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    auto stream = conn_->ops->ExecuteStream(&context);
    size_t replies = 0;
    bool all_ok = true;
    auto take = [&](const v1::ExecuteResponse& r) {
      if (replies >= launches.size()) {
        stats_->Problem("execute_stream_reply", "more replies than launches");
        return;
      }
      Outcome o;
      o.code = static_cast<StatusCode>(r.code());
      o.aclnn = r.aclnn_status();
      o.message = r.message();
      if (r.executor() != launches[replies].executor() &&
          mode_ == Mode::kSoak) {
        stats_->Problem("execute_stream_order",
                        absl::StrCat("reply for executor ", r.executor(),
                                     ", launch ", replies, " was executor ",
                                     launches[replies].executor()));
      }
      stats_->Record("ExecuteStream launch", expects[replies], o);
      if (o.ok()) {
        NoteLaunched(s, launches[replies].executor());
      } else {
        all_ok = false;
      }
      ++replies;
    };
    v1::ExecuteResponse response;
    for (const v1::ExecuteRequest& launch : launches) {
      if (!stream->Write(launch)) break;
    }
    stream->WritesDone();
    while (stream->Read(&response)) take(response);
    grpc::Status status = stream->Finish();
    Outcome o = Record("ExecuteStream", call, status, context);
    if (o.ok() && replies != launches.size() && mode_ == Mode::kSoak) {
      stats_->Problem(
          "execute_stream_replies",
          absl::StrCat(replies, " replies to ", launches.size(), " launches"));
    }
    return o.ok() && all_ok && replies == launches.size();
  }

  Outcome SetRepeatable(SessionState* s, uint64_t executor, const Expect& e) {
    v1::SetExecutorRepeatableRequest request;
    request.set_session(s->token);
    request.set_executor(executor);
    v1::SetExecutorRepeatableResponse response;
    Outcome o = Unary("SetExecutorRepeatable", SOAK_OPS(SetExecutorRepeatable),
                      request, &response, e);
    if (o.ok()) s->repeatable.insert(executor);
    return o;
  }

  Outcome DestroyExecutor(SessionState* s, uint64_t executor, const Expect& e) {
    v1::DestroyExecutorRequest request;
    request.set_session(s->token);
    request.set_executor(executor);
    v1::DestroyExecutorResponse response;
    Outcome o = Unary("DestroyExecutor", SOAK_OPS(DestroyExecutor), request,
                      &response, e);
    if (o.ok()) {
      s->executors.erase(executor);
      s->repeatable.erase(executor);
    }
    return o;
  }

  // A tiny valid ThresholdBackward executor over `buffer` (>= 16 bytes).
  v1::GetWorkspaceSizeRequest TinyThreshold(uint64_t buffer) {
    v1::GetWorkspaceSizeRequest request;
    request.set_op("ThresholdBackward");
    request.mutable_params()->set_threshold(0.5);
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {4});
    }
    return request;
  }

  // A handle number of another session that this session does not own.
  uint64_t ForeignHandle(char kind) {
    for (int i = 0; i < 8; ++i) {
      uint64_t h = foreign->Pick(kind, rng_);
      if (h != 0 && !main_.Owns(h)) return h;
    }
    return 0;
  }

  // A small buffer of the main session, made if needed.
  uint64_t AnyBuffer(uint64_t min_size = 64) {
    for (const auto& [handle, size] : main_.buffers) {
      if (size >= min_size) return handle;
    }
    return Malloc(&main_, std::max<uint64_t>(min_size, 256));
  }

  // ------------------------------------------------------------ scenarios

  void RunSoakScenario() {
    if (!EnsureSession()) return;
    static const std::vector<std::pair<int, void (Client::*)()>> kScenarios = {
        {30, &Client::ComputeScenario}, {10, &Client::TransferScenario},
        {8, &Client::InfoScenario},     {5, &Client::StreamScenario},
        {4, &Client::SessionScenario},  {32, &Client::InvalidScenario},
        {8, &Client::FaultScenario},    {3, &Client::EvaluateScenario}};
    int total = 0;
    for (const auto& [w, f] : kScenarios) total += w;
    int r = static_cast<int>(Rand(total));
    for (const auto& [w, f] : kScenarios) {
      if (r < w) {
        (this->*f)();
        break;
      }
      r -= w;
    }
    // Keep what the session holds bounded: free the oldest buffers.
    while (main_.open() && main_.buffers.size() > 24) {
      if (!Free(&main_, main_.buffers.begin()->first)) break;
    }
  }

  // Returns false once calls fail (the server is stopping).
  bool RunShutdownScenario() {
    if (!EnsureSession()) return false;
    switch (Rand(3)) {
      case 0:
        return Compute();
      case 1:
        return Transfer();
      default:
        return Pipeline();
    }
  }

  // How a client leaves at the end: closing its session, dropping its
  // Attach call (the server closes the session), or vanishing and leaving
  // it to the idle reaper.
  void EndClient() {
    if (!main_.open()) return;
    const uint64_t how = Rand(4);
    if (how < 2 || mode_ == Mode::kShutdown) {
      CloseSession(&main_);
    } else if (main_.attached) {
      DropAttach(&main_);
    } else {
      main_ = SessionState();  // Abandoned: reaped after --idle_timeout_s.
    }
  }

  void ComputeScenario() { Compute(); }
  void TransferScenario() { Transfer(); }

  // One operator end to end on device memory, checked against the host
  // reference.
  bool Compute() {
    SessionState* s = &main_;
    const int op = static_cast<int>(Rand(kNumOps));
    const DataType dt = PickOf(OpDTypes(op));
    const int dsize = DSize(dt);
    static const std::vector<int64_t> kSizes = {1,    3,     64,    1000,
                                                4096, 65536, 262144};
    const int64_t n = kSizes[Rand(Chance(0.9) ? 5 : kSizes.size())];
    enum Layout { kContig, kStrided, kBroadcast, kPacked, kInPlace };
    std::vector<Layout> layouts = {kContig, kStrided, kPacked};
    if (op == kSoftshrink || op == kLeaky) layouts.push_back(kBroadcast);
    if (op != kDropout) layouts.push_back(kInPlace);
    const Layout layout = Chance(0.4) ? kContig : PickOf(layouts);
    const bool strided_mask = op == kDropout && Chance(0.4);

    // Parameters.
    v1::OpParams params;
    params.set_threshold(IsIntegral(dt)
                             ? static_cast<double>(Rand(41)) - 20
                             : (static_cast<double>(Rand(33)) - 16) * 0.25);
    params.set_lambd(static_cast<double>(Rand(17)) * 0.25);
    static const std::vector<double> kSlopes = {0, 0.125, 0.25, 0.5, 1.5};
    params.mutable_negative_slope()->set_dtype(v1::FLOAT);
    params.mutable_negative_slope()->set_value(PickOf(kSlopes));
    static const std::vector<double> kScales = {0, 1, 1.25, 2, 4};
    params.set_scale(PickOf(kScales));

    // Inputs: exactly representable, never on a formula's boundary.
    auto value = [&]() -> double {
      switch (dt) {
        case v1::INT32:
          return static_cast<double>(Rand(2001)) - 1000;
        case v1::INT8:
          return static_cast<double>(Rand(201)) - 100;
        case v1::UINT8:
          return static_cast<double>(Rand(201));
        default:
          return (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
      }
    };
    int64_t rows = 1, cols = n;
    if (layout == kBroadcast) {
      for (int64_t r : {8, 4, 2, 1}) {
        if (n % r == 0) {
          rows = r;
          break;
        }
      }
      cols = n / rows;
    }
    const int64_t grad_store = layout == kStrided ? 2 * n + 1 : n;
    std::vector<double> grad(grad_store), second;
    for (double& v : grad) v = value();
    int64_t mask_bytes = 0;
    if (op == kDropout) {
      mask_bytes = n / 128 * 16 + (n % 128 != 0 ? 16 : 0);
      second.resize(strided_mask ? 2 * mask_bytes : mask_bytes);
      for (double& v : second) v = static_cast<double>(Rand(256));
    } else {
      second.resize(layout == kBroadcast ? cols : n);
      for (double& v : second) v = value();
    }
    std::vector<double> want(n), grad_at(n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = layout == kStrided ? grad[1 + 2 * i] : grad[i];
      double x = 0;
      bool bit = false;
      if (op == kDropout) {
        const int64_t byte = i / 8;
        const int mask =
            static_cast<int>(second[strided_mask ? 2 * byte : byte]);
        bit = (mask >> (i % 8)) & 1;
      } else {
        x = layout == kBroadcast ? second[i % cols] : second[i];
      }
      want[i] = Reference(op, dt, params, g, x, bit);
      grad_at[i] = g;
    }
    const DataType second_dt = op == kDropout ? v1::UINT8 : dt;
    const std::string grad_bytes = Encode(dt, grad);
    const std::string second_bytes = Encode(second_dt, second);
    const uint64_t out_bytes = static_cast<uint64_t>(n) * dsize;

    // Device memory.
    uint64_t grad_buf = 0, second_buf = 0, out_buf = 0;
    uint64_t grad_off = 0, second_off = 0, out_off = 0;
    auto align = [](uint64_t x) { return (x + 63) / 64 * 64; };
    std::vector<uint64_t> mine;
    if (layout == kPacked) {
      second_off = align(grad_bytes.size()) + 64 * Rand(3);
      out_off = align(second_off + second_bytes.size());
      grad_buf = second_buf = out_buf = Malloc(s, out_off + out_bytes);
      if (grad_buf == 0) return false;
      mine = {grad_buf};
    } else {
      grad_buf = Malloc(s, grad_bytes.size());
      if (grad_buf == 0) return false;
      second_buf = Malloc(s, second_bytes.size());
      if (second_buf == 0) return false;
      mine = {grad_buf, second_buf};
      if (layout == kInPlace) {
        out_buf = grad_buf;
      } else {
        out_buf = Malloc(s, out_bytes);
        if (out_buf == 0) return false;
        mine.push_back(out_buf);
      }
    }
    const uint64_t stream = PickStream();
    // Inputs go up by Upload (any chunking) or WriteValues.
    auto put = [&](uint64_t buffer, uint64_t offset, DataType type,
                   const std::vector<double>& values,
                   const std::string& bytes) {
      if (Chance(0.5) && values.size() <= kMaxValues) {
        return WriteValues(s, buffer, offset, type, values, stream, V()).ok();
      }
      static const std::vector<uint64_t> kChunks = {100, 4096, 65536, 1 << 20};
      return Upload(s, buffer, offset, bytes, stream, PickOf(kChunks), V(),
                    Chance(0.3))
          .ok();
    };
    if (!put(grad_buf, grad_off, dt, grad, grad_bytes)) return false;
    if (!put(second_buf, second_off, second_dt, second, second_bytes)) {
      return false;
    }

    // Phase one.
    v1::GetWorkspaceSizeRequest request;
    request.set_op(Chance(0.2) ? absl::StrCat("aclnn", kOpNames[op])
                               : kOpNames[op]);
    *request.mutable_params() = params;
    if (op != kLeaky) request.mutable_params()->clear_negative_slope();
    auto& tensors = *request.mutable_tensors();
    std::vector<int64_t> shape = layout == kBroadcast
                                     ? std::vector<int64_t>{rows, cols}
                                     : std::vector<int64_t>{n};
    tensors["gradOutput"] = layout == kStrided
                                ? Desc(grad_buf, dt, {n}, {2}, 1, grad_off)
                                : Desc(grad_buf, dt, shape, {}, 0, grad_off);
    if (op == kDropout) {
      tensors["mask"] =
          strided_mask
              ? Desc(second_buf, v1::UINT8, {mask_bytes}, {2}, 0, second_off)
              : Desc(second_buf, v1::UINT8, {mask_bytes}, {}, 0, second_off);
    } else if (layout == kBroadcast) {
      tensors["self"] = Desc(second_buf, dt, {1, cols}, {}, 0, second_off);
    } else {
      tensors["self"] = Desc(second_buf, dt, shape, {}, 0, second_off);
    }
    tensors[OutName(op)] = Desc(out_buf, dt, shape, {}, 0, out_off);
    uint64_t workspace = 0;
    const uint64_t executor = GetWorkspaceSize(s, request, &workspace, V());
    if (executor == 0) return false;
    if (strided_mask && workspace != static_cast<uint64_t>(mask_bytes) &&
        mode_ == Mode::kSoak) {
      stats_->Problem("workspace_size",
                      absl::StrCat("strided mask of ", mask_bytes,
                                   " bytes, workspace ", workspace));
    }
    // Freed handles stay alive in the executor: results must not change.
    if (layout != kPacked && layout != kInPlace && Chance(0.15)) {
      if (!Free(s, grad_buf) || !Free(s, second_buf)) return false;
      mine = {out_buf};
    }
    uint64_t ws_buf = 0, ws_off = 0;
    if (workspace > 0) {
      ws_off = 64 * Rand(4);
      ws_buf = Malloc(s, ws_off + workspace + Rand(100));
      if (ws_buf == 0) return false;
      mine.push_back(ws_buf);
    }

    // Phase two: once, or a repeatable executor several times (not in
    // place: a second launch would compute on the first one's output).
    const bool repeat = layout != kInPlace && Chance(0.25);
    if (repeat && !SetRepeatable(s, executor, V()).ok()) return false;
    const int launches = repeat ? 1 + static_cast<int>(Rand(3)) : 1;
    std::vector<v1::ExecuteRequest> requests;
    for (int i = 0; i < launches; ++i) {
      requests.push_back(
          LaunchRequest(s, executor, stream, ws_buf, ws_off, workspace));
    }
    if (Chance(0.3)) {
      std::vector<Expect> expects(requests.size(), V());
      if (!ExecuteStream(s, requests, expects, V())) return false;
    } else {
      for (const auto& r : requests) {
        if (!Execute(s, r, V()).ok()) return false;
      }
    }
    if (repeat && !DestroyExecutor(s, executor, V()).ok()) return false;

    // Read back on the same stream: ordered after the launch with or
    // without a synchronize first.
    if (Chance(0.5) && !Sync(s, stream)) return false;
    std::vector<double> got;
    if (Chance(0.5) && static_cast<uint64_t>(n) <= kMaxValues) {
      if (!ReadValues(s, out_buf, out_off, dt, n, stream, &got, V()).ok()) {
        return false;
      }
    } else {
      std::string bytes;
      if (!Download(s, out_buf, out_off, out_bytes, stream, &bytes, V()).ok() ||
          bytes.size() != out_bytes) {
        return false;
      }
      got.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        got[i] = DecodeValue(dt, bytes.data() + i * dsize);
      }
    }
    if (got.size() != static_cast<size_t>(n)) {
      stats_->Problem("result_size", absl::StrCat(got.size(), " of ", n));
      return false;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (!CloseEnough(dt, got[i], want[i], grad_at[i])) {
        stats_->Problem(
            "wrong_result",
            absl::StrCat(kOpNames[op], " ", v1::DataType_Name(dt), " n=", n,
                         " layout=", layout,
                         strided_mask ? " strided mask" : "", ": element ", i,
                         " is ", got[i], ", want ", want[i]));
        return false;
      }
    }
    if (!Sync(s, stream)) return false;
    // Free what this used (sometimes keep it: the session close frees it).
    if (Chance(0.85)) {
      for (uint64_t b : mine) {
        if (!Free(s, b)) return false;
      }
    }
    return true;
  }

  // Bytes up and down, any sizes, chunking and offsets; compared.
  bool Transfer() {
    SessionState* s = &main_;
    static const std::vector<uint64_t> kSizes = {
        0,       1, 4095, 4096, 65537, (1 << 20) + 3, 4 << 20, (9 << 20) + 7,
        16 << 20};
    const uint64_t size = kSizes[Rand(Chance(0.8) ? 6 : kSizes.size())];
    std::string data(size, '\0');
    for (uint64_t i = 0; i < size; i += 8) {
      const uint64_t r = rng_();
      std::memcpy(data.data() + i, &r, std::min<uint64_t>(8, size - i));
    }
    const uint64_t buffer = Malloc(s, size);
    if (buffer == 0) return false;
    const uint64_t stream = PickStream();
    static const std::vector<uint64_t> kChunks = {1000, 65536, 1 << 20,
                                                  4 << 20};
    if (Chance(0.3) && size > 1) {
      // Two uploads of adjacent ranges.
      const uint64_t split = 1 + Rand(size - 1);
      if (!Upload(s, buffer, 0, data.substr(0, split), stream, PickOf(kChunks),
                  V())
               .ok() ||
          !Upload(s, buffer, split, data.substr(split), stream, PickOf(kChunks),
                  V(), Chance(0.5))
               .ok()) {
        return false;
      }
    } else if (!Upload(s, buffer, 0, data, stream, PickOf(kChunks), V(),
                       Chance(0.3))
                    .ok()) {
      return false;
    }
    uint64_t from = 0, len = size;
    if (Chance(0.4) && size > 0) {
      from = Rand(size);
      len = Rand(size - from + 1);
    }
    std::string back;
    if (!Download(s, buffer, from, len, stream, &back, V()).ok()) return false;
    if (back != data.substr(from, len)) {
      stats_->Problem("transfer_mismatch",
                      absl::StrCat("download of [", from, ", +", len,
                                   ") differs from what was uploaded"));
      return false;
    }
    return Free(s, buffer);
  }

  // ExecuteStream with many launches of one repeatable executor.
  bool Pipeline() {
    SessionState* s = &main_;
    const int64_t n = 1 << 16;
    const uint64_t buffer = Malloc(s, n * 4);
    if (buffer == 0) return false;
    v1::GetWorkspaceSizeRequest request;
    request.set_op("HardswishBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
    if (executor == 0) return false;
    if (!SetRepeatable(s, executor, V()).ok()) return false;
    const uint64_t stream = PickStream();
    std::vector<v1::ExecuteRequest> launches(
        16 + Rand(48), LaunchRequest(s, executor, stream));
    std::vector<Expect> expects(launches.size(), V());
    if (!ExecuteStream(s, launches, expects, V())) return false;
    if (!Sync(s, stream)) return false;
    if (!DestroyExecutor(s, executor, V()).ok()) return false;
    return Free(s, buffer);
  }

  // Discovery, stats, health.
  void InfoScenario() {
    switch (Rand(7)) {
      case 0: {
        v1::GetDeviceInfoResponse info;
        if (Unary("GetDeviceInfo", SOAK_RT(GetDeviceInfo),
                  v1::GetDeviceInfoRequest(), &info, V())
                .ok() &&
            (info.api_version() != "opserver.v1" || info.kind() != "cpu")) {
          stats_->Problem("device_info", info.ShortDebugString());
        }
        break;
      }
      case 1: {
        v1::ListOperatorsResponse ops;
        if (Unary("ListOperators", SOAK_OPS(ListOperators),
                  v1::ListOperatorsRequest(), &ops, V())
                .ok() &&
            ops.operators_size() != kNumOps) {
          stats_->Problem("list_operators",
                          absl::StrCat(ops.operators_size(), " operators"));
        }
        break;
      }
      case 2: {
        grpc::health::v1::HealthCheckRequest request;
        static const std::vector<std::string> kServices = {
            "", "opserver.v1.Runtime", "opserver.v1.Operators"};
        request.set_service(PickOf(kServices));
        grpc::health::v1::HealthCheckResponse response;
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        if (Record("Health.Check", V(),
                   conn_->health->Check(&context, request, &response), context)
                .ok() &&
            response.status() !=
                grpc::health::v1::HealthCheckResponse::SERVING) {
          stats_->Problem("health", response.ShortDebugString());
        }
        break;
      }
      case 3: {
        v1::ServerStats stats;
        Unary("GetServerStats", SOAK_RT(GetServerStats),
              v1::GetServerStatsRequest(), &stats, V());
        break;
      }
      case 4: {  // Watch: the current status, then the client leaves.
        grpc::health::v1::HealthCheckRequest request;
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        auto reader = conn_->health->Watch(&context, request);
        grpc::health::v1::HealthCheckResponse response;
        if (!reader->Read(&response) ||
            response.status() !=
                grpc::health::v1::HealthCheckResponse::SERVING) {
          stats_->Problem("health_watch", response.ShortDebugString());
        }
        context.TryCancel();
        while (reader->Read(&response)) {
        }
        Record("Health.Watch", Invalid("watch_end", Bit(StatusCode::CANCELLED)),
               reader->Finish(), context);
        break;
      }
      default:
        CheckSessionStats();
        break;
    }
  }

  // What the server says the session holds must be what the client holds.
  void CheckSessionStats() {
    v1::GetSessionStatsRequest request;
    request.set_session(main_.token);
    v1::SessionStats stats;
    if (!Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats,
               V())
             .ok()) {
      return;
    }
    uint64_t bytes = 0;
    for (const auto& [h, size] : main_.buffers) bytes += size;
    if (stats.buffers() != main_.buffers.size() ||
        stats.buffer_bytes() != bytes ||
        stats.streams() != main_.streams.size() ||
        stats.executors() != main_.executors.size()) {
      stats_->Problem(
          "session_stats",
          absl::StrCat("server: ", stats.ShortDebugString(), "; client holds ",
                       main_.buffers.size(), " buffers of ", bytes, " bytes, ",
                       main_.streams.size(), " streams, ",
                       main_.executors.size(), " executors"));
    }
  }

  // Streams: created, loaded, synchronized, destroyed with work queued.
  void StreamScenario() {
    SessionState* s = &main_;
    switch (Rand(3)) {
      case 0: {  // Destroy a stream with work still queued: dropped.
        const uint64_t stream = CreateStream(s, V());
        if (stream == 0) return;
        const int64_t n = 1 << 18;
        const uint64_t buffer = Malloc(s, n * 4);
        if (buffer == 0) return;
        v1::GetWorkspaceSizeRequest request;
        request.set_op("LeakyReluBackward");
        request.mutable_params()->mutable_negative_slope()->set_value(0.25);
        for (const char* name : {"gradOutput", "self", "out"}) {
          (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {n});
        }
        const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
        if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
        for (int i = 0; i < 8; ++i) {
          if (!Execute(s, LaunchRequest(s, executor, stream), V()).ok()) return;
        }
        if (!DestroyStream(s, stream, V()).ok()) return;
        Sync(s, stream,
             Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
        DestroyStream(s, stream,
                      Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
        Execute(s, LaunchRequest(s, executor, stream),
                Invalid("destroyed_stream", Bit(StatusCode::NOT_FOUND)));
        DestroyExecutor(s, executor, V());
        Free(s, buffer);
        break;
      }
      case 1: {  // Synchronize every stream.
        Sync(s, 0);
        for (uint64_t stream : std::set<uint64_t>(s->streams)) Sync(s, stream);
        break;
      }
      default: {  // Destroy one of the session's streams.
        if (s->streams.empty()) {
          CreateStream(s, V());
          return;
        }
        DestroyStream(s, *s->streams.begin(), V());
        break;
      }
    }
  }

  // Close and reopen the main session, sometimes attached.
  void SessionScenario() {
    switch (Rand(3)) {
      case 0:
        CloseSession(&main_);
        break;
      case 1:
        if (main_.attached) {
          DropAttach(&main_);
        } else {
          CloseSession(&main_);
        }
        break;
      default: {
        // A second session next to the main one, used and closed.
        SessionState other;
        if (!OpenSession(&other, Chance(0.5))) return;
        uint64_t b = Malloc(&other, 1 + Rand(1 << 16));
        if (b != 0) {
          WriteValues(&other, b, 0, v1::UINT8, {1, 2, 3}, 0, V());
        }
        CloseSession(&other);
        break;
      }
    }
  }

  void EvaluateScenario() {
    const int op = static_cast<int>(Rand(kNumOps));
    const DataType dt = v1::FLOAT;
    const int64_t n = 1 + Rand(64);
    v1::EvaluateRequest request;
    request.set_op(kOpNames[op]);
    v1::OpParams* params = request.mutable_params();
    params->set_threshold(0.5);
    params->set_lambd(1.0);
    params->set_scale(2);
    if (op == kLeaky) {
      params->mutable_negative_slope()->set_dtype(v1::FLOAT);
      params->mutable_negative_slope()->set_value(0.125);
    }
    std::vector<double> g(n), x(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
      x[i] = (static_cast<double>(Rand(48)) - 24 + 0.5) * 0.25;
    }
    v1::ValueTensor grad;
    grad.set_dtype(dt);
    grad.add_shape(n);
    grad.mutable_values()->Add(g.begin(), g.end());
    int64_t mask_bytes = n / 128 * 16 + (n % 128 != 0 ? 16 : 0);
    std::vector<double> mask(mask_bytes);
    v1::ValueTensor second;
    if (op == kDropout) {
      for (double& m : mask) m = static_cast<double>(Rand(256));
      second.set_dtype(v1::UINT8);
      second.add_shape(mask_bytes);
      second.mutable_values()->Add(mask.begin(), mask.end());
    } else {
      second.set_dtype(dt);
      second.add_shape(n);
      second.mutable_values()->Add(x.begin(), x.end());
    }
    request.mutable_output()->set_dtype(dt);
    request.mutable_output()->add_shape(n);
    const bool invalid = Chance(0.3);
    Expect e = V();
    if (invalid) {
      e = Invalid("bad_param", Bit(StatusCode::INVALID_ARGUMENT));
      switch (Rand(3)) {
        case 0:
          (*request.mutable_inputs())["bogus"] = grad;
          break;
        case 1:
          grad.add_values(1);  // n + 1 values for a shape of n.
          break;
        default:
          request.set_op("SoftplusBackward");
          break;
      }
    }
    (*request.mutable_inputs())["gradOutput"] = grad;
    (*request.mutable_inputs())[SecondName(op)] = second;
    e.evaluate = true;
    v1::EvaluateResponse response;
    if (!Unary("Evaluate", SOAK_OPS(Evaluate), request, &response, e).ok() ||
        invalid) {
      return;
    }
    if (response.output().values_size() != n) {
      stats_->Problem("evaluate_size",
                      absl::StrCat(response.output().values_size(), " of ", n));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      const bool bit =
          op == kDropout && ((static_cast<int>(mask[i / 8]) >> (i % 8)) & 1);
      const double want = Reference(op, dt, *params, g[i], x[i], bit);
      if (!CloseEnough(dt, response.output().values(i), want, g[i])) {
        stats_->Problem(
            "evaluate_result",
            absl::StrCat(kOpNames[op], " element ", i, " is ",
                         response.output().values(i), ", want ", want));
        return;
      }
    }
  }

  // ------------------------------------------------ invalid, on purpose

  void InvalidScenario() {
    const uint32_t kNotFound = Bit(StatusCode::NOT_FOUND);
    const uint32_t kInvalid = Bit(StatusCode::INVALID_ARGUMENT);
    const uint32_t kExhausted = Bit(StatusCode::RESOURCE_EXHAUSTED);
    const uint32_t kPrecondition = Bit(StatusCode::FAILED_PRECONDITION);
    SessionState* s = &main_;
    switch (Rand(20)) {
      case 0:  // A made-up or empty session, on any RPC.
      case 1: {
        const bool empty = Rand(3) == 0;
        SessionState fake;
        fake.token = empty ? "" : RandomToken();
        const Expect e = empty ? Invalid("empty_session", kInvalid | kNotFound)
                               : Invalid("bad_session", kNotFound);
        AnyRpcOn(&fake, e);
        break;
      }
      case 2: {  // Another session's buffer.
        // Made first: a new handle could otherwise take the foreign number.
        const uint64_t mine = AnyBuffer();
        const uint64_t h = ForeignHandle('b');
        if (h == 0 || mine == 0) return;
        const Expect e = Invalid("foreign_handle", kNotFound);
        std::string bytes;
        switch (Rand(5)) {
          case 0:
            Free(s, h, e);
            break;
          case 1:
            Download(s, h, 0, 1, 0, &bytes, e);
            break;
          case 2:
            ReadValues(s, h, 0, v1::UINT8, 1, 0, nullptr, e);
            break;
          case 3:
            Upload(s, h, 0, "x", 0, 1, e);
            break;
          default: {
            v1::GetWorkspaceSizeRequest request = TinyThreshold(mine);
            (*request.mutable_tensors())["self"].set_buffer(h);
            GetWorkspaceSize(s, request, nullptr, e);
            break;
          }
        }
        break;
      }
      case 3: {  // Another session's executor.
        const uint64_t h = ForeignHandle('e');
        if (h == 0) return;
        switch (Rand(3)) {
          case 0:
            Execute(s, LaunchRequest(s, h, 0),
                    Invalid("foreign_handle", kNotFound | kPrecondition));
            break;
          case 1:
            SetRepeatable(s, h, Invalid("foreign_handle", kNotFound));
            break;
          default:
            DestroyExecutor(s, h, Invalid("foreign_handle", kNotFound));
            break;
        }
        break;
      }
      case 4: {  // Another session's stream.
        const Expect e = Invalid("foreign_handle", kNotFound);
        switch (Rand(3)) {
          case 0:
          case 1: {
            const uint64_t h = ForeignHandle('s');
            if (h == 0) return;
            if (Chance(0.5)) {
              Sync(s, h, e);
            } else {
              DestroyStream(s, h, e);
            }
            break;
          }
          default: {
            // A valid executor on a stream that is not ours: refused before
            // the executor is consumed, so it still launches afterwards.
            uint64_t mine = AnyBuffer();
            if (mine == 0) return;
            uint64_t executor =
                GetWorkspaceSize(s, TinyThreshold(mine), nullptr, V());
            const uint64_t h = ForeignHandle('s');
            if (executor == 0 || h == 0) return;
            Execute(s, LaunchRequest(s, executor, h), e);
            Execute(s, LaunchRequest(s, executor, 0), V());
            break;
          }
        }
        break;
      }
      case 5: {  // Handles nobody made.
        const uint64_t h = (1ull << 60) + Rand(1000);
        const Expect e = Invalid("unknown_handle", kNotFound);
        switch (Rand(4)) {
          case 0:
            Free(s, h, e);
            break;
          case 1:
            Sync(s, h, e);
            break;
          case 2:
            Execute(s, LaunchRequest(s, h, 0), e);
            break;
          default:
            DestroyExecutor(s, h, e);
            break;
        }
        break;
      }
      case 6: {  // A freed buffer.
        const uint64_t b = Malloc(s, 64);
        if (b == 0 || !Free(s, b)) return;
        const Expect e = Invalid("freed_buffer", kNotFound);
        if (Chance(0.5)) {
          Free(s, b, e);
        } else {
          WriteValues(s, b, 0, v1::FLOAT, {1}, 0, e);
        }
        break;
      }
      case 7: {  // A consumed executor.
        uint64_t mine = AnyBuffer();
        if (mine == 0) return;
        uint64_t executor =
            GetWorkspaceSize(s, TinyThreshold(mine), nullptr, V());
        if (executor == 0 ||
            !Execute(s, LaunchRequest(s, executor, 0), V()).ok()) {
          return;
        }
        switch (Rand(3)) {
          case 0:
            Execute(s, LaunchRequest(s, executor, 0),
                    Invalid("consumed_executor", kPrecondition));
            break;
          case 1:
            DestroyExecutor(s, executor,
                            Invalid("consumed_executor", kNotFound));
            break;
          default:
            SetRepeatable(s, executor, Invalid("consumed_executor", kNotFound));
            break;
        }
        break;
      }
      case 8:
      case 9:
        BadShape();
        break;
      case 10:
        BadDType();
        break;
      case 11:
        BadParam();
        break;
      case 12: {  // Past a limit.
        const Expect e = Invalid("oversized", kExhausted);
        switch (Rand(8)) {
          case 0:
            Malloc(s, 1ull << 40, e);
            break;
          case 1:
            Malloc(s, UINT64_MAX, e);
            break;
          case 2:
          case 3:
          case 4: {
            uint64_t b = AnyBuffer();
            if (b != 0) {
              ReadValues(s, b, 0, v1::UINT8, kMaxValues + 1, 0, nullptr, e);
            }
            break;
          }
          case 5: {  // 8 MiB of values: rarely.
            uint64_t b = AnyBuffer();
            if (b != 0) {
              WriteValues(s, b, 0, v1::UINT8,
                          std::vector<double>(kMaxValues + 1, 0), 0, e);
            }
            break;
          }
          default: {
            v1::EvaluateRequest request;
            request.set_op("HardswishBackward");
            for (const char* name : {"gradOutput", "self"}) {
              v1::ValueTensor& t = (*request.mutable_inputs())[name];
              t.set_dtype(v1::FLOAT);
              t.add_shape(kMaxValues + 1);
            }
            request.mutable_output()->set_dtype(v1::FLOAT);
            request.mutable_output()->add_shape(kMaxValues + 1);
            v1::EvaluateResponse response;
            Expect ee = e;
            ee.evaluate = true;
            Unary("Evaluate", SOAK_OPS(Evaluate), request, &response, ee);
            break;
          }
        }
        break;
      }
      case 13: {  // Ranges outside the buffer.
        const uint64_t b = Malloc(s, 4096);
        if (b == 0) return;
        const Expect e = Invalid("bad_range", kInvalid);
        std::string bytes;
        switch (Rand(5)) {
          case 0:
            Download(s, b, 4095, 2, 0, &bytes, e);
            break;
          case 1:
            Download(s, b, UINT64_MAX, 2, 0, &bytes, e);
            break;
          case 2:
            ReadValues(s, b, 4092, v1::DOUBLE, 1, 0, nullptr, e);
            break;
          case 3:
            WriteValues(s, b, 4096, v1::FLOAT, {1}, 0, e);
            break;
          default:
            Upload(s, b, 4000, std::string(97, 'x'), 0, 64, e);
            break;
        }
        Free(s, b);
        break;
      }
      case 14: {  // Uploads that break their own header.
        const uint64_t b = Malloc(s, 4096);
        if (b == 0) return;
        const Expect e = Invalid("bad_upload", kInvalid);
        switch (Rand(3)) {
          case 0:  // More data than announced.
            Upload(s, b, 0, std::string(200, 'x'), 0, 64, e, false, 100);
            break;
          case 1:  // Less.
            Upload(s, b, 0, std::string(50, 'x'), 0, 16, e, Chance(0.5), 100);
            break;
          default: {  // Nothing at all.
            grpc::ClientContext context;
            SetDeadline(&context, kCallDeadline);
            v1::UploadResponse response;
            auto writer = conn_->rt->Upload(&context, &response);
            writer->WritesDone();
            Record("Upload", e, writer->Finish(), context);
            break;
          }
        }
        Free(s, b);
        break;
      }
      case 15: {  // Values that do not fit their dtype.
        const uint64_t b = AnyBuffer();
        if (b == 0) return;
        const Expect e = Invalid("bad_value", kInvalid);
        switch (Rand(5)) {
          case 0:
            WriteValues(s, b, 0, v1::INT32, {1.5}, 0, e);
            break;
          case 1:
            WriteValues(s, b, 0, v1::INT32, {std::nan("")}, 0, e);
            break;
          case 2:
            WriteValues(s, b, 0, v1::INT8, {300}, 0, e);
            break;
          case 3:
            WriteValues(s, b, 0, v1::UINT8, {-1}, 0, e);
            break;
          default:
            WriteValues(s, b, 0, v1::BOOL, {2}, 0, e);
            break;
        }
        break;
      }
      case 16:
        SmallWorkspace();
        break;
      case 17: {  // Stream 0, destroyed and too many streams.
        switch (Rand(3)) {
          case 0:
            DestroyStream(s, 0, Invalid("stream0", kInvalid));
            break;
          case 1: {
            const uint64_t stream = CreateStream(s, V());
            if (stream == 0 || !DestroyStream(s, stream, V()).ok()) return;
            Sync(s, stream, Invalid("destroyed_stream", kNotFound));
            break;
          }
          default:
            StreamLimit();
            break;
        }
        break;
      }
      case 18: {  // Session-level misuse.
        switch (Rand(3)) {
          case 0: {
            v1::CreateSessionRequest request;
            request.set_client_name(std::string(257, 'n'));
            v1::CreateSessionResponse response;
            Unary("CreateSession", SOAK_RT(CreateSession), request, &response,
                  Invalid("long_name", kInvalid));
            break;
          }
          case 1: {
            SessionState other;
            if (!OpenSession(&other, false)) return;
            const std::string token = other.token;
            CloseSession(&other);
            other.token = token;
            const Expect e = Invalid("closed_session", kNotFound);
            if (Chance(0.5)) {
              Malloc(&other, 16, e);
            } else {
              v1::CloseSessionRequest request;
              request.set_session(token);
              v1::CloseSessionResponse response;
              Unary("CloseSession", SOAK_RT(CloseSession), request, &response,
                    e);
            }
            break;
          }
          default: {
            grpc::health::v1::HealthCheckRequest request;
            request.set_service("opserver.v0.Nonexistent");
            grpc::health::v1::HealthCheckResponse response;
            grpc::ClientContext context;
            SetDeadline(&context, kCallDeadline);
            Record("Health.Check", Invalid("unknown_health_service", kNotFound),
                   conn_->health->Check(&context, request, &response), context);
            break;
          }
        }
        break;
      }
      default:
        MixedPipeline();
        break;
    }
  }

  // One RPC, chosen at random, naming `fake` (a made-up or empty session).
  void AnyRpcOn(SessionState* fake, const Expect& e) {
    std::string bytes;
    switch (Rand(16)) {
      case 0:
        Malloc(fake, 16, e);
        break;
      case 1:
        Free(fake, 1, e);
        break;
      case 2:
        CreateStream(fake, e);
        break;
      case 3:
        DestroyStream(fake, 1, e);
        break;
      case 4:
        Sync(fake, 0, e);
        break;
      case 5:
        Upload(fake, 1, 0, "abcd", 0, 4, e);
        break;
      case 6:
        Download(fake, 1, 0, 4, 0, &bytes, e);
        break;
      case 7:
        WriteValues(fake, 1, 0, v1::FLOAT, {1}, 0, e);
        break;
      case 8:
        ReadValues(fake, 1, 0, v1::FLOAT, 1, 0, nullptr, e);
        break;
      case 9:
        GetWorkspaceSize(fake, TinyThreshold(1), nullptr, e);
        break;
      case 10:
        Execute(fake, LaunchRequest(fake, 1, 0), e);
        break;
      case 11:
        SetRepeatable(fake, 1, e);
        break;
      case 12:
        DestroyExecutor(fake, 1, e);
        break;
      case 13: {
        v1::GetSessionStatsRequest request;
        request.set_session(fake->token);
        v1::SessionStats stats;
        Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats, e);
        break;
      }
      case 14: {
        grpc::ClientContext context;
        SetDeadline(&context, kCallDeadline);
        v1::AttachRequest request;
        request.set_session(fake->token);
        auto reader = conn_->rt->Attach(&context, request);
        v1::AttachEvent event;
        bool attached = false;
        while (reader->Read(&event)) attached = true;
        Outcome o = Record("Attach", e, reader->Finish(), context);
        if (attached && mode_ == Mode::kSoak) {
          stats_->Problem("attach_fake", "an unknown session was attached");
        }
        (void)o;
        break;
      }
      default: {
        v1::CloseSessionRequest request;
        request.set_session(fake->token);
        v1::CloseSessionResponse response;
        Unary("CloseSession", SOAK_RT(CloseSession), request, &response, e);
        break;
      }
    }
  }

  void BadShape() {
    const Expect e = Invalid("bad_shape", Bit(StatusCode::INVALID_ARGUMENT));
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    const int64_t elems = static_cast<int64_t>(main_.buffers[b] / 4);
    v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
    auto& t = *request.mutable_tensors();
    switch (Rand(9)) {
      case 0:  // Past the end of the buffer.
        t["self"] = Desc(b, v1::FLOAT, {elems + 1});
        t["gradOutput"] = Desc(b, v1::FLOAT, {elems + 1});
        t["out"] = Desc(b, v1::FLOAT, {elems + 1});
        break;
      case 1:  // 9 dims.
        t["self"] = Desc(b, v1::FLOAT, {1, 1, 1, 1, 1, 1, 1, 1, 1});
        break;
      case 2:  // A negative dim.
        t["gradOutput"] = Desc(b, v1::FLOAT, {-4});
        break;
      case 3:  // Threshold does not broadcast.
        t["self"] = Desc(b, v1::FLOAT, {2});
        break;
      case 4:  // Wrong out shape.
        t["out"] = Desc(b, v1::FLOAT, {2, 2});
        break;
      case 5:  // An output that overlaps itself: 2^40 elements in 4 bytes.
        for (const char* name : {"gradOutput", "self", "out"}) {
          t[name] = Desc(b, v1::FLOAT, {1ll << 40}, {0});
        }
        break;
      case 6:  // Starts past the buffer.
        t["self"] = Desc(b, v1::FLOAT, {4}, {}, 0, main_.buffers[b] + 4096);
        break;
      case 7:  // Strides that overflow.
        t["gradOutput"] = Desc(b, v1::FLOAT, {4}, {1ll << 62});
        break;
      default: {  // A mask of the wrong size.
        request.set_op("DropoutBackward");
        request.mutable_params()->set_scale(2);
        t.erase("self");
        t["mask"] = Desc(b, v1::UINT8, {3});
        break;
      }
    }
    const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
    if (executor != 0) DestroyExecutor(&main_, executor, V());
  }

  void BadDType() {
    const Expect e = Invalid("bad_dtype", Bit(StatusCode::INVALID_ARGUMENT));
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
    auto& t = *request.mutable_tensors();
    switch (Rand(6)) {
      case 0:  // Not an aclDataType.
        t["self"].set_dtype(static_cast<DataType>(5));
        break;
      case 1:
        t["out"].set_dtype(static_cast<DataType>(99));
        break;
      case 2:  // Softshrink takes no INT32.
        request.set_op("SoftshrinkBackward");
        t.erase("out");
        for (const char* name : {"gradOutput", "self", "gradInput"}) {
          t[name] = Desc(b, v1::INT32, {4});
        }
        break;
      case 3:  // A FLOAT mask.
        request.set_op("DropoutBackward");
        request.mutable_params()->set_scale(2);
        t.erase("self");
        t["mask"] = Desc(b, v1::FLOAT, {4});
        break;
      case 4:  // Threshold on DOUBLE.
        for (const char* name : {"gradOutput", "self", "out"}) {
          t[name] = Desc(b, v1::DOUBLE, {2});
        }
        break;
      default: {  // WriteValues/ReadValues of dtype 5.
        if (Chance(0.5)) {
          WriteValues(&main_, b, 0, static_cast<DataType>(5), {1}, 0, e);
        } else {
          ReadValues(&main_, b, 0, static_cast<DataType>(5), 1, 0, nullptr, e);
        }
        return;
      }
    }
    const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
    if (executor != 0) DestroyExecutor(&main_, executor, V());
  }

  void BadParam() {
    const Expect e = Invalid("bad_param", Bit(StatusCode::INVALID_ARGUMENT));
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request = TinyThreshold(b);
    auto& t = *request.mutable_tensors();
    auto leaky = [&] {
      request.set_op("LeakyReluBackward");
      request.mutable_params()->mutable_negative_slope()->set_dtype(v1::FLOAT);
      request.mutable_params()->mutable_negative_slope()->set_value(0.5);
    };
    switch (Rand(9)) {
      case 0:
        request.set_op("SoftplusBackward");
        break;
      case 1:
        t["bogus"] = t["self"];
        break;
      case 2:
        request.set_op("SoftshrinkBackward");
        request.mutable_params()->set_lambd(-1);
        t["gradInput"] = t["out"];
        t.erase("out");
        break;
      case 3:
      case 4:
        request.set_op("DropoutBackward");
        request.mutable_params()->set_scale(Rand(2) ? 0.5 : std::nan(""));
        t["mask"] = Desc(b, v1::UINT8, {16});
        t.erase("self");
        break;
      case 5:  // negativeSlope missing.
        request.set_op("LeakyReluBackward");
        break;
      case 6:  // An integer slope that is not an integer.
        leaky();
        request.mutable_params()->mutable_negative_slope()->set_dtype(
            v1::INT32);
        break;
      case 7:  // A negative slope with selfIsResult.
        leaky();
        request.mutable_params()->mutable_negative_slope()->set_value(-0.5);
        request.mutable_params()->set_self_is_result(true);
        break;
      default:  // A tensor missing.
        t.erase("out");
        break;
    }
    const uint64_t executor = GetWorkspaceSize(&main_, request, nullptr, e);
    if (executor != 0) DestroyExecutor(&main_, executor, V());
  }

  // A workspace too small or missing: refused without consuming the
  // executor, which then runs with the right one.
  void SmallWorkspace() {
    SessionState* s = &main_;
    const int64_t n = 256;
    const uint64_t b = Malloc(s, 4 * n * 2 + 64);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request;
    request.set_op("DropoutBackward");
    request.mutable_params()->set_scale(2);
    auto& t = *request.mutable_tensors();
    t["gradOutput"] = Desc(b, v1::FLOAT, {n});
    t["mask"] = Desc(b, v1::UINT8, {32}, {2}, 0, 4 * n);
    t["out"] = Desc(b, v1::FLOAT, {n}, {}, 0, 4 * n + 64);
    uint64_t workspace = 0;
    const uint64_t executor = GetWorkspaceSize(s, request, &workspace, V());
    if (executor == 0) return;
    if (workspace == 0) {
      stats_->Problem("workspace_size", "a strided mask needs a workspace");
      return;
    }
    const uint64_t ws = Malloc(s, workspace);
    if (ws == 0) return;
    switch (Rand(3)) {
      case 0:
        Execute(s, LaunchRequest(s, executor, 0, ws, 0, workspace - 1),
                Invalid("small_workspace", Bit(StatusCode::INVALID_ARGUMENT)));
        break;
      case 1:
        Execute(s, LaunchRequest(s, executor, 0, 1ull << 60, 0, workspace),
                Invalid("small_workspace", Bit(StatusCode::NOT_FOUND)));
        break;
      default:
        Execute(s, LaunchRequest(s, executor, 0, ws, 8, workspace),
                Invalid("bad_range", Bit(StatusCode::INVALID_ARGUMENT)));
        break;
    }
    Execute(s, LaunchRequest(s, executor, 0, ws, 0, workspace), V());
    Sync(s, 0);
    Free(s, ws);
    Free(s, b);
  }

  // CreateStream until the limit (16 per session) refuses one.
  void StreamLimit() {
    SessionState* s = &main_;
    std::vector<uint64_t> made;
    bool refused = false;
    for (int i = 0; i < 20 && !refused; ++i) {
      uint64_t stream = CreateStream(
          s, Invalid("stream_limit", Bit(StatusCode::OK) |
                                         Bit(StatusCode::RESOURCE_EXHAUSTED)));
      if (stream == 0) {
        refused = true;
      } else {
        made.push_back(stream);
      }
    }
    if (!refused) {
      stats_->Problem("stream_limit", "20 streams created in one session");
    }
    for (uint64_t stream : made) DestroyStream(s, stream, V());
  }

  // One ExecuteStream call mixing valid launches with bad ones: each reply
  // carries its own outcome and the call goes on.
  void MixedPipeline() {
    SessionState* s = &main_;
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    std::vector<v1::ExecuteRequest> launches;
    std::vector<Expect> expects;
    for (int i = 0; i < 6; ++i) {
      if (Chance(0.5)) {
        const uint64_t executor =
            GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
        if (executor == 0) return;
        launches.push_back(LaunchRequest(s, executor, 0));
        expects.push_back(V());
        if (Chance(0.3)) {  // The same single-use executor again.
          launches.push_back(LaunchRequest(s, executor, 0));
          expects.push_back(Invalid("consumed_executor",
                                    Bit(StatusCode::FAILED_PRECONDITION)));
        }
      } else if (Chance(0.5)) {
        launches.push_back(LaunchRequest(s, (1ull << 60) + i, 0));
        expects.push_back(
            Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND)));
      } else {
        const uint64_t executor =
            GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
        if (executor == 0) return;
        launches.push_back(LaunchRequest(s, executor, (1ull << 60) + i));
        expects.push_back(
            Invalid("unknown_handle", Bit(StatusCode::NOT_FOUND)));
        // Refused before consuming: destroy it afterwards.
        launches.push_back(LaunchRequest(s, executor, 0));
        expects.push_back(V());
      }
    }
    ExecuteStream(s, launches, expects, V());
    Sync(s, 0);
  }

  // ------------------------------------------------ faults, in-process

  void FaultScenario() {
    switch (Rand(8)) {
      case 6:
        CloseMidTransfer();
        return;
      case 7:
        UnreadPipeline();
        return;
      case 0:
        CancelUpload();
        break;
      case 1:
        CancelDownload();
        break;
      case 2:
        CancelPipeline();
        break;
      case 3:
        CloseMidPipeline();
        break;
      case 4:
        CancelAttach();
        break;
      default:
        CloseWithWork();
        break;
    }
  }

  void CancelUpload() {
    SessionState* s = &main_;
    const uint64_t size = (8 + Rand(25)) << 20;
    const uint64_t b = Malloc(s, size);
    if (b == 0) return;
    const std::string chunk(256 << 10, 'u');
    grpc::ClientContext context;
    const bool by_deadline = Chance(0.3);
    SetDeadline(&context, by_deadline ? absl::Milliseconds(5 + Rand(50))
                                      : kTransferDeadline);
    v1::UploadResponse response;
    auto writer = conn_->rt->Upload(&context, &response);
    v1::UploadRequest message;
    message.set_session(s->token);
    message.set_buffer(b);
    message.set_size(size);
    const uint64_t stop_after = Rand(size / chunk.size());
    uint64_t sent = 0;
    for (uint64_t i = 0; sent < size; ++i) {
      if (!by_deadline && i == stop_after) {
        context.TryCancel();
        break;
      }
      message.set_data(chunk);
      if (!writer->Write(message)) break;
      message.Clear();
      sent += chunk.size();
    }
    if (sent >= size) writer->WritesDone();
    grpc::Status status = writer->Finish();
    Record("Upload",
           Invalid("cancel_upload", Bit(StatusCode::CANCELLED) |
                                        Bit(StatusCode::DEADLINE_EXCEEDED) |
                                        Bit(StatusCode::OK)),
           status, context);
    // The session is unharmed.
    CheckSessionStats();
    Free(s, b);
  }

  void CancelDownload() {
    SessionState* s = &main_;
    const uint64_t size = (8 + Rand(25)) << 20;
    const uint64_t b = Malloc(s, size);
    if (b == 0) return;
    grpc::ClientContext context;
    const int how = static_cast<int>(Rand(3));
    SetDeadline(&context, how == 2 ? absl::Milliseconds(5 + Rand(50))
                                   : kTransferDeadline);
    v1::DownloadRequest request;
    request.set_session(s->token);
    request.set_buffer(b);
    request.set_size(size);
    auto reader = conn_->rt->Download(&context, request);
    v1::DownloadResponse chunk;
    if (how == 0) {
      context.TryCancel();  // Before reading anything.
    } else if (how == 1) {
      const uint64_t k = 1 + Rand(3);
      for (uint64_t i = 0; i < k && reader->Read(&chunk); ++i) {
      }
      context.TryCancel();
    } else {
      absl::SleepFor(absl::Milliseconds(Rand(20)));  // A slow reader.
    }
    while (reader->Read(&chunk)) {
    }
    Record("Download",
           Invalid("cancel_download", Bit(StatusCode::CANCELLED) |
                                          Bit(StatusCode::DEADLINE_EXCEEDED) |
                                          Bit(StatusCode::OK)),
           reader->Finish(), context);
    CheckSessionStats();
    Free(s, b);
  }

  // ExecuteStream cancelled with launches in flight; what was queued runs
  // and the stream synchronizes OK.
  void CancelPipeline() {
    SessionState* s = &main_;
    const int64_t n = 1 << 16;
    const uint64_t b = Malloc(s, n * 4);
    if (b == 0) return;
    v1::GetWorkspaceSizeRequest request;
    request.set_op("SoftshrinkBackward");
    request.mutable_params()->set_lambd(0.5);
    for (const char* name : {"gradOutput", "self", "gradInput"}) {
      (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
    if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
    const uint64_t stream = PickStream();
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    auto call = conn_->ops->ExecuteStream(&context);
    const int launches = 64 + static_cast<int>(Rand(448));
    const v1::ExecuteRequest launch = LaunchRequest(s, executor, stream);
    for (int i = 0; i < launches; ++i) {
      if (!call->Write(launch)) break;
    }
    const uint64_t k = Rand(16);
    v1::ExecuteResponse reply;
    for (uint64_t i = 0; i < k && call->Read(&reply); ++i) {
      Outcome o;
      o.code = static_cast<StatusCode>(reply.code());
      o.aclnn = reply.aclnn_status();
      o.message = reply.message();
      stats_->Record("ExecuteStream launch", V(), o);
    }
    context.TryCancel();
    while (call->Read(&reply)) {
    }
    Record("ExecuteStream",
           Invalid("cancel_pipeline",
                   Bit(StatusCode::CANCELLED) | Bit(StatusCode::OK)),
           call->Finish(), context);
    Sync(s, stream);
    DestroyExecutor(s, executor, V());
    Free(s, b);
  }

  // CloseSession while its ExecuteStream runs: later launches are refused
  // in their replies; the call ends OK.
  void CloseMidPipeline() {
    SessionState temp;
    if (!OpenSession(&temp, Chance(0.5))) return;
    const int64_t n = 1 << 16;
    const uint64_t b = Malloc(&temp, n * 4);
    if (b == 0) return CloseSession(&temp);
    v1::GetWorkspaceSizeRequest request;
    request.set_op("ThresholdBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(&temp, request, nullptr, V());
    if (executor == 0 || !SetRepeatable(&temp, executor, V()).ok()) {
      return CloseSession(&temp);
    }
    grpc::ClientContext context;
    SetDeadline(&context, kTransferDeadline);
    auto call = conn_->ops->ExecuteStream(&context);
    const v1::ExecuteRequest launch = LaunchRequest(&temp, executor, 0);
    const int before = 8 + static_cast<int>(Rand(24));
    for (int i = 0; i < before; ++i) call->Write(launch);
    v1::ExecuteResponse reply;
    const Expect either = Invalid(
        "close_mid_pipeline", Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND) |
                                  Bit(StatusCode::CANCELLED));
    int read = 0;
    for (; read < 4 && call->Read(&reply); ++read) {
      Outcome o;
      o.code = static_cast<StatusCode>(reply.code());
      o.aclnn = reply.aclnn_status();
      o.message = reply.message();
      stats_->Record("ExecuteStream launch", either, o);
    }
    CloseSession(&temp);
    const int after = 1 + static_cast<int>(Rand(8));
    for (int i = 0; i < after; ++i) call->Write(launch);
    call->WritesDone();
    Outcome last;
    while (call->Read(&reply)) {
      ++read;
      last.code = static_cast<StatusCode>(reply.code());
      last.aclnn = reply.aclnn_status();
      last.message = reply.message();
      stats_->Record("ExecuteStream launch", either, last);
    }
    Outcome o = Record("ExecuteStream", V(), call->Finish(), context);
    if (o.ok() &&
        (read != before + after || last.code != StatusCode::NOT_FOUND)) {
      stats_->Problem("close_mid_pipeline",
                      absl::StrCat(read, " replies to ", before + after,
                                   " launches; the last after CloseSession: ",
                                   CodeName(last.code)));
    }
  }

  // CloseSession from another thread while the session's transfer runs.
  void CloseMidTransfer() {
    SessionState temp;
    if (!OpenSession(&temp, Chance(0.5))) return;
    const uint64_t size = 16 << 20;
    const uint64_t b = Malloc(&temp, size);
    if (b == 0) return CloseSession(&temp);
    const bool upload = Chance(0.5);
    const Expect e = Invalid("close_mid_transfer",
                             Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND) |
                                 Bit(StatusCode::CANCELLED));
    SessionState view;  // The transfer's own copy of what it names.
    view.token = temp.token;
    std::thread transfer([&] {
      grpc::ClientContext context;
      SetDeadline(&context, kTransferDeadline);
      if (upload) {
        v1::UploadResponse response;
        auto writer = conn_->rt->Upload(&context, &response);
        v1::UploadRequest message;
        message.set_session(view.token);
        message.set_buffer(b);
        message.set_size(size);
        const std::string chunk(256 << 10, 't');
        for (uint64_t sent = 0; sent < size; sent += chunk.size()) {
          message.set_data(chunk);
          if (!writer->Write(message)) break;
          message.Clear();
          absl::SleepFor(absl::Microseconds(500));
        }
        writer->WritesDone();
        Record("Upload", e, writer->Finish(), context);
      } else {
        v1::DownloadRequest request;
        request.set_session(view.token);
        request.set_buffer(b);
        request.set_size(size);
        auto reader = conn_->rt->Download(&context, request);
        v1::DownloadResponse chunk;
        while (reader->Read(&chunk)) absl::SleepFor(absl::Milliseconds(5));
        Record("Download", e, reader->Finish(), context);
      }
    });
    absl::SleepFor(absl::Milliseconds(Rand(30)));
    CloseSession(&temp);
    transfer.join();
  }

  // ExecuteStream that never reads its replies: the server stops reading
  // at --max_pending_replies, the client's writes block, the deadline ends
  // the call.
  void UnreadPipeline() {
    SessionState* s = &main_;
    const uint64_t b = AnyBuffer(64);
    if (b == 0) return;
    const uint64_t executor =
        GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
    if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
    grpc::ClientContext context;
    SetDeadline(&context, absl::Milliseconds(1000 + Rand(2000)));
    auto call = conn_->ops->ExecuteStream(&context);
    const v1::ExecuteRequest launch = LaunchRequest(s, executor, 0);
    int written = 0;
    while (written < 3000 && call->Write(launch)) ++written;
    call->WritesDone();
    v1::ExecuteResponse reply;
    int replies = 0;
    while (call->Read(&reply)) {
      ++replies;
      if (reply.code() != 0) {
        stats_->Problem("unread_pipeline",
                        absl::StrCat("launch failed: ", reply.message()));
      }
    }
    Record("ExecuteStream",
           Invalid("unread_pipeline",
                   Bit(StatusCode::DEADLINE_EXCEEDED) | Bit(StatusCode::OK)),
           call->Finish(), context);
    Sync(s, 0);
    DestroyExecutor(s, executor, V());
  }

  // Cancelling the Attach call ends the session on the server.
  void CancelAttach() {
    SessionState temp;
    if (!OpenSession(&temp, true)) return;
    Malloc(&temp, 1 + Rand(1 << 20));
    const std::string token = temp.token;
    DropAttach(&temp);
    temp.token = token;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    const Expect e = Invalid("attach_cancel",
                             Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND));
    for (;;) {
      v1::GetSessionStatsRequest request;
      request.set_session(token);
      v1::SessionStats stats;
      Outcome o = Unary("GetSessionStats", SOAK_RT(GetSessionStats), request,
                        &stats, e);
      if (o.code == StatusCode::NOT_FOUND) return;
      if (!o.ok()) return;
      if (absl::Now() > deadline) {
        stats_->Problem("attach_cancel",
                        "the session outlived its cancelled Attach by 10 s");
        return;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  // CloseSession with work queued on its streams returns promptly.
  void CloseWithWork() {
    SessionState temp;
    if (!OpenSession(&temp, Chance(0.5))) return;
    const int64_t n = 1 << 18;
    const uint64_t b = Malloc(&temp, n * 4);
    if (b == 0) return CloseSession(&temp);
    v1::GetWorkspaceSizeRequest request;
    request.set_op("HardswishBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
    }
    const uint64_t executor = GetWorkspaceSize(&temp, request, nullptr, V());
    if (executor == 0 || !SetRepeatable(&temp, executor, V()).ok()) {
      return CloseSession(&temp);
    }
    const uint64_t stream = CreateStream(&temp, V());
    for (int i = 0; i < 32; ++i) {
      Execute(&temp, LaunchRequest(&temp, executor, i % 2 ? stream : 0), V());
    }
    CloseSession(&temp);
  }

  const int id_;
  const std::string address_;
  std::shared_ptr<Conn> conn_;
  Stats* const stats_;
  std::mt19937_64 rng_;
  const Mode mode_;
  SessionState main_;
};

// =========================================================== fault children

// A client process that starts a transfer, says so on stdout ('R') and
// carries on until it is killed. It ends itself after 60 s in any case.
[[noreturn]] void RunFaultChild(const std::string& kind,
                                const std::string& address, bool attach,
                                int parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(4);
  alarm(60);
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "soak fault child: %s\n", what.c_str());
    _exit(5);
  };
  auto ready = [] {
    if (write(1, "R", 1) != 1) _exit(6);
  };
  auto conn = Connect(address, true);
  grpc::ClientContext create_context;
  v1::CreateSessionRequest create;
  create.set_client_name(absl::StrCat("soak fault child ", kind));
  v1::CreateSessionResponse session;
  grpc::Status status =
      conn->rt->CreateSession(&create_context, create, &session);
  if (!status.ok()) fail("CreateSession: " + status.error_message());
  grpc::ClientContext attach_context;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attached;
  if (attach) {
    v1::AttachRequest request;
    request.set_session(session.session());
    attached = conn->rt->Attach(&attach_context, request);
    v1::AttachEvent event;
    if (!attached->Read(&event)) fail("Attach");
  }
  const uint64_t size = 16 << 20;
  grpc::ClientContext malloc_context;
  v1::MallocRequest malloc_request;
  malloc_request.set_session(session.session());
  malloc_request.set_size(size);
  v1::MallocResponse buffer;
  status = conn->rt->Malloc(&malloc_context, malloc_request, &buffer);
  if (!status.ok()) fail("Malloc: " + status.error_message());
  bool said = false;
  if (kind == "upload") {
    const std::string chunk(256 << 10, 'c');
    for (;;) {
      grpc::ClientContext context;
      v1::UploadResponse response;
      auto writer = conn->rt->Upload(&context, &response);
      v1::UploadRequest message;
      message.set_session(session.session());
      message.set_buffer(buffer.buffer());
      message.set_size(size);
      for (uint64_t sent = 0; sent < size; sent += chunk.size()) {
        message.set_data(chunk);
        if (!writer->Write(message)) fail("Upload write");
        message.Clear();
        if (!said && sent >= 4 * chunk.size()) {
          ready();
          said = true;
        }
        usleep(2000);
      }
      writer->WritesDone();
      status = writer->Finish();
      if (!status.ok()) fail("Upload: " + status.error_message());
    }
  } else if (kind == "download") {
    for (;;) {
      grpc::ClientContext context;
      v1::DownloadRequest request;
      request.set_session(session.session());
      request.set_buffer(buffer.buffer());
      request.set_size(size);
      auto reader = conn->rt->Download(&context, request);
      v1::DownloadResponse chunk;
      while (reader->Read(&chunk)) {
        if (!said) {
          ready();
          said = true;
        }
        usleep(50000);  // A slow reader: the server waits on flow control.
      }
      status = reader->Finish();
      if (!status.ok()) fail("Download: " + status.error_message());
    }
  } else {
    const int64_t n = (16 << 20) / 4;
    grpc::ClientContext plan_context;
    v1::GetWorkspaceSizeRequest plan;
    plan.set_session(session.session());
    plan.set_op("HardswishBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*plan.mutable_tensors())[name] =
          Desc(buffer.buffer(), v1::FLOAT, {n / 16});
    }
    v1::GetWorkspaceSizeResponse executor;
    status = conn->ops->GetWorkspaceSize(&plan_context, plan, &executor);
    if (!status.ok()) fail("GetWorkspaceSize: " + status.error_message());
    grpc::ClientContext repeat_context;
    v1::SetExecutorRepeatableRequest repeat;
    repeat.set_session(session.session());
    repeat.set_executor(executor.executor());
    v1::SetExecutorRepeatableResponse repeated;
    status =
        conn->ops->SetExecutorRepeatable(&repeat_context, repeat, &repeated);
    if (!status.ok()) fail("SetExecutorRepeatable: " + status.error_message());
    grpc::ClientContext context;
    auto call = conn->ops->ExecuteStream(&context);
    v1::ExecuteRequest launch;
    launch.set_session(session.session());
    launch.set_executor(executor.executor());
    // At most 32 launches in flight: what it leaves queued is bounded.
    int in_flight = 0, replies = 0;
    v1::ExecuteResponse reply;
    for (;;) {
      while (in_flight < 32) {
        if (!call->Write(launch)) fail("ExecuteStream write");
        ++in_flight;
      }
      if (!call->Read(&reply)) fail("ExecuteStream read");
      if (reply.code() != 0) fail("ExecuteStream launch: " + reply.message());
      --in_flight;
      if (++replies == 16) ready();
    }
  }
  _exit(7);
}

// ================================================================ processes

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct ProcSample {
  double t = 0;  // Seconds since the load started (negative: before).
  int64_t rss_kb = -1, hwm_kb = -1, threads = -1, fds = -1;
  int64_t sessions = -1, buffers = -1, buffer_bytes = -1;
  std::map<std::string, int> thread_names;  // Only when asked for.
};

std::map<std::string, int> ThreadNames(pid_t pid) {
  std::map<std::string, int> names;
  const std::string dir_name = absl::StrCat("/proc/", pid, "/task");
  if (DIR* dir = opendir(dir_name.c_str())) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      std::ifstream comm(absl::StrCat(dir_name, "/", entry->d_name, "/comm"));
      std::string name;
      std::getline(comm, name);
      ++names[name];
    }
    closedir(dir);
  }
  return names;
}

std::string FormatNames(const std::map<std::string, int>& names) {
  std::vector<std::string> parts;
  for (const auto& [name, n] : names)
    parts.push_back(absl::StrCat(name, " ", n));
  return absl::StrJoin(parts, ", ");
}

ProcSample ReadProc(pid_t pid) {
  ProcSample s;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    auto field = [&](const char* name, int64_t* out) {
      if (absl::StartsWith(line, name)) {
        std::vector<std::string> parts = absl::StrSplit(
            line.substr(std::strlen(name)), ' ', absl::SkipWhitespace());
        if (!parts.empty()) absl::SimpleAtoi(parts[0], out);
      }
    };
    field("VmRSS:", &s.rss_kb);
    field("VmHWM:", &s.hwm_kb);
    field("Threads:", &s.threads);
  }
  if (DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    s.fds = 0;
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++s.fds;
    }
    closedir(dir);
  }
  return s;
}

std::string LoadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string a, b, c;
  file >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

// Starts the server with stdout on a pipe and stderr in `log`; returns its
// pid and the address it reports.
pid_t StartServer(const std::vector<std::string>& argv, const std::string& log,
                  std::string* address) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::exit(2);
  }
  const int err =
      open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (err < 0) {
    std::perror(log.c_str());
    std::exit(2);
  }
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Dies with the soak, whatever happens to it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], 1);
    dup2(err, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err);
  // "listening on HOST:PORT", within 60 s (an ASan build starts slowly).
  std::string text;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[256];
      ssize_t n = read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, n);
      size_t at = text.find("listening on ");
      size_t end = text.find('\n', at);
      if (at != std::string::npos && end != std::string::npos) {
        *address = text.substr(at + 13, end - at - 13);
        return pid;  // out[0] stays open: the server may print again.
      }
    }
    int wstatus;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) break;
  }
  std::fprintf(stderr, "soak: the server did not report its port; see %s\n",
               log.c_str());
  kill(pid, SIGKILL);
  std::exit(2);
}

std::string DescribeWait(int wstatus) {
  if (WIFEXITED(wstatus))
    return absl::StrCat("exit status ", WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wstatus), " (",
                        strsignal(WTERMSIG(wstatus)), ")");
  }
  return absl::StrCat("wait status ", wstatus);
}

// The killer: child client processes SIGKILLed in the middle of a transfer.
class Killer {
 public:
  Killer(std::string self, std::string address, absl::Duration interval,
         uint64_t seed)
      : self_(std::move(self)),
        address_(std::move(address)),
        interval_(interval),
        rng_(seed) {}

  void Run(const std::atomic<bool>* stop) {
    static const char* const kKinds[] = {"upload", "download", "pipeline"};
    for (uint64_t i = 0; !stop->load(); ++i) {
      const std::string kind = kKinds[i % 3];
      const bool attach = (rng_() % 2) == 0;
      RunOne(kind, attach);
      for (absl::Time until = absl::Now() + interval_;
           absl::Now() < until && !stop->load();) {
        absl::SleepFor(std::min(interval_, absl::Milliseconds(50)));
      }
    }
  }

  std::string Report() const {
    absl::MutexLock lock(&mu_);
    std::string out =
        "| killed during | session attached | started | killed mid-transfer "
        "| median ms to mid-transfer | other outcome |\n"
        "|---|---|---:|---:|---:|---|\n";
    for (const auto& [key, row] : rows_) {
      const std::vector<double>& ms = row.ready_ms;
      absl::StrAppend(
          &out, "| ", key.first, " | ", key.second ? "yes" : "no (idle reaper)",
          " | ", row.started, " | ", row.killed, " | ",
          absl::StrFormat("%.0f", Median(ms)), " | ",
          row.failures.empty()
              ? "none"
              : absl::StrCat("**", absl::StrJoin(row.failures, "; "), "**"),
          " |\n");
    }
    return out;
  }

  uint64_t failures() const {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [key, row] : rows_) n += row.failures.size();
    return n;
  }
  uint64_t killed() const {
    absl::MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& [key, row] : rows_) n += row.killed;
    return n;
  }

 private:
  struct Row {
    uint64_t started = 0, killed = 0;
    std::vector<double> ready_ms;
    std::vector<std::string> failures;
  };

  void RunOne(const std::string& kind, bool attach) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    std::vector<std::string> argv = {
        self_, absl::StrCat("--fault_child=", kind),
        absl::StrCat("--server=", address_),
        absl::StrCat("--attach=", attach ? "true" : "false"),
        absl::StrCat("--parent_pid=", getpid())};
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_t pid = 0;
    const absl::Time start = absl::Now();
    const int rc = posix_spawn(&pid, self_.c_str(), &actions, nullptr,
                               args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    Row* row;
    {
      absl::MutexLock lock(&mu_);
      row = &rows_[{kind, attach}];
      ++row->started;
    }
    if (rc != 0) {
      close(out[0]);
      Fail(row, absl::StrCat("posix_spawn: ", std::strerror(rc)));
      return;
    }
    // Wait for 'R' (mid-transfer), at most 60 s.
    bool ready = false;
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 60000) > 0) {
      char c;
      ready = read(out[0], &c, 1) == 1 && c == 'R';
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (ready) {
      // Somewhere in the middle of the transfer.
      absl::SleepFor(absl::Milliseconds(rng_() % 20));
    }
    kill(pid, SIGKILL);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    close(out[0]);
    if (ready && WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) {
      absl::MutexLock lock(&mu_);
      ++row->killed;
      row->ready_ms.push_back(ms);
    } else {
      Fail(row, absl::StrCat(ready ? "" : "never reached the transfer, ",
                             DescribeWait(wstatus)));
    }
  }

  void Fail(Row* row, std::string what) {
    std::fprintf(stderr, "soak: UNEXPECTED fault child: %s\n", what.c_str());
    absl::MutexLock lock(&mu_);
    if (row->failures.size() < 5) row->failures.push_back(std::move(what));
  }

  const std::string self_;
  const std::string address_;
  const absl::Duration interval_;
  std::mt19937_64 rng_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, bool>, Row> rows_ ABSL_GUARDED_BY(mu_);
};

// ==================================================================== main

std::atomic<const char*> watchdog_phase{"start"};
std::atomic<int64_t> watchdog_deadline_ns{0};
std::atomic<pid_t> server_pid{0};

void SetPhase(const char* phase, absl::Duration budget) {
  watchdog_phase = phase;
  watchdog_deadline_ns = absl::ToUnixNanos(absl::Now() + budget);
}

void Watchdog() {
  for (;;) {
    absl::SleepFor(absl::Seconds(1));
    const int64_t deadline = watchdog_deadline_ns.load();
    if (deadline != 0 && absl::ToUnixNanos(absl::Now()) > deadline) {
      std::fprintf(stderr,
                   "soak: FAIL: watchdog: phase '%s' did not finish in its "
                   "time budget; killing the server and exiting\n",
                   watchdog_phase.load());
      if (server_pid.load() > 0) kill(server_pid.load(), SIGKILL);
      std::fflush(stderr);
      _exit(3);
    }
  }
}

v1::ServerStats QueryServerStats(Conn* conn, bool* ok) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(30));
  v1::ServerStats stats;
  *ok = conn->rt->GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
            .ok();
  return stats;
}

std::string Mib(int64_t kb) {
  return kb < 0 ? "?" : absl::StrFormat("%.1f", kb / 1024.0);
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_fault_child).empty()) {
    RunFaultChild(absl::GetFlag(FLAGS_fault_child), absl::GetFlag(FLAGS_server),
                  absl::GetFlag(FLAGS_attach), absl::GetFlag(FLAGS_parent_pid));
  }
  signal(SIGPIPE, SIG_IGN);
  const std::string opserver = absl::GetFlag(FLAGS_opserver);
  if (opserver.empty() || access(opserver.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "soak: --opserver=%s is not an executable\n",
                 opserver.c_str());
    return 2;
  }
  char self[4096];
  const ssize_t self_len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (self_len <= 0) return 2;
  self[self_len] = '\0';
  const int clients = absl::GetFlag(FLAGS_clients);
  const absl::Duration duration = absl::GetFlag(FLAGS_duration);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) seed = absl::ToUnixNanos(absl::Now());
  std::string log_dir = absl::GetFlag(FLAGS_log_dir);
  if (log_dir.empty()) {
    const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    if (outputs != nullptr) {
      log_dir = outputs;
    } else {
      char dir[] = "/tmp/opserver-soak.XXXXXX";
      if (mkdtemp(dir) == nullptr) return 2;
      log_dir = dir;
    }
  }
  const std::string log = log_dir + "/opserver.stderr";
  const int idle_timeout_s = absl::GetFlag(FLAGS_idle_timeout_s);
  std::vector<std::string> server_argv = {
      opserver, "--listen=127.0.0.1:0",
      absl::StrCat("--idle_timeout_s=", idle_timeout_s),
      // Every client, child and reaped session fits: running into this
      // limit would itself show a leak.
      "--max_sessions=1024",
      absl::StrCat("--memory_cache_bytes=",
                   absl::GetFlag(FLAGS_memory_cache_bytes))};
  for (const std::string& f : absl::GetFlag(FLAGS_server_flags)) {
    if (!f.empty()) server_argv.push_back(f);
  }
  std::vector<std::string> failures;
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };

  std::thread(Watchdog).detach();
  SetPhase("server start", absl::Seconds(90));
  std::string address;
  const pid_t pid = StartServer(server_argv, log, &address);
  server_pid = pid;
  std::fprintf(stderr, "soak: server pid %d on %s, log %s, seed %llu\n", pid,
               address.c_str(), log.c_str(),
               static_cast<unsigned long long>(seed));
  auto monitor = Connect(address, true);
  if (!monitor->channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + absl::Seconds(30)))) {
    std::fprintf(stderr, "soak: cannot connect to %s\n", address.c_str());
    kill(pid, SIGKILL);
    return 2;
  }
  const std::string load_before = LoadAverage();
  ProcSample start = ReadProc(pid);
  start.thread_names = ThreadNames(pid);
  {
    bool ok;
    v1::ServerStats s = QueryServerStats(monitor.get(), &ok);
    start.sessions = s.sessions();
    start.buffers = s.buffers();
    start.buffer_bytes = s.buffer_bytes();
  }

  // ---- the soak
  Stats stats;
  std::atomic<bool> stop{false};
  std::atomic<bool> server_died{false};
  int server_wstatus = 0;
  const absl::Time load_start = absl::Now();
  const absl::Time load_end = load_start + duration;
  SetPhase("soak", duration + absl::Minutes(5));
  std::vector<ProcSample> samples;
  absl::Mutex samples_mu;
  const absl::Duration sample_every =
      std::clamp(duration / 120, absl::Milliseconds(250), absl::Seconds(5));
  std::thread sampler([&] {
    int64_t printed = 0;
    while (!stop.load()) {
      ProcSample s = ReadProc(pid);
      bool ok;
      v1::ServerStats st = QueryServerStats(monitor.get(), &ok);
      if (ok) {
        s.sessions = st.sessions();
        s.buffers = st.buffers();
        s.buffer_bytes = st.buffer_bytes();
      }
      s.t = absl::ToDoubleSeconds(absl::Now() - load_start);
      {
        absl::MutexLock lock(&samples_mu);
        samples.push_back(s);
      }
      if (s.t >= printed * 30.0) {
        ++printed;
        std::fprintf(stderr,
                     "soak: t=%.0fs calls=%llu expected-errors=%llu "
                     "unexpected=%llu rss=%sMiB threads=%lld fds=%lld "
                     "sessions=%lld buffers=%lld load=%s\n",
                     s.t, static_cast<unsigned long long>(stats.total_calls()),
                     static_cast<unsigned long long>(stats.expected_errors()),
                     static_cast<unsigned long long>(stats.unexpected()),
                     Mib(s.rss_kb).c_str(), static_cast<long long>(s.threads),
                     static_cast<long long>(s.fds),
                     static_cast<long long>(s.sessions),
                     static_cast<long long>(s.buffers), LoadAverage().c_str());
      }
      for (absl::Time until = absl::Now() + sample_every;
           absl::Now() < until && !stop.load();) {
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
  });
  const absl::Duration kill_interval = absl::GetFlag(FLAGS_kill_interval);
  std::unique_ptr<Killer> killer;
  std::thread killer_thread;
  if (kill_interval > absl::ZeroDuration()) {
    killer =
        std::make_unique<Killer>(self, address, kill_interval, seed ^ 0x5eed);
    killer_thread = std::thread([&] { killer->Run(&stop); });
  }
  // A quarter of the clients share four channels (one connection each);
  // the rest have a connection of their own.
  std::vector<std::shared_ptr<Conn>> shared;
  for (int i = 0; i < 4; ++i) shared.push_back(Connect(address, true));
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      Client client(i, address, i % 4 == 0 ? shared[(i / 4) % 4] : nullptr,
                    &stats, seed + 1000 + i, Mode::kSoak);
      client.Run(load_end, &stop);
    });
  }
  while (absl::Now() < load_end) {
    absl::SleepFor(std::min(absl::Milliseconds(200), load_end - absl::Now()));
    if (waitpid(pid, &server_wstatus, WNOHANG) == pid) {
      server_died = true;
      failures.push_back(absl::StrCat("the server died during the soak: ",
                                      DescribeWait(server_wstatus)));
      break;
    }
  }
  ProcSample end_of_load = ReadProc(pid);
  end_of_load.t = absl::ToDoubleSeconds(absl::Now() - load_start);
  {
    bool ok;
    v1::ServerStats s = QueryServerStats(monitor.get(), &ok);
    end_of_load.sessions = s.sessions();
    end_of_load.buffers = s.buffers();
    end_of_load.buffer_bytes = s.buffer_bytes();
  }
  const std::string load_during = LoadAverage();
  SetPhase("clients ending", absl::Minutes(5));
  if (server_died) stop = true;
  for (std::thread& t : threads) t.join();
  shared.clear();
  stop = true;
  if (killer_thread.joinable()) killer_thread.join();
  sampler.join();
  const absl::Duration ran = absl::Now() - load_start;

  // ---- leaks
  SetPhase("leak check", absl::Seconds(idle_timeout_s + 60));
  ProcSample after_clients;
  double zero_after_s = -1;
  v1::ServerStats first_stats, last_stats;
  bool stats_ok = false;
  if (!server_died) {
    const absl::Time t0 = absl::Now();
    first_stats = QueryServerStats(monitor.get(), &stats_ok);
    last_stats = first_stats;
    const absl::Time deadline = t0 + absl::Seconds(idle_timeout_s + 15);
    while (stats_ok && absl::Now() < deadline) {
      last_stats = QueryServerStats(monitor.get(), &stats_ok);
      if (last_stats.sessions() == 0 && last_stats.buffers() == 0 &&
          last_stats.buffer_bytes() == 0) {
        zero_after_s = absl::ToDoubleSeconds(absl::Now() - t0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(250));
    }
    if (zero_after_s < 0) {
      failures.push_back(absl::StrCat(
          "leak: ", last_stats.sessions(), " sessions, ", last_stats.buffers(),
          " buffers, ", last_stats.buffer_bytes(), " bytes ",
          idle_timeout_s + 15, " s after every client ended"));
    }
    // Connections of the clients and children close; give the server a
    // moment to notice before counting its fds.
    for (int i = 0; i < 40; ++i) {
      after_clients = ReadProc(pid);
      if (after_clients.fds <= start.fds) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
    after_clients.thread_names = ThreadNames(pid);
    after_clients.t = absl::ToDoubleSeconds(absl::Now() - load_start);
    after_clients.sessions = last_stats.sessions();
    after_clients.buffers = last_stats.buffers();
    after_clients.buffer_bytes = last_stats.buffer_bytes();
    if (after_clients.fds > start.fds + 4) {
      failures.push_back(absl::StrCat("the server holds ", after_clients.fds,
                                      " fds after the clients ended, ",
                                      start.fds, " before they started"));
    }
  }

  // ---- SIGTERM under load
  Stats shutdown_stats;
  std::string exit_text = "not run (the server died earlier)";
  double exit_ms = -1;
  uint64_t calls_before_term = 0;
  std::string held_text;
  if (!server_died) {
    SetPhase("SIGTERM under load", absl::Minutes(3));
    std::atomic<bool> stop_load{false};
    std::vector<std::thread> load;
    const int n = absl::GetFlag(FLAGS_sigterm_clients);
    for (int i = 0; i < n; ++i) {
      load.emplace_back([&, i] {
        Client client(10000 + i, address, nullptr, &shutdown_stats,
                      seed + 50000 + i, Mode::kShutdown);
        if (i < 2) client.SlowTransfer(/*upload=*/i == 0);
        client.Run(absl::InfiniteFuture(), &stop_load);
      });
    }
    const absl::Time busy_by = absl::Now() + absl::Seconds(10);
    absl::SleepFor(absl::Seconds(2));
    while (shutdown_stats.total_calls() < 50 * static_cast<uint64_t>(n) &&
           absl::Now() < busy_by) {
      absl::SleepFor(absl::Milliseconds(100));
    }
    calls_before_term = shutdown_stats.total_calls();
    // Held across the signal: an Attach call must get the "server shutting
    // down" event and a health Watch NOT_SERVING, and both must end.
    auto held = Connect(address, true);
    std::string attach_events, watch_statuses;
    grpc::Status attach_status, watch_status;
    grpc::ClientContext create_context, attach_context, watch_context;
    SetDeadline(&create_context, absl::Seconds(30));
    SetDeadline(&attach_context, absl::Minutes(2));
    SetDeadline(&watch_context, absl::Minutes(2));
    v1::CreateSessionRequest create;
    create.set_client_name("soak: held across SIGTERM");
    v1::CreateSessionResponse created;
    held->rt->CreateSession(&create_context, create, &created);
    v1::AttachRequest attach_request;
    attach_request.set_session(created.session());
    auto attach = held->rt->Attach(&attach_context, attach_request);
    auto watch = held->health->Watch(&watch_context,
                                     grpc::health::v1::HealthCheckRequest());
    std::thread attach_reader([&] {
      v1::AttachEvent event;
      while (attach->Read(&event))
        absl::StrAppend(&attach_events, event.event(), "; ");
      attach_status = attach->Finish();
    });
    std::thread watch_reader([&] {
      grpc::health::v1::HealthCheckResponse response;
      while (watch->Read(&response)) {
        absl::StrAppend(
            &watch_statuses,
            grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                response.status()),
            "; ");
      }
      watch_status = watch->Finish();
    });
    absl::SleepFor(absl::Milliseconds(200));
    const absl::Time t0 = absl::Now();
    kill(pid, SIGTERM);
    int wstatus = 0;
    bool exited = false;
    // The default --shutdown_grace_ms is 5000; wait up to 15 s more (more
    // than 3 s more is a failure, see below).
    while (absl::Now() < t0 + absl::Seconds(20)) {
      if (waitpid(pid, &wstatus, WNOHANG) == pid) {
        exited = true;
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    exit_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (!exited) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      exit_text = "still running 20 s after SIGTERM (killed)";
      failures.push_back(exit_text);
    } else {
      exit_text = DescribeWait(wstatus);
      if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        failures.push_back(absl::StrCat("after SIGTERM: ", exit_text));
      }
      // The grace, then cancelling what still runs and releasing sessions.
      if (exit_ms > 5000 + 3000) {
        failures.push_back(absl::StrFormat(
            "the server took %.0f ms to exit after SIGTERM, more than its "
            "--shutdown_grace_ms (5000) + 3000",
            exit_ms));
      }
    }
    server_pid = 0;
    stop_load = true;
    for (std::thread& t : load) t.join();
    attach_reader.join();
    watch_reader.join();
    held_text = absl::StrCat(
        "An Attach call held across the signal saw `", attach_events,
        "` and ended ", CodeName(attach_status.error_code()),
        "; a health Watch saw `", watch_statuses, "` and ended ",
        CodeName(watch_status.error_code()), ".");
    if (!absl::StrContains(attach_events, "server shutting down") ||
        !absl::StrContains(watch_statuses, "NOT_SERVING")) {
      failures.push_back(absl::StrCat("around SIGTERM: ", held_text));
    }
  } else {
    server_pid = 0;
  }
  SetPhase("report", absl::Minutes(2));

  // ---- the server's log
  std::map<std::string, uint64_t> log_kinds;
  std::vector<std::string> odd_lines;
  bool stopped_line = false;
  {
    std::ifstream file(log);
    std::string line;
    while (std::getline(file, line)) {
      const size_t at = line.find(" opserver: ");
      std::string kind = "other";
      if (at != std::string::npos) {
        const std::string rest = line.substr(at + 11);
        for (const char* known :
             {"started: ", "call failed: ", "received ", "stopped"}) {
          if (absl::StartsWith(rest, known)) kind = known;
        }
        if (absl::StartsWith(rest, "session ")) {
          kind = absl::StrContains(rest, "closed: idle") ? "session idle"
                 : absl::StrContains(rest, "attached client went away")
                     ? "session attach ended"
                     : "session closed";
        }
        if (kind == "stopped") stopped_line = true;
      }
      ++log_kinds[kind];
      if (kind == "other" && odd_lines.size() < 10) odd_lines.push_back(line);
    }
  }
  if (!odd_lines.empty()) {
    failures.push_back(absl::StrCat(log_kinds["other"],
                                    " server log lines of an unknown kind"));
  }
  if (!server_died && !stopped_line) {
    failures.push_back("no 'stopped' line in the server log");
  }

  // ---- RSS
  std::vector<ProcSample> load_samples;
  {
    absl::MutexLock lock(&samples_mu);
    load_samples = samples;
  }
  load_samples.push_back(end_of_load);
  ProcSample middle = load_samples.front();
  const double total_s = absl::ToDoubleSeconds(duration);
  for (const ProcSample& s : load_samples) {
    if (std::fabs(s.t - total_s / 2) < std::fabs(middle.t - total_s / 2)) {
      middle = s;
    }
  }
  // Flat: after the first third (warm-up: the reuse cache, gRPC's and
  // malloc's pools reach their working size), the last third's median RSS
  // is at most 10% + 32 MiB above the middle third's, and its peak at most
  // 25% + 64 MiB above the middle third's peak.
  std::vector<double> mid_third, last_third;
  for (const ProcSample& s : load_samples) {
    if (s.rss_kb < 0) continue;
    if (s.t >= total_s / 3 && s.t < 2 * total_s / 3)
      mid_third.push_back(s.rss_kb);
    if (s.t >= 2 * total_s / 3) last_third.push_back(s.rss_kb);
  }
  const double mid_median = Median(mid_third), last_median = Median(last_third);
  const double mid_peak =
      mid_third.empty() ? 0
                        : *std::max_element(mid_third.begin(), mid_third.end());
  const double last_peak =
      last_third.empty()
          ? 0
          : *std::max_element(last_third.begin(), last_third.end());
  const bool flat = last_median <= mid_median * 1.10 + 32 * 1024 &&
                    last_peak <= mid_peak * 1.25 + 64 * 1024;
  const std::string rss_check = absl::GetFlag(FLAGS_rss_check);
  const bool check_rss = rss_check == "on" ||
                         (rss_check == "auto" && duration >= absl::Minutes(3));
  std::string rss_verdict;
  if (mid_third.empty() || last_third.empty()) {
    rss_verdict = "not enough samples";
  } else {
    rss_verdict = absl::StrFormat(
        "median of the last third %.1f MiB vs the middle third %.1f MiB "
        "(limit %.1f); peaks %.1f vs %.1f MiB (limit %.1f): %s",
        last_median / 1024, mid_median / 1024,
        (mid_median * 1.10 + 32 * 1024) / 1024, last_peak / 1024,
        mid_peak / 1024, (mid_peak * 1.25 + 64 * 1024) / 1024,
        flat ? "flat" : "GROWING");
    if (!check_rss) {
      absl::StrAppend(&rss_verdict, " (not enforced: runs under 3 minutes)");
    } else if (!flat) {
      failures.push_back(absl::StrCat("RSS not flat: ", rss_verdict));
    }
  }

  if (stats.unexpected() > 0) {
    failures.push_back(absl::StrCat(stats.unexpected(),
                                    " unexpected outcomes during the soak"));
  }
  if (shutdown_stats.unexpected() > 0) {
    failures.push_back(absl::StrCat(shutdown_stats.unexpected(),
                                    " unexpected outcomes around SIGTERM"));
  }
  if (killer != nullptr && killer->failures() > 0) {
    failures.push_back(absl::StrCat(killer->failures(),
                                    " fault children did not die as planned"));
  }

  // ---- report
  std::string command;
  for (int i = 0; i < argc; ++i)
    absl::StrAppend(&command, i ? " " : "", argv[i]);
  out("# opserver soak and faults\n\n");
  out(absl::StrCat("- command: `", command, "`\n"));
  out(absl::StrCat("- server: `", absl::StrJoin(server_argv, " "), "`\n"));
  out(absl::StrCat("- seed ", seed, "; ", clients, " clients for ",
                   absl::FormatDuration(duration), " (ran ",
                   absl::FormatDuration(absl::Trunc(ran, absl::Seconds(1))),
                   "); a child process killed every ",
                   absl::FormatDuration(kill_interval), "\n"));
  out(absl::StrCat("- machine: ", std::thread::hardware_concurrency(),
                   " hardware threads; load average before ", load_before,
                   ", at the end of the load ", load_during, "\n"));
  out(absl::StrCat("- server log: ", log, "\n\n"));
  out(absl::StrFormat(
      "## Calls by RPC\n\n%llu calls in %.0f s (%.0f/s): %llu expected "
      "errors, %llu unexpected.\n\n",
      static_cast<unsigned long long>(stats.total_calls()),
      absl::ToDoubleSeconds(duration),
      stats.total_calls() / std::max(1.0, absl::ToDoubleSeconds(duration)),
      static_cast<unsigned long long>(stats.expected_errors()),
      static_cast<unsigned long long>(stats.unexpected())));
  out("## Results by code\n\n");
  out(stats.Report(true));
  out("\n## What provoked each expected error\n\n| category | explanation |\n"
      "|---|---|\n");
  std::set<std::string> seen = stats.categories();
  for (const std::string& c : shutdown_stats.categories()) seen.insert(c);
  for (const std::string& c : seen) {
    auto it = Explanations().find(c);
    out(absl::StrCat("| ", c, " | ",
                     it == Explanations().end() ? "?" : it->second, " |\n"));
  }
  if (killer != nullptr) {
    out(absl::StrCat("\n## Client processes killed with SIGKILL\n\n",
                     killer->Report()));
  }
  out("\n## Server memory and resources\n\n"
      "| when | t (s) | VmRSS MiB | VmHWM MiB | threads | fds | sessions | "
      "buffers | buffer MiB "
      "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  auto row = [&](const char* when, const ProcSample& s) {
    out(absl::StrFormat(
        "| %s | %.0f | %s | %s | %lld | %lld | %lld | %lld | %s |\n", when, s.t,
        Mib(s.rss_kb), Mib(s.hwm_kb), static_cast<long long>(s.threads),
        static_cast<long long>(s.fds), static_cast<long long>(s.sessions),
        static_cast<long long>(s.buffers),
        s.buffer_bytes < 0 ? "?" : Mib(s.buffer_bytes / 1024)));
  };
  row("start (idle)", start);
  row("middle", middle);
  row("end of load", end_of_load);
  if (!server_died) row("after the clients ended", after_clients);
  out(absl::StrCat("\nRSS: ", rss_verdict, ".\n"));
  {
    // Twenty samples across the load, for the shape of the curve.
    std::vector<std::string> series;
    double next = 0;
    for (const ProcSample& s : load_samples) {
      if (s.t + 1e-9 < next || s.rss_kb < 0) continue;
      series.push_back(absl::StrFormat("%.0fs %.0f", s.t, s.rss_kb / 1024.0));
      next = s.t + total_s / 20;
    }
    out(absl::StrCat(
        "\nVmRSS over the load (MiB): ", absl::StrJoin(series, ", "), ".\n"));
  }
  out(absl::StrCat("\nServer threads by name at the start: ",
                   FormatNames(start.thread_names),
                   "; after the clients "
                   "ended: ",
                   FormatNames(after_clients.thread_names), ".\n"));
  out("\n## Leaks after every client ended\n\n");
  if (server_died) {
    out("Not checked: the server died.\n");
  } else {
    out(absl::StrCat(
        "First GetServerStats: ", first_stats.sessions(), " sessions, ",
        first_stats.buffers(), " buffers, ", first_stats.buffer_bytes(),
        " bytes (sessions of unattached killed children and abandoning "
        "clients wait for the idle reaper, --idle_timeout_s=",
        idle_timeout_s, ").\n"));
    if (zero_after_s >= 0) {
      out(absl::StrFormat(
          "Zero sessions, buffers and bytes %.1f s after the clients "
          "ended.\n",
          zero_after_s));
    } else {
      out(absl::StrCat("**Still ", last_stats.sessions(), " sessions, ",
                       last_stats.buffers(), " buffers, ",
                       last_stats.buffer_bytes(), " bytes.**\n"));
    }
  }
  out("\n## SIGTERM under load\n\n");
  out(absl::StrFormat(
      "%d client threads doing valid work, two of them a 64 MiB transfer "
      "paced to take 20 s (a slow writer and a slow reader), %llu calls "
      "before the signal, %llu in all: the server exited with **%s** %.0f "
      "ms after SIGTERM (--shutdown_grace_ms=5000: calls still running "
      "then are cancelled).\n\n",
      absl::GetFlag(FLAGS_sigterm_clients),
      static_cast<unsigned long long>(calls_before_term),
      static_cast<unsigned long long>(shutdown_stats.total_calls()), exit_text,
      exit_ms));
  out(absl::StrCat(held_text, "\n\n"));
  out(shutdown_stats.Report(false));
  out("\n## Server log\n\n| kind | lines |\n|---|---:|\n");
  for (const auto& [kind, count] : log_kinds) {
    out(absl::StrCat("| ", kind, " | ", count, " |\n"));
  }
  for (const std::string& line : odd_lines) out(absl::StrCat("\n    ", line));
  out("\n## Verdict\n\n");
  if (failures.empty()) {
    out("PASS: no unexpected outcome, no leak, RSS flat, exit status 0 after "
        "SIGTERM.\n");
  } else {
    out("FAIL:\n\n");
    for (const std::string& f : failures) out(absl::StrCat("- ", f, "\n"));
  }
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_report).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_report)) << report;
  }
  return failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace opserver::soak

int main(int argc, char** argv) { return opserver::soak::Main(argc, argv); }
