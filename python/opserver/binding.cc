#include "python/opserver/binding.h"

#include <string>

#include "google/protobuf/util/json_util.h"

namespace opserver::python {

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    throw StatusError{absl::InternalError("a reply could not be printed")};
  }
  return json;
}

py::buffer_info HostBytes(const py::buffer& data, bool writable) {
  py::buffer_info info = data.request(writable);
  int64_t expected = info.itemsize;
  for (int i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expected) {
      throw StatusError{absl::InvalidArgumentError(
          "the host array is not C-contiguous; pass a contiguous copy")};
    }
    expected *= info.shape[i];
  }
  return info;
}

uint64_t ByteSize(const py::buffer_info& info) {
  return static_cast<uint64_t>(info.size) * info.itemsize;
}

}  // namespace opserver::python
