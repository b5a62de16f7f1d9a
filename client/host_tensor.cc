#include "client/host_tensor.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/values.h"

namespace opserver::remote {
namespace {

using kernels::DType;

constexpr DType kAllDTypes[] = {DType::kFloat,   DType::kFloat16, DType::kInt8,
                                DType::kInt32,   DType::kUint8,   DType::kInt16,
                                DType::kUint16,  DType::kUint32,  DType::kInt64,
                                DType::kUint64,  DType::kDouble,  DType::kBool,
                                DType::kBFloat16};

// NumPy's descr for each dtype ("" = none).
std::string NpyDescr(DType dtype) {
  switch (dtype) {
    case DType::kFloat:
      return "<f4";
    case DType::kFloat16:
      return "<f2";
    case DType::kDouble:
      return "<f8";
    case DType::kInt8:
      return "|i1";
    case DType::kUint8:
      return "|u1";
    case DType::kInt16:
      return "<i2";
    case DType::kUint16:
      return "<u2";
    case DType::kInt32:
      return "<i4";
    case DType::kUint32:
      return "<u4";
    case DType::kInt64:
      return "<i8";
    case DType::kUint64:
      return "<u8";
    case DType::kBool:
      return "|b1";
    default:
      return "";
  }
}

// The value of `key` in a .npy header dict, e.g. 'descr': '<f4'.
absl::StatusOr<std::string> HeaderField(absl::string_view header,
                                        absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "':");
  size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("header has no '", key, "'"));
  }
  absl::string_view rest =
      absl::StripLeadingAsciiWhitespace(header.substr(at + quoted.size()));
  size_t end;
  if (absl::ConsumePrefix(&rest, "'")) {
    end = rest.find('\'');
  } else if (absl::ConsumePrefix(&rest, "(")) {
    end = rest.find(')');
  } else {
    end = rest.find_first_of(",}");
  }
  if (end == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("header field '", key, "' is malformed"));
  }
  return std::string(rest.substr(0, end));
}

}  // namespace

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::string> EncodeValues(DType dtype,
                                         const std::vector<double>& values) {
  return opserver::EncodeValues(dtype, values);
}

std::vector<double> DecodeValues(DType dtype, absl::string_view bytes) {
  const int64_t size = kernels::DTypeSize(dtype);
  if (size == 0) return {};
  return opserver::DecodeValues(dtype, bytes.data(),
                                static_cast<int64_t>(bytes.size()) / size);
}

absl::StatusOr<std::vector<double>> ParseNumberList(absl::string_view text) {
  std::vector<double> values;
  if (absl::StripAsciiWhitespace(text).empty()) return values;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    double v;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(item), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item, "' is not a number"));
    }
    values.push_back(v);
  }
  return values;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text) {
  std::vector<int64_t> shape;
  if (absl::StripAsciiWhitespace(text).empty()) return shape;  // 0-dim.
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t d;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &d) || d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item, "' is not a dimension (an integer >= 0)"));
    }
    shape.push_back(d);
  }
  return shape;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::string upper = absl::AsciiStrToUpper(name);
  if (absl::StartsWith(upper, "ACL_")) upper = upper.substr(4);
  if (upper == "BF16") upper = "BFLOAT16";
  if (upper == "FLOAT32") upper = "FLOAT";
  for (DType dtype : kAllDTypes) {
    if (kernels::DTypeName(dtype) == upper) return dtype;
  }
  std::vector<std::string> names;
  for (DType dtype : kAllDTypes) {
    names.emplace_back(kernels::DTypeName(dtype));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "' (one of ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<HostTensor> ReadNpy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  }
  std::string data((std::istreambuf_iterator<char>(file)),
                   std::istreambuf_iterator<char>());
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a usable .npy file: ", why));
  };
  if (data.size() < 10 || data.compare(0, 6, "\x93NUMPY") != 0) {
    return bad("no \\x93NUMPY magic");
  }
  const int major = static_cast<uint8_t>(data[6]);
  size_t header_len, header_at;
  if (major == 1) {
    header_len = static_cast<uint8_t>(data[8]) |
                 (static_cast<size_t>(static_cast<uint8_t>(data[9])) << 8);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) return bad("truncated header");
    uint32_t len;
    std::memcpy(&len, data.data() + 8, 4);
    header_len = len;
    header_at = 12;
  } else {
    return bad(absl::StrCat("unknown version ", major));
  }
  if (data.size() < header_at + header_len) return bad("truncated header");
  absl::string_view header(data.data() + header_at, header_len);
  auto descr = HeaderField(header, "descr");
  if (!descr.ok()) return bad(descr.status().message());
  auto fortran = HeaderField(header, "fortran_order");
  if (!fortran.ok()) return bad(fortran.status().message());
  if (absl::StripAsciiWhitespace(*fortran) != "False") {
    return bad("Fortran order is not supported (save it C-contiguous)");
  }
  auto shape_text = HeaderField(header, "shape");
  if (!shape_text.ok()) return bad(shape_text.status().message());
  HostTensor tensor;
  bool found = false;
  for (DType dtype : kAllDTypes) {
    std::string want = NpyDescr(dtype);
    if (want.empty()) continue;
    // '=' and '|' mean native/not applicable: little-endian here.
    std::string got = *descr;
    if (!got.empty() && (got[0] == '=' || got[0] == '|')) got[0] = want[0];
    if (got == want) {
      tensor.dtype = dtype;
      found = true;
      break;
    }
  }
  if (!found) return bad(absl::StrCat("unsupported dtype '", *descr, "'"));
  for (absl::string_view item :
       absl::StrSplit(*shape_text, ',', absl::SkipWhitespace())) {
    int64_t d;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &d) || d < 0) {
      return bad(absl::StrCat("bad shape (", *shape_text, ")"));
    }
    tensor.shape.push_back(d);
  }
  // The shape comes from the file: multiply with overflow checks before
  // trusting numel().
  uint64_t want = kernels::DTypeSize(tensor.dtype);
  for (int64_t d : tensor.shape) {
    if (__builtin_mul_overflow(want, static_cast<uint64_t>(d), &want)) {
      return bad(absl::StrCat("shape (", *shape_text, ") is too large"));
    }
  }
  const size_t at = header_at + header_len;
  if (data.size() - at != want) {
    return bad(absl::StrCat("holds ", data.size() - at, " data bytes, shape (",
                            *shape_text, ") needs ", want));
  }
  tensor.bytes = data.substr(at);
  return tensor;
}

absl::Status WriteNpy(const std::string& path, const HostTensor& tensor) {
  const std::string descr = NpyDescr(tensor.dtype);
  if (descr.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kernels::DTypeName(tensor.dtype),
                     " has no NumPy dtype; print it instead of saving .npy"));
  }
  std::string header = absl::StrCat(
      "{'descr': '", descr, "', 'fortran_order': False, 'shape': (",
      absl::StrJoin(tensor.shape, ", "), tensor.shape.size() == 1 ? "," : "",
      "), }");
  // Magic (6) + version (2) + length (2) + header + '\n', a multiple of 64.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write '", path, "'"));
  }
  file.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(header.size() & 0xFF),
                       static_cast<char>(header.size() >> 8)};
  file.write(len, 2);
  file << header;
  file.write(tensor.bytes.data(), tensor.bytes.size());
  if (!file) {
    return absl::DataLossError(absl::StrCat("writing '", path, "' failed"));
  }
  return absl::OkStatus();
}

}  // namespace opserver::remote
