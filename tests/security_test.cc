// A server put on a network: TLS and mTLS handshakes with certificates made
// at test time, bearer tokens on every service (health excepted) through the
// C++ client, raw gRPC and the C API, sessions invisible to other
// identities, per-tenant limits, and the refusal to listen insecurely.

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "client/client.h"
#include "common/data_path.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace {

using remote::Client;
using remote::ConnectOptions;
using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }
std::string CertDir() { return TmpDir() + "/certs"; }
std::string Cert(const std::string& name) {
  return CertDir() + "/" + name + ".pem";
}
std::string Key(const std::string& name) {
  return CertDir() + "/" + name + ".key";
}

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = TmpDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A CA, a server certificate for 127.0.0.1/localhost, client
    // certificates, and an unrelated CA with a client of its own.
    std::string command = "tests/gen_certs.sh " + CertDir();
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }

  static std::string TokenFile() {
    return WriteFile("tokens",
                     absl::StrCat("# test tenants\nalice ", kAliceToken,
                                  "\n\nbob ", kBobToken, "\n"));
  }

  void Start(Options options) {
    options.listen = "127.0.0.1:0";
    options.threads = 1;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  void StartWithTokens() {
    Options options;
    options.auth_token_file = TokenFile();
    Start(options);
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(ConnectOptions options) {
    options.connect_timeout = absl::Seconds(2);
    return Client::Connect(server_->address(), options);
  }

  std::unique_ptr<Client> MustConnect(ConnectOptions options) {
    auto client = Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static ConnectOptions WithToken(const std::string& token) {
    ConnectOptions options;
    options.token = token;
    return options;
  }

  std::unique_ptr<Server> server_;
};

// A unary call of `method` with `request` and every value of `authorizations`
// as its own "authorization" header, in order; `response` (if any) gets the
// reply.
grpc::Status CallWithHeaders(grpc::Channel* channel, const std::string& method,
                             const google::protobuf::Message& request,
                             const std::vector<std::string>& authorizations,
                             google::protobuf::Message* response) {
  grpc::GenericStub stub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  for (const std::string& value : authorizations) {
    context.AddMetadata("authorization", value);
  }
  std::string bytes = request.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer wire(&slice, 1);
  grpc::ByteBuffer reply;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&context, method, wire, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&reply, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  if (status.ok() && response != nullptr) {
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(reply.Dump(&slices).ok());
    std::string text;
    for (const grpc::Slice& s : slices) {
      text.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    EXPECT_TRUE(response->ParseFromString(text));
  }
  return status;
}

// Calls `method` ("/pkg.Service/Method") with an empty message; for a
// streaming method that is one message and a half-close, which is all the
// authentication check (it runs on the headers) needs.
grpc::Status RawCall(grpc::Channel* channel, const std::string& method,
                     const std::string& authorization) {
  std::vector<std::string> authorizations;
  if (!authorization.empty()) authorizations.push_back(authorization);
  return CallWithHeaders(channel, method, v1::GetDeviceInfoRequest(),
                         authorizations, nullptr);
}

std::vector<std::string> AllOpserverMethods() {
  std::vector<std::string> methods;
  for (const char* service : {"opserver.v1.Runtime", "opserver.v1.Operators"}) {
    const google::protobuf::ServiceDescriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            service);
    EXPECT_NE(descriptor, nullptr) << service;
    if (descriptor == nullptr) continue;
    for (int i = 0; i < descriptor->method_count(); ++i) {
      methods.push_back(
          absl::StrCat("/", service, "/", descriptor->method(i)->name()));
    }
  }
  return methods;
}

TEST_F(SecurityTest, EveryServiceButHealthRejectsAMissingOrWrongToken) {
  StartWithTokens();
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  std::vector<std::string> methods = AllOpserverMethods();
  ASSERT_GE(methods.size(), 20u);
  methods.push_back(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo");
  for (const std::string& method : methods) {
    grpc::Status missing = RawCall(channel.get(), method, "");
    EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method;
    EXPECT_THAT(missing.error_message(), HasSubstr("authorization: Bearer"));
    grpc::Status wrong =
        RawCall(channel.get(), method, "Bearer not-a-token-0123456789abcdef");
    EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
    grpc::Status not_bearer = RawCall(channel.get(), method, kAliceToken);
    EXPECT_EQ(not_bearer.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method;
    // The right token gets past authentication (the empty request may still
    // be rejected by the method itself).
    grpc::Status right =
        RawCall(channel.get(), method, absl::StrCat("Bearer ", kAliceToken));
    EXPECT_NE(right.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << right.error_message();
  }
  EXPECT_TRUE(RawCall(channel.get(), "/grpc.health.v1.Health/Check", "").ok());
}

TEST_F(SecurityTest, ReflectionWithoutAuthOpensOnlyReflection) {
  Options options;
  options.auth_token_file = TokenFile();
  options.reflection_without_auth = true;
  Start(options);
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  EXPECT_TRUE(RawCall(channel.get(),
                      "/grpc.reflection.v1alpha.ServerReflection/"
                      "ServerReflectionInfo",
                      "")
                  .ok());
  EXPECT_EQ(RawCall(channel.get(), "/opserver.v1.Runtime/GetDeviceInfo", "")
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecurityTest, ClientWithTheRightTokenWorksWithoutOneOnlyHealth) {
  StartWithTokens();
  auto alice = MustConnect(WithToken(kAliceToken));
  ASSERT_NE(alice, nullptr);
  ASSERT_TRUE(alice->GetDeviceInfo().ok());
  auto session = alice->CreateSession("alice-job");
  ASSERT_TRUE(session.ok()) << session.status();
  auto buffer = (*session)->Malloc(16);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  float in[4] = {1, 2, 3, 4}, out[4] = {};
  ASSERT_TRUE((*session)->Upload(buffer->handle(), 0, in, 16).ok());
  ASSERT_TRUE((*session)->Download(buffer->handle(), 0, out, 16).ok());
  EXPECT_EQ(out[3], 4);

  auto anonymous = MustConnect(ConnectOptions());
  ASSERT_NE(anonymous, nullptr);
  EXPECT_EQ(*anonymous->CheckHealth(), "SERVING");
  absl::Status info = anonymous->GetDeviceInfo().status();
  EXPECT_EQ(info.code(), absl::StatusCode::kUnauthenticated) << info;
  EXPECT_EQ(anonymous->CreateSession("nobody").status().code(),
            absl::StatusCode::kUnauthenticated);
  auto wrong = MustConnect(WithToken("guessed-token-0123456789abcdef"));
  ASSERT_NE(wrong, nullptr);
  EXPECT_EQ(wrong->ListOperators().status().code(),
            absl::StatusCode::kUnauthenticated);
}

// What another identity sees of a session: exactly what it would see of a
// session that never existed.
void ExpectForeignLooksUnknown(Client& owner, Client& other,
                               const std::string& session) {
  const std::string never = "00000000000000000000000000000000";
  auto stats = [](Client& client, const std::string& id) {
    grpc::ClientContext context;
    client.SetDeadline(&context);
    v1::GetSessionStatsRequest request;
    request.set_session(id);
    v1::SessionStats response;
    return client.runtime().GetSessionStats(&context, request, &response);
  };
  auto close = [](Client& client, const std::string& id) {
    grpc::ClientContext context;
    client.SetDeadline(&context);
    v1::CloseSessionRequest request;
    request.set_session(id);
    v1::CloseSessionResponse response;
    return client.runtime().CloseSession(&context, request, &response);
  };
  auto malloc = [](Client& client, const std::string& id) {
    grpc::ClientContext context;
    client.SetDeadline(&context);
    v1::MallocRequest request;
    request.set_session(id);
    request.set_size(16);
    v1::MallocResponse response;
    return client.runtime().Malloc(&context, request, &response);
  };
  for (auto call : {+stats, +close, +malloc}) {
    grpc::Status foreign = call(other, session);
    grpc::Status unknown = call(owner, never);
    EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_EQ(foreign.error_message(),
              absl::StrReplaceAll(unknown.error_message(), {{never, session}}));
  }
  // The owner still has it: the foreign CloseSession did nothing.
  EXPECT_TRUE(stats(owner, session).ok());
}

TEST_F(SecurityTest, ASessionIsNotFoundForAnotherTenant) {
  StartWithTokens();
  auto alice = MustConnect(WithToken(kAliceToken));
  auto bob = MustConnect(WithToken(kBobToken));
  ASSERT_TRUE(alice && bob);
  auto session = alice->CreateSession("alice-job", /*attach=*/false);
  ASSERT_TRUE(session.ok());
  ExpectForeignLooksUnknown(*alice, *bob, (*session)->token());
}

TEST_F(SecurityTest, PerTenantSessionAndMemoryLimits) {
  Options options;
  options.auth_token_file = TokenFile();
  options.session_limits.max_sessions_per_tenant = 2;
  options.session_limits.tenant_memory_bytes = 1 << 20;
  Start(options);
  auto alice = MustConnect(WithToken(kAliceToken));
  auto bob = MustConnect(WithToken(kBobToken));
  ASSERT_TRUE(alice && bob);
  auto a1 = alice->CreateSession("a1");
  auto a2 = alice->CreateSession("a2");
  ASSERT_TRUE(a1.ok() && a2.ok());
  absl::Status third = alice->CreateSession("a3").status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.message(), HasSubstr("--max_sessions_per_tenant"));
  auto b1 = bob->CreateSession("b1");
  ASSERT_TRUE(b1.ok()) << b1.status();

  // The memory budget spans alice's sessions, and bob has his own.
  auto big = (*a1)->Malloc(768 << 10);
  ASSERT_TRUE(big.ok()) << big.status();
  absl::Status over = (*a2)->Malloc(512 << 10).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("--tenant_memory_bytes"));
  EXPECT_TRUE((*b1)->Malloc(768 << 10).ok());
  ASSERT_TRUE(big->Free().ok());
  // The free is queued on a1's command channel; calls of a1 are ordered
  // after it, a2's are not: deliver it before a2 counts on the memory.
  ASSERT_TRUE((*a1)->Flush().ok());
  EXPECT_TRUE((*a2)->Malloc(512 << 10).ok());

  // A closed session gives its slot and its memory back.
  ASSERT_TRUE((*a1)->Close().ok());
  EXPECT_TRUE(alice->CreateSession("a3").ok());
  ASSERT_TRUE((*a2)->Close().ok());
  auto a4 = alice->CreateSession("a4");
  ASSERT_TRUE(a4.ok()) << a4.status();
  EXPECT_TRUE((*a4)->Malloc(1 << 20).ok());
}

TEST_F(SecurityTest, TlsHandshakeNeedsTheRightCa) {
  Options options;
  options.tls_cert_file = Cert("server");
  options.tls_key_file = Key("server");
  options.auth_token_file = TokenFile();
  Start(options);
  ConnectOptions good = WithToken(kAliceToken);
  good.tls_ca_file = Cert("ca");
  auto client = MustConnect(good);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->GetDeviceInfo().ok());
  EXPECT_TRUE(client->CreateSession("over-tls").ok());

  ConnectOptions wrong_ca = good;
  wrong_ca.tls_ca_file = Cert("other_ca");
  absl::Status status = Connect(wrong_ca).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("the TLS handshake failed"));
  EXPECT_THAT(status.message(), HasSubstr("over TLS"));
  // Plaintext against a TLS port never connects either, and says what to
  // do (the first-hour review, problem 4).
  absl::Status plaintext = Connect(WithToken(kAliceToken)).status();
  EXPECT_EQ(plaintext.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(plaintext.message(),
              HasSubstr("cannot reach opserver at " + server_->address()));
  EXPECT_THAT(plaintext.message(), HasSubstr("is it a TLS server?"));
}

TEST_F(SecurityTest, RotatedCertificatesTakeEffectWithoutRestart) {
  // The server's files start as copies of the ca-signed pair; replacing them
  // with the other_ca-signed pair must switch what clients see.
  const std::string cert = TmpDir() + "/rotating.pem";
  const std::string key = TmpDir() + "/rotating.key";
  auto install = [&](const std::string& name) {
    std::string command = absl::StrCat(
        "cp ", Cert(name), " ", cert, ".new && cp ", Key(name), " ", key,
        ".new && mv ", key, ".new ", key, " && mv ", cert, ".new ", cert);
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  };
  install("server");
  Options options;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  options.tls_refresh_interval_s = 1;
  Start(options);
  ConnectOptions trusts_other;
  trusts_other.tls_ca_file = Cert("other_ca");
  trusts_other.connect_timeout = absl::Seconds(1);
  EXPECT_FALSE(Client::Connect(server_->address(), trusts_other).ok());

  install("other_server");
  // Bounded polling, not a timing assertion: the watcher re-reads the files
  // every second; a fresh channel each try gets a new handshake.
  // A failed handshake fails at once, so the tries are spaced out (up to a
  // minute in all).
  bool rotated = false;
  for (int attempt = 0; attempt < 300 && !rotated; ++attempt) {
    rotated = Client::Connect(server_->address(), trusts_other).ok();
    if (!rotated) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(rotated) << "the server still presents the old certificate";
}

// --health_listen: grpc.health.v1 alone, in plaintext and without a token,
// for probes that speak neither (Kubernetes'), while the main port needs
// TLS and a token. It follows the drain and serves nothing else.
TEST_F(SecurityTest, HealthPortAnswersInPlaintextBesideTls) {
  Options options;
  options.tls_cert_file = Cert("server");
  options.tls_key_file = Key("server");
  options.auth_token_file = TokenFile();
  options.health_listen = "127.0.0.1:0";
  Start(options);
  ASSERT_THAT(server_->health_address(), HasSubstr("127.0.0.1:"));
  EXPECT_NE(server_->health_address(), server_->address());
  auto channel = grpc::CreateChannel(server_->health_address(),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto check = [&](const std::string& service) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = health->Check(&context, request, &response);
    return status.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                             response.status())
                       : absl::StrCat("error ", status.error_code(), ": ",
                                      status.error_message());
  };
  EXPECT_EQ(check(""), "SERVING");
  EXPECT_EQ(check(v1::Runtime::service_full_name()), "SERVING");
  EXPECT_EQ(check(v1::Operators::service_full_name()), "SERVING");
  EXPECT_THAT(check("no.such.Service"), HasSubstr("error 5"));  // NOT_FOUND
  // Nothing but health there, with or without a token.
  v1::GetDeviceInfoResponse info;
  EXPECT_EQ(CallWithHeaders(channel.get(), "/opserver.v1.Runtime/GetDeviceInfo",
                            v1::GetDeviceInfoRequest(),
                            {absl::StrCat("Bearer ", kAliceToken)}, &info)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // The main port still wants TLS.
  EXPECT_EQ(Connect(WithToken(kAliceToken)).status().code(),
            absl::StatusCode::kUnavailable);
  server_->BeginDrain();
  EXPECT_EQ(check(""), "NOT_SERVING");
  EXPECT_EQ(check(v1::Runtime::service_full_name()), "NOT_SERVING");
}

// A --health_listen that cannot be parsed or bound stops the start with
// the flag's name.
TEST_F(SecurityTest, HealthPortErrorsNameTheFlag) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 1;
  options.health_listen = "no-port";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--health_listen: "));
  options.health_listen = "192.0.2.1:0";  // Not an address of this host.
  server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable)
      << server.status();
  EXPECT_THAT(server.status().message(),
              HasSubstr("--health_listen: cannot listen on 192.0.2.1:0"));
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificateFromTheClientCa) {
  Options options;
  options.tls_cert_file = Cert("server");
  options.tls_key_file = Key("server");
  options.tls_client_ca_file = Cert("ca");
  Start(options);
  auto with_cert = [](const std::string& name) {
    ConnectOptions options;
    options.tls_ca_file = Cert("ca");
    options.tls_cert_file = Cert(name);
    options.tls_key_file = Key(name);
    return options;
  };
  auto trainer1 = MustConnect(with_cert("client"));
  ASSERT_NE(trainer1, nullptr);
  EXPECT_TRUE(trainer1->GetDeviceInfo().ok());

  ConnectOptions no_cert;
  no_cert.tls_ca_file = Cert("ca");
  EXPECT_EQ(Connect(no_cert).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Connect(with_cert("other_client")).status().code(),
            absl::StatusCode::kUnavailable);

  // Certificates are identities: trainer-2 cannot use trainer-1's session.
  auto trainer2 = MustConnect(with_cert("client2"));
  ASSERT_NE(trainer2, nullptr);
  auto session = trainer1->CreateSession("trainer-1", /*attach=*/false);
  ASSERT_TRUE(session.ok()) << session.status();
  ExpectForeignLooksUnknown(*trainer1, *trainer2, (*session)->token());
}

TEST_F(SecurityTest, NonLoopbackListenNeedsTlsAndAuthOrAllowInsecure) {
  Options options;
  options.listen = "0.0.0.0:0";
  absl::Status refused = Server::Start(options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  for (const char* flag : {"--listen", "--tls_cert_file", "--auth_token_file",
                           "--allow_insecure"}) {
    EXPECT_THAT(refused.message(), HasSubstr(flag));
  }
  // TLS alone is not enough, nor tokens alone.
  options.tls_cert_file = Cert("server");
  options.tls_key_file = Key("server");
  EXPECT_FALSE(Server::Start(options).ok());
  options.tls_cert_file = options.tls_key_file = "";
  options.auth_token_file = TokenFile();
  EXPECT_FALSE(Server::Start(options).ok());
  options.tls_cert_file = Cert("server");
  options.tls_key_file = Key("server");
  EXPECT_TRUE(Server::Start(options).ok());

  Options insecure;
  insecure.listen = "0.0.0.0:0";
  insecure.allow_insecure = true;
  EXPECT_TRUE(Server::Start(insecure).ok());
}

TEST_F(SecurityTest, BadSecurityOptionsNameTheFlag) {
  Options options;
  options.tls_cert_file = Cert("server");
  EXPECT_THAT(Server::Start(options).status().message(),
              HasSubstr("--tls_key_file"));
  options.tls_key_file = TmpDir() + "/missing.key";
  EXPECT_THAT(Server::Start(options).status().message(),
              HasSubstr("--tls_key_file: cannot read"));
  Options ca_only;
  ca_only.tls_client_ca_file = Cert("ca");
  EXPECT_THAT(Server::Start(ca_only).status().message(),
              HasSubstr("--tls_client_ca_file"));
  Options bad_tokens;
  bad_tokens.auth_token_file = WriteFile("bad_tokens", "alice\n");
  EXPECT_THAT(
      Server::Start(bad_tokens).status().message(),
      HasSubstr("--auth_token_file: " + bad_tokens.auth_token_file + ":1: "));
}

TEST_F(SecurityTest, ReloadedTokensApplyToNewCalls) {
  Options options;
  options.auth_token_file =
      WriteFile("reload_tokens", absl::StrCat("alice ", kAliceToken, "\n"));
  Start(options);
  auto bob = MustConnect(WithToken(kBobToken));
  ASSERT_NE(bob, nullptr);
  EXPECT_EQ(bob->GetDeviceInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  WriteFile("reload_tokens", absl::StrCat("bob ", kBobToken, "\n"));
  ASSERT_TRUE(server_->ReloadTokens().ok());
  EXPECT_TRUE(bob->GetDeviceInfo().ok());
  // A broken file keeps the tokens in force.
  WriteFile("reload_tokens", "bob\n");
  EXPECT_FALSE(server_->ReloadTokens().ok());
  EXPECT_TRUE(bob->GetDeviceInfo().ok());
}

// A tenant that sends a junk token before its own must not act as some
// other identity: the call is refused, so it can neither escape its
// per-tenant limits nor reach sessions others made the same way.
TEST_F(SecurityTest, TwoAuthorizationHeadersAreUnauthenticated) {
  Options options;
  options.auth_token_file = TokenFile();
  options.session_limits.max_sessions_per_tenant = 1;
  Start(options);
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  const std::string alice = absl::StrCat("Bearer ", kAliceToken);
  const std::string bob = absl::StrCat("Bearer ", kBobToken);
  v1::CreateSessionRequest create;
  create.set_client_name("one");
  v1::CreateSessionResponse created;
  ASSERT_TRUE(CallWithHeaders(channel.get(),
                              "/opserver.v1.Runtime/CreateSession", create,
                              {alice}, &created)
                  .ok());
  for (const std::vector<std::string>& headers :
       std::vector<std::vector<std::string>>{{"Bearer junk", alice},
                                             {alice, "Bearer junk"},
                                             {alice, alice},
                                             {bob, alice}}) {
    // The second session would be past --max_sessions_per_tenant=1.
    v1::CreateSessionResponse second;
    grpc::Status status =
        CallWithHeaders(channel.get(), "/opserver.v1.Runtime/CreateSession",
                        create, headers, &second);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << headers[0] << ", " << headers[1] << ": session "
        << second.session();
    EXPECT_THAT(status.error_message(),
                HasSubstr("more than one authorization"));
    if (!status.ok()) continue;
    // Made anyway: another tenant using the same trick must not close it.
    v1::CloseSessionRequest close;
    close.set_session(second.session());
    v1::CloseSessionResponse closed;
    EXPECT_FALSE(CallWithHeaders(channel.get(),
                                 "/opserver.v1.Runtime/CloseSession", close,
                                 {"Bearer junk", bob}, &closed)
                     .ok());
  }
}

// One tenant's long-lived calls, each opened and answered once, so the
// server holds them.
struct OpenCalls {
  grpc::ClientContext pipeline_context;
  grpc::ClientContext execute_context;
  grpc::ClientContext attach_context;
  grpc::ClientContext transfer_context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::PipelineRequest,
                                           v1::PipelineEvent>>
      pipeline;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::ExecuteRequest, v1::ExecuteResponse>>
      execute;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attach;
  std::unique_ptr<grpc::ClientReader<v1::OpenDataTransferResponse>> transfer;
  std::string ticket;
};

// A Pipeline, an ExecuteStream, an Attach and a download over the data
// path (its ticket issued, not presented) on `session`. Their deadline is
// far beyond the one second a revocation may take, so a call that a
// revocation failed to end shows as DEADLINE_EXCEEDED.
std::unique_ptr<OpenCalls> OpenLongLivedCalls(Client& client,
                                              const std::string& session,
                                              uint64_t buffer) {
  auto calls = std::make_unique<OpenCalls>();
  for (grpc::ClientContext* context :
       {&calls->pipeline_context, &calls->execute_context,
        &calls->attach_context, &calls->transfer_context}) {
    client.Authorize(context);
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(30));
  }
  calls->pipeline = client.operators().Pipeline(&calls->pipeline_context);
  v1::PipelineRequest open;
  open.set_session(session);
  EXPECT_TRUE(calls->pipeline->Write(open));
  v1::PipelineEvent ack;
  EXPECT_TRUE(calls->pipeline->Read(&ack));

  calls->execute = client.operators().ExecuteStream(&calls->execute_context);
  v1::ExecuteRequest launch;
  launch.set_session(session);
  launch.set_executor(12345);  // Unknown: answered with an error, in band.
  EXPECT_TRUE(calls->execute->Write(launch));
  v1::ExecuteResponse launched;
  EXPECT_TRUE(calls->execute->Read(&launched));

  v1::AttachRequest attach;
  attach.set_session(session);
  calls->attach = client.runtime().Attach(&calls->attach_context, attach);
  v1::AttachEvent attached;
  EXPECT_TRUE(calls->attach->Read(&attached));
  EXPECT_EQ(attached.event(), "attached");

  v1::OpenDataTransferRequest transfer;
  transfer.set_session(session);
  transfer.set_buffer(buffer);
  transfer.set_size(16);
  transfer.set_direction(v1::OpenDataTransferRequest::DIRECTION_DEVICE_TO_HOST);
  calls->transfer =
      client.runtime().OpenDataTransfer(&calls->transfer_context, transfer);
  v1::OpenDataTransferResponse ticket;
  EXPECT_TRUE(calls->transfer->Read(&ticket));
  calls->ticket = ticket.ticket();
  return calls;
}

void ExpectRevoked(const grpc::Status& status, absl::string_view what) {
  EXPECT_TRUE(status.error_code() == grpc::StatusCode::CANCELLED ||
              status.error_code() == grpc::StatusCode::UNAUTHENTICATED)
      << what << ": " << status.error_code() << " " << status.error_message();
}

// Reads `call` to its end and returns its status.
template <typename Message, typename Call>
grpc::Status Drain(Call& call) {
  Message message;
  while (call->Read(&message)) {
  }
  return call->Finish();
}

// Presents `ticket` on a new data-port connection (which must connect and
// take it) and reads what a 16-byte download sends over it into `*got`: the
// bytes received (0 when the connection was closed at once), or the socket
// error.
void DownloadOverTicket(const std::string& ticket, int data_port,
                        absl::StatusOr<size_t>* got) {
  absl::StatusOr<UniqueFd> fd = ConnectTcp("127.0.0.1", data_port,
                                           absl::Seconds(5), absl::Seconds(30));
  ASSERT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(SendAll(fd->get(), ticket.data(), ticket.size()).ok());
  char bytes[16];
  *got = RecvFull(fd->get(), bytes, sizeof(bytes));
}

// Every call of `calls` ends without the client doing anything, and the
// ticket no longer moves bytes.
void ExpectEndedByRevocation(OpenCalls& calls, int data_port) {
  ExpectRevoked(Drain<v1::PipelineEvent>(calls.pipeline), "Pipeline");
  ExpectRevoked(Drain<v1::ExecuteResponse>(calls.execute), "ExecuteStream");
  ExpectRevoked(Drain<v1::AttachEvent>(calls.attach), "Attach");
  ExpectRevoked(Drain<v1::OpenDataTransferResponse>(calls.transfer),
                "OpenDataTransfer");
  absl::StatusOr<size_t> got = absl::UnknownError("not presented");
  ASSERT_NO_FATAL_FAILURE(DownloadOverTicket(calls.ticket, data_port, &got));
  EXPECT_TRUE(!got.ok() || *got == 0) << "the revoked ticket moved bytes";
}

// Every call of `calls` still works: they end as the client asks.
void ExpectStillWorking(OpenCalls& calls, int data_port) {
  // The download first: until it is done it holds the stream the fence
  // below waits for.
  absl::StatusOr<size_t> got = absl::UnknownError("not presented");
  ASSERT_NO_FATAL_FAILURE(DownloadOverTicket(calls.ticket, data_port, &got));
  EXPECT_TRUE(got.ok() && *got == 16);
  grpc::Status transfer = Drain<v1::OpenDataTransferResponse>(calls.transfer);
  EXPECT_TRUE(transfer.ok()) << transfer.error_message();
  v1::PipelineRequest fence;
  fence.add_commands()->mutable_fence()->set_id(1);
  EXPECT_TRUE(calls.pipeline->Write(fence));
  EXPECT_TRUE(calls.pipeline->WritesDone());
  v1::PipelineEvent event;
  while (calls.pipeline->Read(&event)) {
  }
  grpc::Status pipeline = calls.pipeline->Finish();
  EXPECT_TRUE(pipeline.ok()) << pipeline.error_message();
  EXPECT_TRUE(calls.execute->WritesDone());
  v1::ExecuteResponse response;
  while (calls.execute->Read(&response)) {
  }
  grpc::Status execute = calls.execute->Finish();
  EXPECT_TRUE(execute.ok()) << execute.error_message();
  // Attach lasts until the client goes: it was still open.
  calls.attach_context.TryCancel();
  v1::AttachEvent attached;
  while (calls.attach->Read(&attached)) {
  }
  EXPECT_EQ(calls.attach->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(SecurityTest, RevokingATokenEndsItsOpenCallsOnly) {
  constexpr char kAliceNewToken[] = "alice-rotated-0123456789abcdef";
  Options options;
  options.auth_token_file = WriteFile(
      "revoke_tokens", absl::StrCat("alice ", kAliceToken, "\nalice ",
                                    kAliceNewToken, "\nbob ", kBobToken, "\n"));
  Start(options);
  ASSERT_NE(server_->data_port(), 0);
  struct Tenant {
    std::unique_ptr<Client> client;
    std::unique_ptr<remote::Session> session;
    std::unique_ptr<OpenCalls> calls;
  };
  auto open = [&](const char* token) {
    Tenant tenant;
    tenant.client = MustConnect(WithToken(token));
    EXPECT_NE(tenant.client, nullptr);
    if (tenant.client == nullptr) return tenant;
    auto session = tenant.client->CreateSession("job", /*attach=*/false);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return tenant;
    tenant.session = *std::move(session);
    auto buffer = tenant.session->Malloc(16);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return tenant;
    tenant.calls = OpenLongLivedCalls(
        *tenant.client, tenant.session->token(), buffer->handle());
    buffer->Release();
    return tenant;
  };
  Tenant alice = open(kAliceToken);
  Tenant rotated = open(kAliceNewToken);
  Tenant bob = open(kBobToken);
  ASSERT_TRUE(alice.calls && rotated.calls && bob.calls);

  // Alice's token rotates: the old one goes, the new one stays.
  WriteFile("revoke_tokens", absl::StrCat("alice ", kAliceNewToken, "\nbob ",
                                          kBobToken, "\n"));
  ASSERT_TRUE(server_->ReloadTokens().ok());
  ExpectEndedByRevocation(*alice.calls, server_->data_port());
  EXPECT_EQ(alice.client->GetDeviceInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  ExpectStillWorking(*rotated.calls, server_->data_port());
  ExpectStillWorking(*bob.calls, server_->data_port());
}

// Health.Watch needs no token: the streams open at once are bounded
// server-wide, and one that ends gives its slot back.
TEST_F(SecurityTest, HealthWatchStreamsAreBounded) {
  Options options;
  options.auth_token_file = TokenFile();
  options.max_health_watches = 3;
  Start(options);
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>>
        reader;
  };
  auto watch = [&] {
    auto w = std::make_unique<Watch>();
    w->context.set_deadline(std::chrono::system_clock::now() +
                            std::chrono::seconds(30));
    w->reader = stub->Watch(&w->context, grpc::health::v1::HealthCheckRequest());
    return w;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 3; ++i) {
    watches.push_back(watch());
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(watches.back()->reader->Read(&response)) << i;
    EXPECT_EQ(response.status(),
              grpc::health::v1::HealthCheckResponse::SERVING);
  }
  auto refused = watch();
  grpc::health::v1::HealthCheckResponse response;
  EXPECT_FALSE(refused->reader->Read(&response));
  grpc::Status status = refused->reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_health_watches"));
  // Check is not limited.
  grpc::ClientContext check_context;
  EXPECT_TRUE(stub->Check(&check_context,
                          grpc::health::v1::HealthCheckRequest(), &response)
                  .ok());
  // A watch that ends frees its slot (the server notices the cancellation
  // asynchronously: retry until it has).
  watches.front()->context.TryCancel();
  while (watches.front()->reader->Read(&response)) {
  }
  watches.front()->reader->Finish();
  watches.erase(watches.begin());
  bool admitted = false;
  for (int attempt = 0; attempt < 3000 && !admitted; ++attempt) {
    auto again = watch();
    if (again->reader->Read(&response)) {
      admitted = true;
      watches.push_back(std::move(again));
    } else {
      EXPECT_EQ(again->reader->Finish().error_code(),
                grpc::StatusCode::RESOURCE_EXHAUSTED);
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  EXPECT_TRUE(admitted);
  for (auto& w : watches) w->context.TryCancel();
  for (auto& w : watches) {
    while (w->reader->Read(&response)) {
    }
    w->reader->Finish();
  }
}

// The C API takes its settings from the environment at aclInit.
class CApiSecurityTest : public SecurityTest {
 protected:
  void SetUp() override {
    for (const char* name :
         {"OPSERVER_TOKEN", "OPSERVER_TOKEN_FILE", "OPSERVER_TLS_CA_FILE",
          "OPSERVER_TLS_CERT_FILE", "OPSERVER_TLS_KEY_FILE"}) {
      unsetenv(name);
    }
    setenv("OPSERVER_TIMEOUT_MS", "2000", 1);
  }
  void TearDown() override {
    aclrtResetDevice(0);
    aclFinalize();
  }
  aclError InitAndSetDevice() {
    setenv("OPSERVER_ADDRESS", server_->address().c_str(), 1);
    aclError init = aclInit(nullptr);
    if (init != ACL_SUCCESS) return init;
    return aclrtSetDevice(0);
  }
};

TEST_F(CApiSecurityTest, MissingTokenIsRtFailureWithAHint) {
  StartWithTokens();
  EXPECT_EQ(InitAndSetDevice(), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr("authorization: Bearer"));
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr("OPSERVER_TOKEN"));
}

TEST_F(CApiSecurityTest, WrongTokenIsRtFailure) {
  StartWithTokens();
  setenv("OPSERVER_TOKEN", "guessed-token-0123456789abcdef", 1);
  EXPECT_EQ(InitAndSetDevice(), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr("unknown bearer token"));
}

TEST_F(CApiSecurityTest, TokenFromEnvironmentOrFileWorks) {
  StartWithTokens();
  setenv("OPSERVER_TOKEN", kAliceToken, 1);
  ASSERT_EQ(InitAndSetDevice(), ACL_SUCCESS) << aclGetRecentErrMsg();
  void* device = nullptr;
  EXPECT_EQ(aclrtMalloc(&device, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  aclrtResetDevice(0);
  aclFinalize();

  unsetenv("OPSERVER_TOKEN");
  setenv("OPSERVER_TOKEN_FILE",
         WriteFile("bob_token", absl::StrCat("  ", kBobToken, "\n")).c_str(),
         1);
  ASSERT_EQ(InitAndSetDevice(), ACL_SUCCESS) << aclGetRecentErrMsg();
  EXPECT_EQ(aclrtMalloc(&device, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
      << aclGetRecentErrMsg();
}

TEST_F(CApiSecurityTest, UnreadableFilesFailAclInit) {
  StartWithTokens();
  setenv("OPSERVER_TOKEN_FILE", "/nonexistent/token", 1);
  EXPECT_EQ(InitAndSetDevice(), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr("OPSERVER_TOKEN_FILE"));
  unsetenv("OPSERVER_TOKEN_FILE");
  setenv("OPSERVER_TLS_CA_FILE", "/nonexistent/ca.pem", 1);
  EXPECT_EQ(InitAndSetDevice(), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr("OPSERVER_TLS_CA_FILE"));
}

TEST_F(CApiSecurityTest, MutualTlsFromTheEnvironment) {
  Options options;
  options.tls_cert_file = Cert("server");
  options.tls_key_file = Key("server");
  options.tls_client_ca_file = Cert("ca");
  options.auth_token_file = TokenFile();
  Start(options);
  setenv("OPSERVER_TOKEN", kAliceToken, 1);
  setenv("OPSERVER_TLS_CA_FILE", Cert("ca").c_str(), 1);
  setenv("OPSERVER_TLS_CERT_FILE", Cert("client").c_str(), 1);
  setenv("OPSERVER_TLS_KEY_FILE", Key("client").c_str(), 1);
  ASSERT_EQ(InitAndSetDevice(), ACL_SUCCESS) << aclGetRecentErrMsg();
  aclrtResetDevice(0);
  aclFinalize();

  setenv("OPSERVER_TLS_CA_FILE", Cert("other_ca").c_str(), 1);
  EXPECT_EQ(InitAndSetDevice(), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr("cannot reach opserver"));
}

}  // namespace
}  // namespace opserver
