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
#include "absl/types/span.h"
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
// address it (Device::HostAddress), else through the staging of `stream`
// (DeviceStream::StageUpload, in chunks of `chunk_bytes` whatever the
// messages' sizes, so that the device may copy one chunk while the next
// arrives; the caller must not use `stream` meanwhile; null fails such an
// upload).
class UploadWriter {
 public:
  UploadWriter(Device* device, std::shared_ptr<DeviceStream> stream,
               char* target, uint64_t size, uint64_t chunk_bytes)
      : device_(device),
        stream_(std::move(stream)),
        target_(target),
        size_(size),
        chunk_bytes_(chunk_bytes) {}

  // Copies the data fields of `message` after what came before.
  // INVALID_ARGUMENT for a malformed message or data past `size`; a staged
  // copy's error.
  absl::Status Write(grpc::ByteBuffer* message);

  // At the end of the input: INVALID_ARGUMENT unless exactly `size` bytes
  // were written; else waits until the staged copies are done (their
  // error).
  //
  // A failed Write or Finish still leaves every byte it received in the
  // buffer, whether the device is host-addressable or staged, and however
  // the messages were sliced.
  absl::Status Finish();

  uint64_t written() const { return written_; }

 private:
  // Reads `length` bytes of `input` into the staging, chunk by chunk.
  absl::Status Stage(google::protobuf::io::CodedInputStream& input,
                     uint32_t length);
  // Ends the staged copy, on success and on failure alike
  // (StagedUpload::End): commits the chunk being filled as far as it is and
  // waits until every committed chunk is copied (their error).
  absl::Status EndStaging();

  Device* const device_;
  const std::shared_ptr<DeviceStream> stream_;
  char* const target_;
  const uint64_t size_;
  const uint64_t chunk_bytes_;
  uint64_t written_ = 0;
  // Only for devices the host cannot address (made at the first data; goes
  // before `stream_`, whose copies it runs): the staging chunk being
  // filled, and how much of it is.
  std::unique_ptr<StagedUpload> staged_;
  absl::Span<char> chunk_;
  uint64_t filled_ = 0;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_UPLOAD_PARSER_H_
