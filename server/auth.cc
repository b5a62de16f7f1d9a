#include "server/auth.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "grpc/grpc.h"
#include "grpc/grpc_security.h"
#include "grpc/slice.h"
#include "runtime/log.h"

namespace opserver {
namespace {

constexpr absl::string_view kBearer = "Bearer ";
constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
// v1alpha and v1: reflection clients try both.
constexpr absl::string_view kReflectionPrefix = "/grpc.reflection.";
constexpr char kSeveralAuthorizations[] =
    "more than one authorization header: send one 'authorization: Bearer "
    "TOKEN'";

// Equality of `guess` and `secret` in time that depends only on
// secret.size(): every byte of the secret is looked at, whatever matches.
bool ConstantTimeEquals(absl::string_view guess, absl::string_view secret) {
  if (guess.empty()) return false;
  uint64_t diff = guess.size() ^ secret.size();
  for (size_t i = 0; i < secret.size(); ++i) {
    diff |= static_cast<uint8_t>(secret[i]) ^
            static_cast<uint8_t>(guess[i % guess.size()]);
  }
  return diff == 0;
}

bool IsTenantName(absl::string_view name) {
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
      return false;
    }
  }
  return !name.empty();
}

absl::StatusOr<std::string> ReadFile(absl::string_view flag,
                                     const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::string_view SliceView(const grpc_slice& slice) {
  return absl::string_view(
      reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
      GRPC_SLICE_LENGTH(slice));
}

// gRPC core's metadata processor hook, wrapping an Authenticator. The core
// API is used because grpc::InsecureServerCredentials() refuses processors
// (it asserts), and plaintext loopback servers need authentication too.
void ProcessAuthMetadata(void* state, grpc_auth_context* /*context*/,
                         const grpc_metadata* md, size_t num_md,
                         grpc_process_auth_metadata_done_cb done,
                         void* user_data) {
  const auto* authenticator =
      static_cast<std::shared_ptr<Authenticator>*>(state)->get();
  absl::string_view path;
  absl::string_view authorization;
  int authorizations = 0;
  for (size_t i = 0; i < num_md; ++i) {
    absl::string_view key = SliceView(md[i].key);
    if (key == ":path") {
      path = SliceView(md[i].value);
    } else if (key == "authorization") {
      authorization = SliceView(md[i].value);
      ++authorizations;
    }
  }
  // Handlers read the token from the call's metadata again
  // (CallerIdentity): with several values, which one each side took would
  // decide the identity, so such a call is refused here outright.
  absl::StatusOr<std::string> tenant =
      authorizations > 1 ? absl::UnauthenticatedError(kSeveralAuthorizations)
                         : authenticator->Check(path, authorization);
  if (!tenant.ok()) {
    // Never the metadata, which holds the (wrong) secret; the path only
    // when it is one the server serves.
    authenticator->LogRejection(path, tenant.status().message());
    std::string message(tenant.status().message());
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         message.c_str());
    return;
  }
  // The token stays in the call's metadata: handlers resolve the tenant
  // from it (CallerIdentity). The auth context here is the connection's,
  // shared by all its calls, so nothing per call may be written to it.
  done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
}

void DestroyAuthState(void* state) {
  delete static_cast<std::shared_ptr<Authenticator>*>(state);
}

// grpc::ServerCredentials over credentials made with gRPC core's API, which
// is what lets a metadata processor sit on plaintext and TLS ports alike.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  CoreServerCredentials() = default;  // The base initializes gRPC first.
  ~CoreServerCredentials() override {
    if (creds_ != nullptr) grpc_server_credentials_release(creds_);
  }
  void Adopt(grpc_server_credentials* creds) { creds_ = creds; }
  grpc_server_credentials* get() { return creds_; }

  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/)
      override {
    // The processor is installed through the core API (MakeServerCredentials);
    // silently dropping a second one would disable a security check.
    std::abort();
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* creds_ = nullptr;
};

}  // namespace

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  constexpr absl::string_view kFlag = "--auth_token_file";
  // A file that cannot be stat'ed cannot be read either: ReadFile says so.
  struct stat info;
  const bool stated = stat(path.c_str(), &info) == 0;
  if (stated && S_ISDIR(info.st_mode)) {
    // Read as a file it would look empty ("no 'TENANT TOKEN' lines").
    return absl::InvalidArgumentError(absl::StrCat(
        kFlag, ": ", path, " is a directory, not a file of tokens"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(kFlag, path));
  std::vector<Entry> entries;
  absl::flat_hash_map<std::string, int> line_of_token;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFlag, ": ", path, ":", line_number, ": ", why));
    };
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r\f\v"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 2) {
      return bad(
          absl::StrCat("want 'TENANT TOKEN', got ", fields.size(), " fields"));
    }
    if (!IsTenantName(fields[0])) {
      return bad("the tenant name may only use letters, digits, '.', '-', '_'");
    }
    if (fields[1].size() < kMinTokenLength) {
      return bad(absl::StrCat("the token is shorter than ", kMinTokenLength,
                              " characters"));
    }
    auto [it, inserted] =
        line_of_token.emplace(std::string(fields[1]), line_number);
    if (!inserted) {
      return bad(
          absl::StrCat("the token is already used on line ", it->second));
    }
    entries.push_back(Entry{std::string(fields[0]), std::string(fields[1])});
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFlag, ": ", path, ": no 'TENANT TOKEN' lines"));
  }
  TokenTable table(std::move(entries));
  if (stated && (info.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    table.warning_ = absl::StrCat(
        "warning: ", kFlag, ": ", path,
        " is readable or writable by group or others (mode ",
        absl::StrFormat("%04o", info.st_mode & 07777),
        "): whoever can read it holds every tenant's token; chmod 600 it");
  }
  return table;
}

std::optional<std::string> TokenTable::Lookup(absl::string_view token) const {
  // No early exit: every entry is compared whatever matched.
  const Entry* found = nullptr;
  for (const Entry& entry : entries_) {
    if (ConstantTimeEquals(token, entry.token)) found = &entry;
  }
  if (found == nullptr) return std::nullopt;
  return found->tenant;
}

Authenticator::Authenticator(TokenTable tokens, bool reflection_without_auth,
                             const std::vector<std::string>& known_methods)
    : reflection_without_auth_(reflection_without_auth),
      rejections_(std::make_unique<RejectionLog>(known_methods)),
      tokens_(std::make_shared<const TokenTable>(std::move(tokens))) {}

size_t Authenticator::SetTokens(TokenTable tokens) {
  auto table = std::make_shared<const TokenTable>(std::move(tokens));
  // Held across the swap and the scan, so a call binding meanwhile is
  // checked against the new table (Bind) and none slips between the two.
  absl::MutexLock calls_lock(&calls_mu_);
  {
    absl::MutexLock lock(&mu_);
    tokens_ = table;
  }
  // Every call of a revoked token is marked before any is cancelled: one
  // call's end may end another's session (an Attach), and a call that
  // hears of that must already know its token went, so that it ends as
  // revoked, not as closed (a Pipeline: NOT_FOUND).
  std::vector<TokenBoundCall*> revoked;
  for (TokenBoundCall* call : calls_) {
    if (call->revoked()) continue;
    std::optional<std::string> tenant = TenantOf(call->authorization_);
    if (tenant.has_value() &&
        absl::StrCat("tenant:", *tenant) == call->identity_) {
      continue;
    }
    call->revoked_.store(true, std::memory_order_release);
    revoked.push_back(call);
  }
  // The context lives until the reactor's OnDone, which unbinds the call
  // under calls_mu_ first. TryCancel runs no reaction inline (the
  // reactors' OnCancel runs on gRPC's threads), and no reaction takes
  // calls_mu_ anyway.
  for (TokenBoundCall* call : revoked) call->context_->TryCancel();
  return revoked.size();
}

absl::StatusOr<std::string> Authenticator::Bind(TokenBoundCall* call) const {
  absl::MutexLock calls_lock(&calls_mu_);
  absl::StatusOr<std::string> caller = CallerIdentity(call->context_, this);
  if (!caller.ok()) return caller;
  // CallerIdentity succeeded, so there is exactly one value.
  auto found = call->context_->client_metadata().find("authorization");
  call->authorization_.assign(found->second.data(), found->second.size());
  call->identity_ = *caller;
  calls_.insert(call);
  call->bound_ = true;
  return caller;
}

void Authenticator::Unbind(TokenBoundCall* call) const {
  absl::MutexLock calls_lock(&calls_mu_);
  calls_.erase(call);
}

TokenBoundCall::TokenBoundCall(const Authenticator* authenticator,
                               grpc::ServerContextBase* context)
    : authenticator_(authenticator),
      context_(context),
      caller_(authenticator == nullptr ? CallerIdentity(context, nullptr)
                                       : authenticator->Bind(this)) {}

TokenBoundCall::~TokenBoundCall() {
  if (bound_) authenticator_->Unbind(this);
}

absl::StatusOr<std::string> Authenticator::Check(
    absl::string_view path, absl::string_view authorization) const {
  if (absl::StartsWith(path, kHealthPrefix) ||
      (reflection_without_auth_ && absl::StartsWith(path, kReflectionPrefix))) {
    return std::string();
  }
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing 'authorization: Bearer TOKEN' metadata");
  }
  if (!absl::StartsWith(authorization, kBearer)) {
    return absl::UnauthenticatedError(
        "the authorization metadata must be 'Bearer TOKEN'");
  }
  std::optional<std::string> tenant = TenantOf(authorization);
  if (!tenant.has_value()) {
    return absl::UnauthenticatedError("unknown bearer token");
  }
  return *std::move(tenant);
}

std::optional<std::string> Authenticator::TenantOf(
    absl::string_view authorization) const {
  if (!absl::ConsumePrefix(&authorization, kBearer)) return std::nullopt;
  std::shared_ptr<const TokenTable> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  return tokens->Lookup(authorization);
}

absl::Status CheckPemFile(absl::string_view flag, const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(flag, path));
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls, std::shared_ptr<Authenticator> authenticator) {
  auto credentials = std::make_shared<CoreServerCredentials>();
  if (tls.cert_file.empty()) {
    credentials->Adopt(grpc_insecure_server_credentials_create());
  } else {
    for (const auto& [flag, path] :
         {std::pair<absl::string_view, const std::string&>{"--tls_cert_file",
                                                           tls.cert_file},
          {"--tls_key_file", tls.key_file}}) {
      RETURN_IF_ERROR(CheckPemFile(flag, path));
    }
    const bool mtls = !tls.client_ca_file.empty();
    if (mtls) {
      RETURN_IF_ERROR(CheckPemFile("--tls_client_ca_file", tls.client_ca_file));
    }
    // The provider re-reads the files every refresh interval, so rotated
    // certificates take effect without a restart.
    grpc_tls_certificate_provider* provider =
        grpc_tls_certificate_provider_file_watcher_create(
            tls.key_file.c_str(), tls.cert_file.c_str(),
            mtls ? tls.client_ca_file.c_str() : nullptr,
            tls.refresh_interval_s);
    grpc_tls_credentials_options* options =
        grpc_tls_credentials_options_create();
    grpc_tls_credentials_options_set_certificate_provider(options, provider);
    grpc_tls_certificate_provider_release(provider);  // options hold a ref
    grpc_tls_credentials_options_watch_identity_key_cert_pairs(options);
    if (mtls) {
      grpc_tls_credentials_options_watch_root_certs(options);
      grpc_tls_credentials_options_set_cert_request_type(
          options, GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      grpc_tls_credentials_options_set_cert_request_type(
          options, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    credentials->Adopt(grpc_tls_server_credentials_create(options));
  }
  if (credentials->get() == nullptr) {
    return absl::InvalidArgumentError(
        "--tls_cert_file: gRPC could not create TLS credentials");
  }
  if (authenticator != nullptr) {
    grpc_auth_metadata_processor processor;
    processor.process = ProcessAuthMetadata;
    processor.destroy = DestroyAuthState;
    processor.state =
        new std::shared_ptr<Authenticator>(std::move(authenticator));
    grpc_server_credentials_set_auth_metadata_processor(credentials->get(),
                                                        processor);
  }
  return std::shared_ptr<grpc::ServerCredentials>(std::move(credentials));
}

absl::StatusOr<std::string> CallerIdentity(
    const grpc::ServerContextBase* context,
    const Authenticator* authenticator) {
  if (authenticator != nullptr) {
    // The tenant is resolved again rather than trusted from the processor:
    // the token may have been revoked since. Every way of not having
    // exactly one known token fails, so no call ever acts as a fallback
    // identity that several callers would share.
    const auto& metadata = context->client_metadata();
    auto [first, last] = metadata.equal_range("authorization");
    if (first == last) {
      return absl::UnauthenticatedError(
          "missing 'authorization: Bearer TOKEN' metadata");
    }
    if (std::next(first) != last) {
      return absl::UnauthenticatedError(kSeveralAuthorizations);
    }
    std::optional<std::string> tenant = authenticator->TenantOf(
        absl::string_view(first->second.data(), first->second.size()));
    if (!tenant.has_value()) {
      return absl::UnauthenticatedError(
          "unknown bearer token (revoked while the call started?)");
    }
    return absl::StrCat("tenant:", *tenant);
  }
  std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  if (auth != nullptr) {
    std::vector<grpc::string_ref> subject =
        auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
    if (!subject.empty()) {
      return absl::StrCat(
          "cert:", absl::string_view(subject[0].data(), subject[0].size()));
    }
  }
  return std::string("anonymous");
}

}  // namespace opserver
