#include "server/call_log.h"

#include <array>
#include <functional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/support/log.h"
#include "runtime/log.h"

namespace opserver {
namespace {

// What the log knows of a call in progress.
struct Note {
  const void* owner;  // The interceptor that registered it.
  CallLog* log;
  // gRPC's name of a registered method, which lives as long as the server:
  // no copy per call.
  absl::string_view method;
  std::string session;
};

// The calls in progress, by their context: gRPC gives handlers no way to
// carry data of their own on a context, and ToGrpcStatus sees only the
// context. Sharded, since every call goes through it twice.
class Registry {
 public:
  void Add(const grpc::ServerContextBase* context, Note note) {
    Shard& shard = ShardOf(context);
    absl::MutexLock lock(&shard.mu);
    // A context's address may be reused by a later call before the earlier
    // call's interceptor is gone: the newer call wins.
    shard.notes.insert_or_assign(context, std::move(note));
  }

  void Remove(const grpc::ServerContextBase* context, const void* owner) {
    Shard& shard = ShardOf(context);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.notes.find(context);
    if (it != shard.notes.end() && it->second.owner == owner) {
      shard.notes.erase(it);
    }
  }

  void SetSession(const grpc::ServerContextBase* context,
                  absl::string_view session) {
    Shard& shard = ShardOf(context);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.notes.find(context);
    if (it != shard.notes.end()) {
      it->second.session = Truncated(session, CallLog::kMaxSessionBytes);
    }
  }

  // A copy of `context`'s note, if it has one.
  bool Find(const grpc::ServerContextBase* context, Note* note) {
    Shard& shard = ShardOf(context);
    absl::MutexLock lock(&shard.mu);
    auto it = shard.notes.find(context);
    if (it == shard.notes.end()) return false;
    *note = it->second;
    return true;
  }

 private:
  struct Shard {
    absl::Mutex mu;
    absl::flat_hash_map<const grpc::ServerContextBase*, Note> notes
        ABSL_GUARDED_BY(mu);
  };

  Shard& ShardOf(const grpc::ServerContextBase* context) {
    return shards_[std::hash<const void*>()(context) % shards_.size()];
  }

  std::array<Shard, 16> shards_;
};

Registry& Calls() {
  static auto* registry = new Registry;
  return *registry;
}

// gRPC core's lines: peers cause them (every failed handshake), so they go
// through a limiter too, per source line.
LogLimiter& CoreLimiter() {
  static auto* limiter = new LogLimiter(CallLog::kMaxLines, CallLog::kInterval,
                                        absl::Now, LogLine);
  return *limiter;
}

void CoreLog(gpr_log_func_args* args) {
  absl::string_view file(args->file == nullptr ? "" : args->file);
  const size_t slash = file.rfind('/');
  if (slash != absl::string_view::npos) file.remove_prefix(slash + 1);
  const std::string where = absl::StrCat(file, ":", args->line);
  CoreLimiter().Log(
      absl::StrCat("grpc ", where),
      absl::StrCat("grpc ", gpr_log_severity_string(args->severity), " ", where,
                   ": ", args->message == nullptr ? "" : args->message));
}

}  // namespace

class CallLog::Interceptor final : public grpc::experimental::Interceptor {
 public:
  Interceptor(CallLog* log, grpc::experimental::ServerRpcInfo* info)
      : context_(info->server_context()) {
    absl::string_view method(info->method() == nullptr ? "" : info->method());
    absl::ConsumePrefix(&method, "/");
    Calls().Add(context_, Note{this, log, method, "-"});
  }
  ~Interceptor() override { Calls().Remove(context_, this); }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  const grpc::ServerContextBase* const context_;
};

class CallLog::InterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InterceptorFactory(CallLog* log) : log_(log) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Interceptor(log_, info);
  }

 private:
  CallLog* const log_;
};

CallLog::CallLog(const Authenticator* authenticator)
    : CallLog(authenticator, absl::Now, LogLine) {}

CallLog::CallLog(const Authenticator* authenticator, LogLimiter::Clock clock,
                 LogLimiter::Sink sink)
    : authenticator_(authenticator),
      limiter_(kMaxLines, kInterval, std::move(clock), std::move(sink)) {}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallLog::MakeInterceptorFactory() {
  return std::make_unique<InterceptorFactory>(this);
}

void CallLog::NoteSession(const grpc::ServerContextBase* context,
                          absl::string_view session) {
  if (context != nullptr) Calls().SetSession(context, session);
}

std::string CallLog::TenantOf(const grpc::ServerContextBase& context) const {
  if (authenticator_ == nullptr) return "-";
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "-";
  std::optional<std::string> tenant = authenticator_->TenantOf(
      absl::string_view(it->second.data(), it->second.size()));
  return tenant.has_value() ? *std::move(tenant) : "-";
}

void CallLog::LogFailure(grpc::ServerContextBase* context,
                         const absl::Status& status, int32_t aclnn,
                         absl::string_view message) {
  const std::string code = absl::StatusCodeToString(status.code());
  const std::string what =
      absl::StrCat(code, " (aclnn ", aclnn, "): ", message);
  Note note;
  if (context == nullptr || !Calls().Find(context, &note)) {
    LogLine(absl::StrCat("call failed: ", what));
    return;
  }
  // The client cancelled the call (it exited, or gave up waiting): not a
  // failure anyone will read about.
  if (context->IsCancelled()) return;
  note.log->limiter_.Log(absl::StrCat(note.method, " ", code),
                         absl::StrCat("call failed: ", note.method,
                                      " tenant=", note.log->TenantOf(*context),
                                      " session=", note.session, ": ", what));
}

void CallLog::RouteGrpcCoreLog() { gpr_set_log_function(CoreLog); }

void CallLog::FlushGrpcCoreLog() { CoreLimiter().Flush(); }

}  // namespace opserver
