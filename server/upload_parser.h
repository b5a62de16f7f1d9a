// The raw Upload protocol without the transport. Upload is served on raw
// gRPC byte buffers (the data field goes from the wire slices straight into
// device memory), so its messages are parsed here by hand; the Runtime
// service's Upload reactor only resolves the target and orders the writes.
#ifndef OPSERVER_SERVER_UPLOAD_PARSER_H_
#define OPSERVER_SERVER_UPLOAD_PARSER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "devices/device.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/opserver.pb.h"

namespace opserver {

// Called for each data field with the stream positioned at its bytes; must
// consume exactly `length` of them. `length` never exceeds the bytes left
// in the message.
using UploadDataHandler = absl::FunctionRef<absl::Status(
    google::protobuf::io::CodedInputStream& input, uint32_t length)>;

// Walks the fields of one serialized UploadRequest. For the data field it
// calls `on_data`; every other field is stored into `header` (when not
// null) or skipped. INVALID_ARGUMENT for bytes that are not an
// UploadRequest.
absl::Status ParseUploadRequest(grpc::ByteBuffer* message,
                                v1::UploadRequest* header,
                                UploadDataHandler on_data);

// The fields of an upload's first message other than its data (which
// UploadWriter::Write copies once the target is known).
absl::StatusOr<v1::UploadRequest> ParseUploadHeader(grpc::ByteBuffer* message);

// Copies the data of an upload's messages, in order, into the `size` bytes
// at device address `target` of `device`: in place where the host can
// address it (Device::HostAddress), else staged and copied through
// `stream` (which the caller must not use meanwhile; null fails such an
// upload).
class UploadWriter {
 public:
  UploadWriter(Device* device, std::shared_ptr<DeviceStream> stream,
               char* target, uint64_t size)
      : device_(device),
        stream_(std::move(stream)),
        target_(target),
        size_(size) {}

  // Copies the data fields of `message` after what came before.
  // INVALID_ARGUMENT for a malformed message or data past `size`.
  absl::Status Write(grpc::ByteBuffer* message);

  // At the end of the input: INVALID_ARGUMENT unless exactly `size` bytes
  // were written.
  absl::Status Finish() const;

  uint64_t written() const { return written_; }

 private:
  Device* const device_;
  const std::shared_ptr<DeviceStream> stream_;
  char* const target_;
  const uint64_t size_;
  uint64_t written_ = 0;
  std::string staging_;  // Only for devices the host cannot address.
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_UPLOAD_PARSER_H_
