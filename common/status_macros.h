// Early returns on a failed absl::Status or absl::StatusOr, written once
// (the RETURN_IF_ERROR / ASSIGN_OR_RETURN idiom of TensorFlow and
// tensorstore), so a function reads as its happy path:
//
//   RETURN_IF_ERROR(device_->Bind());
//   ASSIGN_OR_RETURN(void* scratch, Scratch(bytes));
//   ASSIGN_OR_RETURN(auto stream, session.GetStream(id), Prefixed("copy"));
//
// The optional last argument of each is a callable applied to the failed
// status; the function returns what it returns. That is how a gRPC handler
// replies (`ReplyTo(context)` returns the reactor) and how a call wraps the
// error in its own words, without an early return written by hand.
#ifndef OPSERVER_COMMON_STATUS_MACROS_H_
#define OPSERVER_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#if defined(RETURN_IF_ERROR) || defined(ASSIGN_OR_RETURN)
#error "RETURN_IF_ERROR or ASSIGN_OR_RETURN is already defined elsewhere"
#endif

namespace opserver::status_macros_internal {

// The identity: what a macro without an error callable returns.
struct AsIs {
  absl::Status operator()(absl::Status status) const { return status; }
};

inline const absl::Status& ToStatus(const absl::Status& status) {
  return status;
}
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace opserver::status_macros_internal

#define OPSERVER_STATUS_CONCAT_INNER(a, b) a##b
#define OPSERVER_STATUS_CONCAT(a, b) OPSERVER_STATUS_CONCAT_INNER(a, b)
#define OPSERVER_STATUS_PICK(_1, _2, _3, NAME, ...) NAME

// RETURN_IF_ERROR(expr) or RETURN_IF_ERROR(expr, on_error): `expr` is an
// absl::Status or StatusOr; when it failed, returns its status (or
// on_error(status)).
#define RETURN_IF_ERROR(...)                                            \
  OPSERVER_STATUS_PICK(__VA_ARGS__, unused, OPSERVER_RETURN_IF_ERROR_2, \
                       OPSERVER_RETURN_IF_ERROR_1, unused)              \
  (__VA_ARGS__)
#define OPSERVER_RETURN_IF_ERROR_1(expr) \
  OPSERVER_RETURN_IF_ERROR_2(expr,       \
                             ::opserver::status_macros_internal::AsIs{})
#define OPSERVER_RETURN_IF_ERROR_2(expr, on_error)                          \
  do {                                                                      \
    const auto& opserver_status_value = (expr);                             \
    if (ABSL_PREDICT_FALSE(!opserver_status_value.ok())) {                  \
      return (on_error)(::opserver::status_macros_internal::ToStatus(       \
          opserver_status_value));                                          \
    }                                                                       \
  } while (false)

// ASSIGN_OR_RETURN(lhs, rexpr) or ASSIGN_OR_RETURN(lhs, rexpr, on_error):
// `rexpr` is an absl::StatusOr<T>; on success its value is moved into `lhs`
// (a declaration such as `auto x` or an existing variable), else the
// function returns its status (or on_error(status)). Expands to several
// statements: not for the body of an unbraced if.
#define ASSIGN_OR_RETURN(...)                                            \
  OPSERVER_STATUS_PICK(__VA_ARGS__, OPSERVER_ASSIGN_OR_RETURN_3,         \
                       OPSERVER_ASSIGN_OR_RETURN_2, unused, unused)      \
  (__VA_ARGS__)
#define OPSERVER_ASSIGN_OR_RETURN_2(lhs, rexpr) \
  OPSERVER_ASSIGN_OR_RETURN_3(lhs, rexpr,       \
                              ::opserver::status_macros_internal::AsIs{})
#define OPSERVER_ASSIGN_OR_RETURN_3(lhs, rexpr, on_error)                  \
  OPSERVER_ASSIGN_OR_RETURN_IMPL(                                          \
      OPSERVER_STATUS_CONCAT(opserver_status_or_, __LINE__), lhs, rexpr,   \
      on_error)
#define OPSERVER_ASSIGN_OR_RETURN_IMPL(status_or, lhs, rexpr, on_error) \
  auto status_or = (rexpr);                                             \
  if (ABSL_PREDICT_FALSE(!status_or.ok())) {                            \
    return (on_error)(std::move(status_or).status());                   \
  }                                                                     \
  lhs = *std::move(status_or)

#endif  // OPSERVER_COMMON_STATUS_MACROS_H_
