#include "server/auth.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(TokenTableTest, ParsesTenantsTokensCommentsAndBlankLines) {
  std::string path = WriteFile("tokens", R"(# who may call
alice   alice-secret-0123456789

bob	bob-secret-0123456789xyz   # trailing comment
   # indented comment
)");
  absl::StatusOr<TokenTable> table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  EXPECT_EQ(table->Lookup("alice-secret-0123456789"), "alice");
  EXPECT_EQ(table->Lookup("bob-secret-0123456789xyz"), "bob");
  EXPECT_EQ(table->Lookup("bob-secret-0123456789"), std::nullopt);
  EXPECT_EQ(table->Lookup("alice-secret-0123456789x"), std::nullopt);
  EXPECT_EQ(table->Lookup(""), std::nullopt);
}

TEST(TokenTableTest, MalformedLinesNameFileAndLineButNeverTheToken) {
  struct Case {
    std::string text;
    int line;
    std::string why;
  } cases[] = {
      {"alice alice-secret-0123456789 extra\n", 1, "want 'TENANT TOKEN'"},
      {"# c\n\nalice-secret-0123456789\n", 3, "want 'TENANT TOKEN'"},
      {"al/ice alice-secret-0123456789\n", 1, "tenant name"},
      {"alice short-secret\n", 1, "shorter than 16"},
      {"alice alice-secret-0123456789\nbob alice-secret-0123456789\n", 2,
       "already used on line 1"},
  };
  for (const Case& c : cases) {
    std::string path = WriteFile("bad_tokens", c.text);
    absl::StatusOr<TokenTable> table = TokenTable::Load(path);
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(),
                AllOf(HasSubstr("--auth_token_file: " + path + ":" +
                                std::to_string(c.line) + ": "),
                      HasSubstr(c.why), Not(HasSubstr("secret")),
                      Not(HasSubstr("\n"))));
  }
}

TEST(TokenTableTest, MissingOrEmptyFileIsAnError) {
  EXPECT_THAT(TokenTable::Load("/nonexistent/tokens").status().message(),
              HasSubstr("--auth_token_file: cannot read /nonexistent/tokens"));
  EXPECT_THAT(
      TokenTable::Load(WriteFile("empty", "# nothing\n\n")).status().message(),
      HasSubstr("no 'TENANT TOKEN' lines"));
}

TEST(TokenTableTest, ADirectoryIsReportedAsOne) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/tokens.d";
  ASSERT_TRUE(mkdir(dir.c_str(), 0700) == 0 || errno == EEXIST);
  EXPECT_THAT(TokenTable::Load(dir).status().message(),
              HasSubstr("--auth_token_file: " + dir + " is a directory"));
}

// Anyone else who may read the file holds every tenant's token: loading
// works (refusing would break running deployments) but says so, naming the
// file and never a token.
TEST(TokenTableTest, AFileOthersMayReadLoadsWithAWarning) {
  const std::string path =
      WriteFile("shared_tokens", "alice alice-secret-0123456789\n");
  for (mode_t mode : {0644, 0640, 0604}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    absl::StatusOr<TokenTable> table = TokenTable::Load(path);
    ASSERT_TRUE(table.ok()) << table.status();
    EXPECT_THAT(table->warning(),
                AllOf(HasSubstr("--auth_token_file: " + path),
                      HasSubstr("group or others"), HasSubstr("chmod 600"),
                      Not(HasSubstr("secret"))))
        << mode;
  }
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  absl::StatusOr<TokenTable> table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->warning(), "");
}

TEST(AuthenticatorTest, HealthIsOpenEverythingElseNeedsAToken) {
  Authenticator auth(
      TokenTable({TokenTable::Entry{"alice", "alice-secret-0123456789"}}),
      /*reflection_without_auth=*/false);
  EXPECT_EQ(*auth.Check("/grpc.health.v1.Health/Check", ""), "");
  for (const char* path :
       {"/opserver.v1.Runtime/GetDeviceInfo", "/opserver.v1.Operators/Evaluate",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    EXPECT_EQ(auth.Check(path, "").status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(
        auth.Check(path, "Bearer wrong-secret-0123456789").status().code(),
        absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(auth.Check(path, "alice-secret-0123456789").status().code(),
              absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(*auth.Check(path, "Bearer alice-secret-0123456789"), "alice");
  }
}

TEST(AuthenticatorTest, ReflectionWithoutAuthOnlyOpensReflection) {
  Authenticator auth(
      TokenTable({TokenTable::Entry{"alice", "alice-secret-0123456789"}}),
      /*reflection_without_auth=*/true);
  EXPECT_TRUE(
      auth.Check("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                 "")
          .ok());
  EXPECT_EQ(
      auth.Check("/opserver.v1.Runtime/CreateSession", "").status().code(),
      absl::StatusCode::kUnauthenticated);
}

TEST(AuthenticatorTest, SetTokensReplacesTheTable) {
  Authenticator auth(
      TokenTable({TokenTable::Entry{"alice", "alice-secret-0123456789"}}),
      false);
  auth.SetTokens(
      TokenTable({TokenTable::Entry{"bob", "bob-secret-0123456789xyz"}}));
  const char* path = "/opserver.v1.Runtime/GetDeviceInfo";
  EXPECT_FALSE(auth.Check(path, "Bearer alice-secret-0123456789").ok());
  EXPECT_EQ(*auth.Check(path, "Bearer bob-secret-0123456789xyz"), "bob");
}

}  // namespace
}  // namespace opserver
