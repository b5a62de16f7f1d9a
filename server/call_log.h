#ifndef OPSERVER_SERVER_CALL_LOG_H_
#define OPSERVER_SERVER_CALL_LOG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/auth.h"
#include "server/log_limiter.h"

namespace opserver {

// The server's log of failed calls. Each line says who: the method, the
// tenant (of the call's bearer token; "-" without tokens) and the session
// the call named ("-" before it named one):
//   call failed: opserver.v1.Runtime/Malloc tenant=alice session=ab12:
//   INVALID_ARGUMENT (aclnn 161002): ...
// Any client can fail calls as often as it likes, so the lines are
// rate-limited per method and code (LogLimiter): the first kMaxLines per
// kInterval, then a summary of the rest.
//
// A call is known to the log through the interceptor Interceptors() makes
// (it records the method; gRPC's handlers are not told theirs); handlers
// add the session with NoteSession. One per server.
class CallLog {
 public:
  static constexpr size_t kMaxLines = 5;
  static constexpr absl::Duration kInterval = absl::Seconds(10);

  // `authenticator` (null without tokens) names the tenants.
  explicit CallLog(const Authenticator* authenticator);
  CallLog(const Authenticator* authenticator, LogLimiter::Clock clock,
          LogLimiter::Sink sink);

  // The interceptor that registers each call with this log, for
  // ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  MakeInterceptorFactory();

  // Writes the summaries not yet written (at shutdown).
  void Flush() { limiter_.Flush(); }

  // The session `context`'s call names (a client's string: kept cut to
  // kMaxSessionBytes). A call the log does not know is left alone.
  static void NoteSession(const grpc::ServerContextBase* context,
                          absl::string_view session);
  static constexpr size_t kMaxSessionBytes = 64;

  // Logs the failure of `context`'s call (ToGrpcStatus's line) through its
  // server's CallLog; an unknown call (no interceptor, as in unit tests of
  // handlers) gets the line without rate limit or names. Not logged: a
  // call the client has cancelled (it went away or gave up; nobody hears
  // the status).
  static void LogFailure(grpc::ServerContextBase* context,
                         const absl::Status& status, int32_t aclnn,
                         absl::string_view message);

  // Routes gRPC core's own log lines (gpr_log: handshake failures and the
  // like, as many as peers cause) through one process-wide LogLimiter,
  // per source line. Idempotent.
  static void RouteGrpcCoreLog();
  // Writes the core lines' summaries not yet written.
  static void FlushGrpcCoreLog();

 private:
  class Interceptor;
  class InterceptorFactory;

  std::string TenantOf(const grpc::ServerContextBase& context) const;

  const Authenticator* const authenticator_;
  LogLimiter limiter_;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_CALL_LOG_H_
