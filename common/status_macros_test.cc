#include "common/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

absl::Status Fail(absl::string_view why) {
  return absl::InvalidArgumentError(why);
}

absl::StatusOr<std::unique_ptr<int>> Make(bool ok, int value) {
  if (!ok) return absl::NotFoundError("no value");
  return std::make_unique<int>(value);
}

// Counts how often the rest of a function ran, so a test sees whether the
// macro returned early.
int reached = 0;

absl::Status Twice(bool fail_first) {
  RETURN_IF_ERROR(fail_first ? Fail("first") : absl::OkStatus());
  ++reached;
  RETURN_IF_ERROR(Fail("second"));
  ++reached;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheFirstFailure) {
  reached = 0;
  EXPECT_EQ(Twice(true), Fail("first"));
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(Twice(false), Fail("second"));
  EXPECT_EQ(reached, 1);
}

absl::Status StatusOfStatusOr(bool ok) {
  RETURN_IF_ERROR(Make(ok, 1));
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorTakesAStatusOr) {
  EXPECT_TRUE(StatusOfStatusOr(true).ok());
  EXPECT_EQ(StatusOfStatusOr(false), absl::NotFoundError("no value"));
}

absl::StatusOr<int> Sum(bool first_ok, bool second_ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> a, Make(first_ok, 2));
  std::unique_ptr<int> b;
  ASSIGN_OR_RETURN(b, Make(second_ok, 3));  // an existing variable
  return *a + *b;
}

TEST(StatusMacrosTest, AssignOrReturnMovesTheValueOrReturnsTheStatus) {
  EXPECT_EQ(*Sum(true, true), 5);
  EXPECT_EQ(Sum(false, true).status(), absl::NotFoundError("no value"));
  EXPECT_EQ(Sum(true, false).status(), absl::NotFoundError("no value"));
}

absl::Status Prefixed(const absl::Status& status) {
  return absl::Status(status.code(), "copy: " + std::string(status.message()));
}

absl::Status WithCallables(int fail_at) {
  RETURN_IF_ERROR(fail_at == 1 ? Fail("one") : absl::OkStatus(), Prefixed);
  ASSIGN_OR_RETURN(auto value, Make(fail_at != 2, 7),
                   [](absl::Status s) { return Prefixed(s); });
  return *value == 7 ? absl::OkStatus() : absl::InternalError("wrong value");
}

TEST(StatusMacrosTest, TheCallableShapesWhatIsReturned) {
  EXPECT_EQ(WithCallables(1), absl::InvalidArgumentError("copy: one"));
  EXPECT_EQ(WithCallables(2), absl::NotFoundError("copy: no value"));
  EXPECT_TRUE(WithCallables(0).ok());
}

// A handler's form: the callable returns something else than a status.
std::string Reply(bool ok) {
  auto reply = [](const absl::Status& s) {
    return "replied " + std::string(absl::StatusCodeToString(s.code()));
  };
  ASSIGN_OR_RETURN(auto value, Make(ok, 4), reply);
  RETURN_IF_ERROR(*value == 4 ? absl::OkStatus() : Fail("x"), reply);
  return "ok";
}

TEST(StatusMacrosTest, TheCallableMayReturnAnyType) {
  EXPECT_EQ(Reply(true), "ok");
  EXPECT_EQ(Reply(false), "replied NOT_FOUND");
}

TEST(StatusMacrosTest, TheExpressionIsEvaluatedOnce) {
  int calls = 0;
  auto once = [&]() -> absl::Status {
    ++calls;
    return absl::OkStatus();
  };
  auto body = [&]() -> absl::Status {
    RETURN_IF_ERROR(once());
    return absl::OkStatus();
  };
  EXPECT_TRUE(body().ok());
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace opserver
