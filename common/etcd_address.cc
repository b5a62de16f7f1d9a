#include "common/etcd_address.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/listen_address.h"

namespace opserver {
namespace {

constexpr absl::string_view kScheme = "etcd://";
constexpr absl::string_view kForm = "etcd://HOST:PORT[,HOST:PORT...]/PREFIX";
// Longest prefix and address accepted: keys stay far below etcd's request
// size limit, and a hostile value cannot make keys of any size.
constexpr size_t kMaxPrefix = 256;
constexpr size_t kMaxAddress = 300;

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "': ", why, " (expected ", kForm, ")"));
}

bool IsSegmentChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == '-';
}

}  // namespace

std::string EtcdAddress::Root() const { return absl::StrCat("/", prefix, "/"); }
std::string EtcdAddress::DevicesRoot() const {
  return absl::StrCat(Root(), "devices/");
}
std::string EtcdAddress::ClaimsRoot() const {
  return absl::StrCat(Root(), "claims/");
}
std::string EtcdAddress::DeviceKey(absl::string_view address,
                                   uint32_t device) const {
  return absl::StrCat(DevicesRoot(), address, "/",
                      absl::StrFormat("%05u", device));
}
std::string EtcdAddress::ClaimKey(absl::string_view address,
                                  uint32_t device) const {
  return absl::StrCat(ClaimsRoot(), address, "/",
                      absl::StrFormat("%05u", device));
}

bool IsEtcdAddress(absl::string_view text) {
  return absl::StartsWith(text, kScheme);
}

absl::StatusOr<EtcdAddress> ParseEtcdAddress(absl::string_view text) {
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, kScheme)) return Bad(text, "not etcd://");
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return Bad(text, "no /PREFIX");
  const absl::string_view hosts = rest.substr(0, slash);
  const absl::string_view prefix = rest.substr(slash + 1);
  EtcdAddress address;
  if (hosts.empty()) return Bad(text, "no etcd endpoint");
  for (absl::string_view endpoint : absl::StrSplit(hosts, ',')) {
    absl::StatusOr<ListenAddress> parsed = ParseListenAddress(endpoint);
    if (!parsed.ok()) {
      return Bad(text, absl::StrCat("etcd endpoint '", endpoint,
                                    "': ", parsed.status().message()));
    }
    if (parsed->port == 0) {
      return Bad(text,
                 absl::StrCat("etcd endpoint '", endpoint, "' has port 0"));
    }
    address.endpoints.push_back(parsed->ToString());
  }
  if (prefix.empty()) return Bad(text, "empty PREFIX");
  if (prefix.size() > kMaxPrefix) {
    return Bad(text, absl::StrCat("PREFIX longer than ", kMaxPrefix, " bytes"));
  }
  for (absl::string_view segment : absl::StrSplit(prefix, '/')) {
    if (segment.empty()) {
      return Bad(text,
                 "PREFIX has an empty segment ('//' or a '/' at its end)");
    }
    for (char c : segment) {
      if (!IsSegmentChar(c)) {
        return Bad(text, absl::StrCat("PREFIX has the character '",
                                      absl::CEscape(absl::string_view(&c, 1)),
                                      "' (letters, digits, '.', '_', '-' and "
                                      "'/' between segments)"));
      }
    }
  }
  address.prefix = std::string(prefix);
  return address;
}

absl::StatusOr<DeviceKeyParts> ParseDeviceKeyRest(absl::string_view rest) {
  const size_t slash = rest.rfind('/');
  if (slash == absl::string_view::npos || slash == 0 || slash > kMaxAddress) {
    return absl::InvalidArgumentError("not ADDRESS/INDEX");
  }
  const absl::string_view index = rest.substr(slash + 1);
  DeviceKeyParts parts;
  if (index.size() != 5 || !absl::SimpleAtoi(index, &parts.device) ||
      !absl::ascii_isdigit(static_cast<unsigned char>(index[0]))) {
    return absl::InvalidArgumentError(
        "the device index is not five decimal digits");
  }
  parts.address = std::string(rest.substr(0, slash));
  absl::StatusOr<ListenAddress> address = ParseListenAddress(parts.address);
  if (!address.ok() || address->port == 0) {
    return absl::InvalidArgumentError("the address is not HOST:PORT");
  }
  return parts;
}

}  // namespace opserver
