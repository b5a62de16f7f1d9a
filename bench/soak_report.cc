#include "bench/soak_report.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/aclnn_status.h"

namespace opserver::soak {
namespace {
constexpr char kAclnnKey[] = "opserver-aclnn-status";
}  // namespace

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
  auto it = trailers.find(kAclnnKey);
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

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
std::string Mib(int64_t kb) {
  return kb < 0 ? "?" : absl::StrFormat("%.1f", kb / 1024.0);
}

}  // namespace opserver::soak
