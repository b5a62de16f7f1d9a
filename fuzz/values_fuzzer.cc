// WriteValues and ReadValues: the typed-values codec with every dtype. The
// input is parsed as a WriteValuesRequest and as a ReadValuesRequest (the
// two share their field numbers except 5, values vs count, whose wire types
// differ, so each message skips the other's field 5 as unknown): one input
// writes values into a 4 KiB buffer of a session and reads some back, as
// the handlers do, through EncodeWriteValues / CheckReadValues, CheckRange
// and DecodeValues. The buffer is an exact heap block, so ASan sees any
// byte a range check let through outside it.
//
// Invariants besides memory safety: encoded bytes are values * dtype size;
// integers and BOOL decode to exactly the value written; floating values
// decode to a value that encodes to the same bytes (NaN stays NaN); a read
// decodes `count` values.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/values.h"
#include "fuzz/fuzz_support.h"
#include "kernels/dtype.h"
#include "proto/opserver.pb.h"
#include "runtime/byte_range.h"
#include "runtime/value_requests.h"

namespace {

constexpr uint64_t kBufferBytes = 4096;
// The server's default --max_values.
constexpr uint32_t kMaxValues = 1u << 20;

void CheckWrite(const opserver::v1::WriteValuesRequest& request, char* buffer) {
  using namespace opserver;
  absl::StatusOr<std::string> bytes = EncodeWriteValues(request, kMaxValues);
  fuzz::Report("WriteValues", bytes.status());
  if (!bytes.ok()) {
    FUZZ_CHECK(bytes.status().code() == absl::StatusCode::kInvalidArgument ||
                   bytes.status().code() ==
                       absl::StatusCode::kResourceExhausted,
               bytes.status().ToString());
    return;
  }
  const auto dtype = static_cast<kernels::DType>(request.dtype());
  const int64_t esize = kernels::DTypeSize(dtype);
  const int64_t n = request.values_size();
  FUZZ_CHECK(static_cast<int64_t>(bytes->size()) == n * esize, bytes->size(),
             " bytes for ", n, " values");
  const std::vector<double> back = DecodeValues(dtype, bytes->data(), n);
  FUZZ_CHECK(static_cast<int64_t>(back.size()) == n, "decoded ", back.size());
  if (kernels::IsFloating(dtype)) {
    absl::StatusOr<std::string> again = EncodeValues(dtype, back);
    FUZZ_CHECK(again.ok(), again.status().ToString());
    for (int64_t i = 0; i < n; ++i) {
      const double v = request.values(static_cast<int>(i));
      FUZZ_CHECK(std::isnan(v) == std::isnan(back[i]), "values[", i, "] = ",
                 v, " decoded as ", back[i]);
      if (!std::isnan(v)) {
        FUZZ_CHECK(std::memcmp(again->data() + i * esize,
                               bytes->data() + i * esize, esize) == 0,
                   "values[", i, "] = ", v, " does not round-trip");
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      FUZZ_CHECK(back[i] == request.values(static_cast<int>(i)), "values[", i,
                 "] = ", request.values(static_cast<int>(i)), " decoded as ",
                 back[i]);
    }
  }
  // The handler: the range inside the buffer, then the copy.
  if (!CheckRange(request.offset(), bytes->size(), kBufferBytes, "values")
           .ok()) {
    return;
  }
  if (!bytes->empty()) {
    std::memcpy(buffer + request.offset(), bytes->data(), bytes->size());
  }
}

void CheckRead(const opserver::v1::ReadValuesRequest& request,
               const char* buffer) {
  using namespace opserver;
  absl::StatusOr<ValuesRead> read = CheckReadValues(request, kMaxValues);
  fuzz::Report("ReadValues", read.status());
  if (!read.ok()) {
    FUZZ_CHECK(read.status().code() == absl::StatusCode::kInvalidArgument ||
                   read.status().code() ==
                       absl::StatusCode::kResourceExhausted,
               read.status().ToString());
    return;
  }
  FUZZ_CHECK(read->bytes == request.count() * kernels::DTypeSize(read->dtype),
             read->bytes, " bytes");
  if (!CheckRange(request.offset(), read->bytes, kBufferBytes, "values")
           .ok()) {
    return;
  }
  std::string host(read->bytes, '\0');
  if (read->bytes != 0) {
    std::memcpy(host.data(), buffer + request.offset(), read->bytes);
  }
  const std::vector<double> values = DecodeValues(
      read->dtype, host.data(), static_cast<int64_t>(request.count()));
  FUZZ_CHECK(values.size() == request.count(), values.size(), " values");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace opserver;
  opserver::fuzz::QuietProtobuf();
  // The session's buffer, as Malloc leaves it: zeros.
  std::unique_ptr<char[]> buffer(new char[kBufferBytes]());
  v1::WriteValuesRequest write;
  if (write.ParseFromArray(data, static_cast<int>(size))) {
    CheckWrite(write, buffer.get());
  }
  v1::ReadValuesRequest read;
  if (read.ParseFromArray(data, static_cast<int>(size))) {
    CheckRead(read, buffer.get());
  }
  return 0;
}
