#include "common/task_position.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace opserver {
namespace {

constexpr absl::string_view kTaskPayload = "opserver-task-position";
constexpr absl::string_view kStreamPayload = "opserver-deferred-stream";

bool NumberOf(const absl::Status& status, absl::string_view key,
              uint64_t* value) {
  auto payload = status.GetPayload(key);
  return payload.has_value() && absl::SimpleAtoi(std::string(*payload), value);
}

}  // namespace

absl::Status WithTaskPosition(absl::Status status, uint64_t task) {
  if (status.ok() || task == 0 || TaskPositionOf(status) != 0) return status;
  status.SetPayload(kTaskPayload, absl::Cord(absl::StrCat(task)));
  return status;
}

uint64_t TaskPositionOf(const absl::Status& status) {
  uint64_t task = 0;
  return NumberOf(status, kTaskPayload, &task) ? task : 0;
}

absl::Status WithDeferredStream(absl::Status status, uint64_t stream) {
  if (status.ok()) return status;
  status.SetPayload(kStreamPayload, absl::Cord(absl::StrCat(stream)));
  return status;
}

bool DeferredStreamOf(const absl::Status& status, uint64_t* stream) {
  return NumberOf(status, kStreamPayload, stream);
}

}  // namespace opserver
