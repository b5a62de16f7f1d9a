#ifndef OPSERVER_SERVER_AUTH_H_
#define OPSERVER_SERVER_AUTH_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/rejection_log.h"

namespace opserver {

// Bearer tokens and the tenant each one stands for (--auth_token_file).
class TokenTable {
 public:
  struct Entry {
    std::string tenant;
    std::string token;
  };

  // Parses an --auth_token_file: one "TENANT TOKEN" pair per line, separated
  // by whitespace; '#' starts a comment; blank lines are ignored. Tokens must
  // be unique and at least kMinTokenLength characters. INVALID_ARGUMENT
  // "--auth_token_file: PATH:LINE: reason" for the first bad line; the
  // message never contains a token, since it is logged.
  static absl::StatusOr<TokenTable> Load(const std::string& path);
  static constexpr size_t kMinTokenLength = 16;

  explicit TokenTable(std::vector<Entry> entries)
      : entries_(std::move(entries)) {}

  // The tenant `token` belongs to. Compares against every entry in time that
  // does not depend on where (or whether) the token matches, so response
  // times do not reveal how much of a guess was right.
  std::optional<std::string> Lookup(absl::string_view token) const;

  size_t size() const { return entries_.size(); }

  // What the server should log about the file Load read (one line naming
  // the file, never a token), or empty: the file is readable or writable
  // by group or others.
  const std::string& warning() const { return warning_; }

 private:
  std::vector<Entry> entries_;
  std::string warning_;
};

class TokenBoundCall;

// Which calls need a token, and the tokens. Thread-safe; the table can be
// swapped while calls are checked (SIGHUP reloads the token file).
class Authenticator {
 public:
  // `known_methods`: the "/package.Service/Method" paths the server
  // serves, the only ones the log of refused calls names (RejectionLog).
  Authenticator(TokenTable tokens, bool reflection_without_auth,
                const std::vector<std::string>& known_methods = {});

  // Puts `tokens` in force: later calls are checked against them, and every
  // open call bound to a token (TokenBoundCall) that no longer names the
  // same tenant is cancelled now. Returns how many calls were cancelled.
  size_t SetTokens(TokenTable tokens);

  // The tenant for a call to `path` ("/package.Service/Method") with the
  // `authorization` metadata value (empty when absent), or UNAUTHENTICATED
  // when it may not proceed. grpc.health.v1 never needs a token, server
  // reflection only when reflection_without_auth is false. A call that may
  // proceed without a token yields an empty tenant.
  absl::StatusOr<std::string> Check(absl::string_view path,
                                    absl::string_view authorization) const;

  // The tenant named by an "authorization: Bearer TOKEN" value, if any.
  std::optional<std::string> TenantOf(absl::string_view authorization) const;

  // Logs a call Check refused, rate-limited (RejectionLog).
  void LogRejection(absl::string_view path, absl::string_view reason) const {
    rejections_->Record(path, reason);
  }
  // Logs the refusals not yet summarized (at shutdown).
  void FlushRejections() const { rejections_->Flush(); }

 private:
  friend class TokenBoundCall;
  // Resolves `call`'s identity and, when it is a tenant's, adds `call` to
  // the calls SetTokens checks, atomically with respect to SetTokens: a
  // token revoked before this is refused here, one revoked after cancels
  // the call. The set of open calls is bookkeeping, not configuration,
  // hence const.
  absl::StatusOr<std::string> Bind(TokenBoundCall* call) const;
  void Unbind(TokenBoundCall* call) const;

  const bool reflection_without_auth_;
  const std::unique_ptr<RejectionLog> rejections_;
  // Taken before mu_. SetTokens holds it while it cancels calls, so a
  // bound call cannot be unbound (and its context freed) meanwhile.
  mutable absl::Mutex calls_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::flat_hash_set<TokenBoundCall*> calls_
      ABSL_GUARDED_BY(calls_mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> tokens_ ABSL_GUARDED_BY(mu_);
};

// Ties a long-lived call (a streaming reactor) to the bearer token it was
// let in with, so revoking the token ends the call: a member of the
// reactor, alive from its construction until it is deleted in OnDone.
// While bound, Authenticator::SetTokens cancels the call's context
// (TryCancel: the reactor's OnCancel runs, on a gRPC thread) when a new
// token table no longer maps the token to the same tenant.
class TokenBoundCall {
 public:
  // Resolves the call's identity (as CallerIdentity does) and binds the
  // call when it is a tenant's. `authenticator` may be null (no tokens:
  // nothing can be revoked).
  TokenBoundCall(const Authenticator* authenticator,
                 grpc::ServerContextBase* context);
  ~TokenBoundCall();
  TokenBoundCall(const TokenBoundCall&) = delete;
  TokenBoundCall& operator=(const TokenBoundCall&) = delete;

  // The identity whose sessions the call may name, or why it may name none
  // (UNAUTHENTICATED); fixed for the call's life.
  const absl::StatusOr<std::string>& caller() const { return caller_; }

  // True once SetTokens has cancelled the call. The cancellation reaches
  // the reactor later (OnCancel, on a gRPC thread); what must stop at once
  // (a data-path ticket presented meanwhile) checks this.
  bool revoked() const { return revoked_.load(std::memory_order_acquire); }

 private:
  friend class Authenticator;

  const Authenticator* const authenticator_;
  grpc::ServerContextBase* const context_;
  // The call's one authorization value and the identity it gave, for
  // SetTokens (caller_ is not yet constructed when the call is bound).
  std::string authorization_;
  std::string identity_;
  bool bound_ = false;
  std::atomic<bool> revoked_{false};
  absl::StatusOr<std::string> caller_;
};

// What the server's port needs to be secured (the --tls_* flags).
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  // When set, clients must present a certificate signed by this CA.
  std::string client_ca_file;
  // How often the files are re-read so rotated certificates take effect.
  unsigned int refresh_interval_s = 60;
};

// Server credentials: TLS (mTLS with a client CA) when `tls` has a
// certificate, plaintext otherwise; with `authenticator`, every call goes
// through it first. INVALID_ARGUMENT naming the flag for an unreadable or
// malformed file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls, std::shared_ptr<Authenticator> authenticator);

// Checks that `path` is a readable PEM file; the error names `flag`.
absl::Status CheckPemFile(absl::string_view flag, const std::string& path);

// The identity sessions are owned by: with `authenticator` (tokens
// configured), "tenant:NAME" for the call's bearer token; else
// "cert:SUBJECT" for a verified client certificate; else "anonymous" (shared
// by every such caller, which is what a server without authentication
// means). With tokens it fails closed: UNAUTHENTICATED unless the call
// carries exactly one authorization value naming a token in force now (a
// health or reflection call let in without one, several values, or a token
// revoked since the call was let in). The tenant is looked up per call
// rather than stored in the auth context: gRPC 1.51 hands the metadata
// processor the connection's auth context, shared by every call on the
// connection, so a property set there would leak one call's tenant to the
// next.
absl::StatusOr<std::string> CallerIdentity(
    const grpc::ServerContextBase* context,
    const Authenticator* authenticator);

}  // namespace opserver

#endif  // OPSERVER_SERVER_AUTH_H_
