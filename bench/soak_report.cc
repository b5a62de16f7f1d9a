#include "bench/soak_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/trailers.h"
#include "kernels/aclnn_status.h"

namespace opserver::soak {

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

Expect Valid() { return Expect(); }
Expect Invalid(std::string category, uint32_t codes) {
  Expect e;
  e.category = std::move(category);
  e.codes = codes;
  return e;
}

Outcome FromStatus(const grpc::Status& status,
                   const grpc::ClientContext& context) {
  Outcome o;
  o.code = status.error_code();
  if (status.ok()) return o;
  o.message = status.error_message();
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kAclnnStatusTrailerKey);
  if (it != trailers.end()) {
    absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                     &o.aclnn);
  }
  return o;
}

Outcome FromAbsl(const absl::Status& status) {
  Outcome o;
  o.code = static_cast<StatusCode>(status.code());
  if (status.ok()) return o;
  o.message = std::string(status.message());
  o.aclnn = kernels::GetAclnnStatus(status);
  return o;
}

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
       "integer negativeSlope, a negative slope with selfIsResult, a "
       "tensor under a name its operator does not have (INVALID_ARGUMENT "
       "161002); a tensor missing (INVALID_ARGUMENT 161001); Evaluate with "
       "a values count that does not match its shape"},
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
       "Download is running: the server ends the transfer, "
       "which sees CANCELLED (an Upload with aclnn 361001 'transfer "
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
      {"wrong_token",
       "secure mode: the hostile tenant's calls with a bearer token the "
       "server does not know (CreateSession, GetDeviceInfo, Malloc, "
       "ListOperators, CloseSession of another tenant's session, Attach): "
       "UNAUTHENTICATED"},
      {"no_token",
       "secure mode: the same calls without a token: UNAUTHENTICATED "
       "(grpc.health.v1 needs none and answers)"},
      {"other_tenant_session",
       "secure mode: the hostile tenant's valid token with another "
       "tenant's session name (Malloc, GetSessionStats, CloseSession, Free, "
       "ReadValues, CreateStream, Download, Attach): NOT_FOUND, as for a "
       "session that does not exist; the session goes on unharmed"},
      {"data_port_flood",
       "plain mode: connections to the data port that send a ticket nobody "
       "was given: the server closes each at once"},
      {"server_shutdown",
       "calls running or starting while the server stops after SIGTERM: "
       "UNAVAILABLE (connection closing or refused) or CANCELLED (still "
       "running when the grace period ended)"},
  };
  return *kText;
}

RssAnalysis AnalyzeRss(const std::vector<ProcSample>& samples, double total_s,
                       bool enforced) {
  RssAnalysis a;
  if (samples.empty()) {
    a.verdict = "not enough samples";
    return a;
  }
  a.middle = samples.front();
  for (const ProcSample& s : samples) {
    if (std::fabs(s.t - total_s / 2) < std::fabs(a.middle.t - total_s / 2)) {
      a.middle = s;
    }
  }
  std::vector<double> mid_third, last_third;
  for (const ProcSample& s : samples) {
    if (s.rss_kb < 0) continue;
    if (s.t >= total_s / 3 && s.t < 2 * total_s / 3) {
      mid_third.push_back(s.rss_kb);
    }
    if (s.t >= 2 * total_s / 3) last_third.push_back(s.rss_kb);
  }
  double next = 0;
  for (const ProcSample& s : samples) {
    if (s.t + 1e-9 < next || s.rss_kb < 0) continue;
    a.series.push_back(absl::StrFormat("%.0fs %.0f", s.t, s.rss_kb / 1024.0));
    next = s.t + total_s / 20;
  }
  if (mid_third.empty() || last_third.empty()) {
    a.verdict = "not enough samples";
    return a;
  }
  a.enough = true;
  const double mid_median = Median(mid_third), last_median = Median(last_third);
  const double mid_peak = *std::max_element(mid_third.begin(), mid_third.end());
  const double last_peak =
      *std::max_element(last_third.begin(), last_third.end());
  a.flat = last_median <= mid_median * 1.10 + 32 * 1024 &&
           last_peak <= mid_peak * 1.25 + 64 * 1024;
  a.verdict = absl::StrFormat(
      "median of the last third %.1f MiB vs the middle third %.1f MiB "
      "(limit %.1f); peaks %.1f vs %.1f MiB (limit %.1f): %s",
      last_median / 1024, mid_median / 1024,
      (mid_median * 1.10 + 32 * 1024) / 1024, last_peak / 1024, mid_peak / 1024,
      (mid_peak * 1.25 + 64 * 1024) / 1024, a.flat ? "flat" : "GROWING");
  if (!enforced) {
    absl::StrAppend(&a.verdict, " (not enforced: runs under 3 minutes)");
  }
  return a;
}

namespace {

// How the run was made.
std::string ReportHeader(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
  out("# opserver soak and faults\n\n");
  out(absl::StrCat("- command: `", r.command, "`\n"));
  out(absl::StrCat("- server: `", absl::StrJoin(r.server_argv, " "), "`\n"));
  out(absl::StrCat("- seed ", r.seed, "; ", r.clients, " clients for ",
                   absl::FormatDuration(r.duration), " (ran ",
                   absl::FormatDuration(absl::Trunc(r.ran, absl::Seconds(1))),
                   "); a child process killed every ",
                   absl::FormatDuration(r.kill_interval), "\n"));
  out(absl::StrCat("- machine: ", std::thread::hardware_concurrency(),
                   " hardware threads; load average before ", r.load_before,
                   ", at the end of the load ", r.load_during, "\n"));
  out(absl::StrCat(
      "- mode: ", r.secure ? "secure" : "plain",
      r.secure ? " (TLS with a CA made for the run, bearer tokens; tenants "
                 "alice and bob do the work, mallory is hostile)"
               : " (no TLS, no tokens; the data path is on)",
      "; ", r.clients - r.library_clients - r.hostile_clients,
      " raw-RPC clients, ", r.library_clients, " client-library clients, ",
      r.hostile_clients,
      r.secure ? " hostile-tenant clients\n" : " data-port flooders\n"));
  out(absl::StrCat("- server log: ", r.log, "\n\n"));
  return report;
}

// The calls by RPC and by code, and what provoked each expected error.
std::string ReportCalls(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
  out(absl::StrFormat(
      "## Calls by RPC\n\n%llu calls in %.0f s (%.0f/s): %llu expected "
      "errors, %llu unexpected.\n\n",
      static_cast<unsigned long long>(r.stats->total_calls()),
      absl::ToDoubleSeconds(r.duration),
      r.stats->total_calls() / std::max(1.0, absl::ToDoubleSeconds(r.duration)),
      static_cast<unsigned long long>(r.stats->expected_errors()),
      static_cast<unsigned long long>(r.stats->unexpected())));
  out("## Results by code\n\n");
  out(r.stats->Report(true));
  out("\n## What provoked each expected error\n\n| category | explanation |\n"
      "|---|---|\n");
  std::set<std::string> seen = r.stats->categories();
  for (const std::string& c : r.shutdown_stats->categories()) seen.insert(c);
  for (const std::string& c : seen) {
    auto it = Explanations().find(c);
    out(absl::StrCat("| ", c, " | ",
                     it == Explanations().end() ? "?" : it->second, " |\n"));
  }
  return report;
}

// The fault children killed, and the transfers by path.
std::string ReportProcessesAndTransfers(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
  if (!r.killer_report.empty()) {
    out(absl::StrCat("\n## Client processes killed with SIGKILL\n\n",
                     r.killer_report));
  }
  out(absl::StrFormat(
      "\n## Transfers\n\nBy the end of the load the server had completed "
      "%llu transfers over the data path (%s MiB) and %llu Upload/Download "
      "calls (%s MiB; a split transfer is several calls).\n",
      static_cast<unsigned long long>(r.load_stats.data_path_transfers()),
      Mib(r.load_stats.data_path_bytes() / 1024),
      static_cast<unsigned long long>(r.load_stats.grpc_transfers()),
      Mib(r.load_stats.grpc_transfer_bytes() / 1024)));
  return report;
}

// The server's memory, threads and fds over the run.
std::string ReportResources(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
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
  row("start (idle)", r.start);
  row("middle", r.rss.middle);
  row("end of load", r.end_of_load);
  if (!r.server_died) row("after the clients ended", r.after_clients);
  out(absl::StrCat("\nRSS: ", r.rss.verdict, ".\n"));
  out(absl::StrCat("\nVmRSS over the load (MiB): ",
                   absl::StrJoin(r.rss.series, ", "), ".\n"));
  out(absl::StrCat("\nServer threads by name at the start: ",
                   FormatNames(r.start.thread_names),
                   "; after the clients "
                   "ended: ",
                   FormatNames(r.after_clients.thread_names), ".\n"));
  return report;
}

// What the server still held after every client ended.
std::string ReportLeaks(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
  out("\n## Leaks after every client ended\n\n");
  if (r.server_died) {
    out("Not checked: the server died.\n");
  } else {
    out(absl::StrCat(
        "First GetServerStats: ", r.first_stats.sessions(), " sessions, ",
        r.first_stats.buffers(), " buffers, ", r.first_stats.buffer_bytes(),
        " bytes (sessions of unattached killed children and abandoning "
        "clients wait for the idle reaper, --idle_timeout_s=",
        r.idle_timeout_s, ").\n"));
    if (r.zero_after_s >= 0) {
      out(absl::StrFormat(
          "Zero sessions, buffers and bytes %.1f s after the clients "
          "ended.\n",
          r.zero_after_s));
    } else {
      out(absl::StrCat("**Still ", r.last_stats.sessions(), " sessions, ",
                       r.last_stats.buffers(), " buffers, ",
                       r.last_stats.buffer_bytes(), " bytes.**\n"));
    }
  }
  return report;
}

// SIGTERM under load.
std::string ReportSigterm(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
  out("\n## SIGTERM under load\n\n");
  out(absl::StrFormat(
      "%d client threads doing valid work, two of them a 64 MiB transfer "
      "paced to take 20 s (a slow writer and a slow reader), %llu calls "
      "before the signal, %llu in all: the server exited with **%s** %.0f "
      "ms after SIGTERM (--shutdown_grace_ms=5000: calls still running "
      "then are cancelled).\n\n",
      r.sigterm_clients, static_cast<unsigned long long>(r.calls_before_term),
      static_cast<unsigned long long>(r.shutdown_stats->total_calls()),
      r.exit_text, r.exit_ms));
  out(absl::StrCat(r.held_text, "\n\n"));
  out(r.shutdown_stats->Report(false));
  return report;
}

// The server log's lines by kind, and the verdict.
std::string ReportLogAndVerdict(const RunSummary& r) {
  std::string report;
  auto out = [&](const std::string& text) { absl::StrAppend(&report, text); };
  out("\n## Server log\n\n| kind | lines |\n|---|---:|\n");
  for (const auto& [kind, count] : r.server_log.kinds) {
    out(absl::StrCat("| ", kind, " | ", count, " |\n"));
  }
  for (const std::string& line : r.server_log.odd_lines)
    out(absl::StrCat("\n    ", line));
  out("\n## Verdict\n\n");
  if (r.failures.empty()) {
    out("PASS: no unexpected outcome, no leak, RSS flat, exit status 0 after "
        "SIGTERM.\n");
  } else {
    out("FAIL:\n\n");
    for (const std::string& f : r.failures) out(absl::StrCat("- ", f, "\n"));
  }
  return report;
}

}  // namespace

std::string FormatReport(const RunSummary& r) {
  return absl::StrCat(ReportHeader(r), ReportCalls(r),
                      ReportProcessesAndTransfers(r), ReportResources(r),
                      ReportLeaks(r), ReportSigterm(r), ReportLogAndVerdict(r));
}

std::string FormatNames(const std::map<std::string, int>& names) {
  std::vector<std::string> parts;
  for (const auto& [name, n] : names)
    parts.push_back(absl::StrCat(name, " ", n));
  return absl::StrJoin(parts, ", ");
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
std::string Mib(int64_t kb) {
  return kb < 0 ? "?" : absl::StrFormat("%.1f", kb / 1024.0);
}

}  // namespace opserver::soak
