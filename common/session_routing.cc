#include "common/session_routing.h"

#include <cstdint>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace opserver {

std::string NewSessionRoutingKey() {
  static thread_local std::random_device device;
  const uint64_t a = (uint64_t{device()} << 32) | device();
  const uint64_t b = (uint64_t{device()} << 32) | device();
  return absl::StrCat(absl::Hex(a, absl::kZeroPad16),
                      absl::Hex(b, absl::kZeroPad16));
}

absl::Status CheckSessionRoutingKey(absl::string_view key) {
  if (key.size() != kSessionRoutingKeyChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        kSessionRoutingHeader, " has ", key.size(), " characters; a key is ",
        kSessionRoutingKeyChars, " lowercase hex digits (128 bits)"));
  }
  for (char c : key) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) {
      return absl::InvalidArgumentError(
          absl::StrCat(kSessionRoutingHeader,
                       " holds a character that is not a lowercase hex "
                       "digit; a key is ",
                       kSessionRoutingKeyChars, " of them (128 bits)"));
    }
  }
  return absl::OkStatus();
}

absl::Status SessionRoutingKeyNotFound(absl::string_view key) {
  std::string shown;
  if (CheckSessionRoutingKey(key).ok()) {
    shown = std::string(key);
  } else {
    shown = absl::StrCat(
        "\"", absl::CHexEscape(key.substr(0, kSessionRoutingKeyChars)),
        key.size() > kSessionRoutingKeyChars ? "...\"" : "\"");
  }
  return absl::NotFoundError(absl::StrCat(
      "no session with routing key ", shown, " (", kSessionRoutingHeader,
      ") on this server: the call reached a server that did not create the "
      "session; a proxy in front must send every call with this key to one "
      "server (route on the ",
      kSessionRoutingHeader, " header: docs/pool.md)"));
}

}  // namespace opserver
