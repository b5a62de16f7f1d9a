#include "server/upload_parser.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace opserver {
namespace {

// UploadRequest's field numbers, from the generated code: a renumbered
// field in the proto cannot leave this parser behind.
constexpr int kUploadSession = v1::UploadRequest::kSessionFieldNumber;
constexpr int kUploadBuffer = v1::UploadRequest::kBufferFieldNumber;
constexpr int kUploadOffset = v1::UploadRequest::kOffsetFieldNumber;
constexpr int kUploadSize = v1::UploadRequest::kSizeFieldNumber;
constexpr int kUploadStream = v1::UploadRequest::kStreamFieldNumber;
constexpr int kUploadData = v1::UploadRequest::kDataFieldNumber;

// The header's integer fields, by number.
bool IsHeaderInteger(int field) {
  return field == kUploadBuffer || field == kUploadOffset ||
         field == kUploadSize || field == kUploadStream;
}

using WireFormat = google::protobuf::internal::WireFormatLite;

absl::Status Malformed() {
  return absl::InvalidArgumentError("malformed UploadRequest message");
}

}  // namespace

absl::Status ParseUploadRequest(grpc::ByteBuffer* message,
                                v1::UploadRequest* header,
                                UploadDataHandler on_data) {
  // The wire's length prefixes are hostile: gRPC never compares them with
  // the message (Upload is served on raw bytes), and protobuf's ReadRaw
  // takes an int and does not refuse a negative one (a
  // length of 2^31 became a memcpy of 2^64 - 2^31 bytes). So every length is
  // checked against the bytes really left in this message first.
  const size_t message_size = message->Length();
  if (message_size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError("UploadRequest message over 2 GiB");
  }
  grpc::ProtoBufferReader reader(message);
  google::protobuf::io::CodedInputStream input(&reader);
  input.SetTotalBytesLimit(std::numeric_limits<int>::max());
  while (uint32_t tag = input.ReadTag()) {
    const int field = WireFormat::GetTagFieldNumber(tag);
    const auto wire = WireFormat::GetTagWireType(tag);
    if (field == kUploadData && wire == WireFormat::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t length;
      if (!input.ReadVarint32(&length)) return Malformed();
      const size_t left = message_size - input.CurrentPosition();
      if (length > left) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed UploadRequest message: data field of ", length,
            " bytes, but only ", left, " left in the message"));
      }
      RETURN_IF_ERROR(on_data(input, length));
      continue;
    }
    if (header != nullptr && wire == WireFormat::WIRETYPE_VARINT &&
        IsHeaderInteger(field)) {
      uint64_t value;
      if (!input.ReadVarint64(&value)) return Malformed();
      if (field == kUploadBuffer) header->set_buffer(value);
      if (field == kUploadOffset) header->set_offset(value);
      if (field == kUploadSize) header->set_size(value);
      if (field == kUploadStream) header->set_stream(value);
      continue;
    }
    if (header != nullptr && field == kUploadSession &&
        wire == WireFormat::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormat::ReadString(&input, header->mutable_session())) {
        return Malformed();
      }
      continue;
    }
    if (!WireFormat::SkipField(&input, tag)) return Malformed();
  }
  if (!input.ConsumedEntireMessage()) return Malformed();
  return absl::OkStatus();
}

absl::StatusOr<v1::UploadRequest> ParseUploadHeader(grpc::ByteBuffer* message) {
  v1::UploadRequest header;
  absl::Status parsed = ParseUploadRequest(
      message, &header,
      [](google::protobuf::io::CodedInputStream& input, uint32_t length) {
        return input.Skip(static_cast<int>(length)) ? absl::OkStatus()
                                                    : Malformed();
      });
  if (!parsed.ok()) return parsed;
  return header;
}

absl::Status UploadWriter::Write(grpc::ByteBuffer* message) {
  absl::Status status = ParseUploadRequest(
      message, nullptr,
      [&](google::protobuf::io::CodedInputStream& input,
          uint32_t length) -> absl::Status {
        if (length > size_ - written_) {
          return absl::InvalidArgumentError(
              absl::StrCat("upload sent more than the ", size_,
                           " bytes its header announced"));
        }
        if (void* host = device_->HostAddress(target_ + written_);
            host != nullptr) {
          if (!input.ReadRaw(host, static_cast<int>(length))) {
            return Malformed();
          }
        } else {
          RETURN_IF_ERROR(Stage(input, length));
        }
        written_ += length;
        return absl::OkStatus();
      });
  // The upload has failed already and says why; a copy that fails here
  // adds nothing to that.
  if (!status.ok()) EndStaging().IgnoreError();
  return status;
}

absl::Status UploadWriter::Stage(google::protobuf::io::CodedInputStream& input,
                                 uint32_t length) {
  if (stream_ == nullptr) {
    return absl::FailedPreconditionError(
        "the stream has no device stream to copy through");
  }
  if (staged_ == nullptr) {
    staged_ = stream_->StageUpload(target_, size_, chunk_bytes_);
  }
  // A message's data may fill several chunks, and a chunk take several
  // messages.
  while (length > 0) {
    if (chunk_.empty()) {
      ASSIGN_OR_RETURN(chunk_, staged_->Next());
      filled_ = 0;
    }
    const auto n = static_cast<uint32_t>(
        std::min<uint64_t>(length, chunk_.size() - filled_));
    if (!input.ReadRaw(chunk_.data() + filled_, static_cast<int>(n))) {
      return Malformed();
    }
    filled_ += n;
    length -= n;
    if (filled_ == chunk_.size()) {
      chunk_ = {};
      RETURN_IF_ERROR(staged_->Commit(filled_));
    }
  }
  return absl::OkStatus();
}

absl::Status UploadWriter::Finish() {
  if (written_ != size_) {
    EndStaging().IgnoreError();  // As in Write.
    return absl::InvalidArgumentError(
        absl::StrCat("upload ended after ", written_, " of the ", size_,
                     " bytes its header announced"));
  }
  return EndStaging();
}

absl::Status UploadWriter::EndStaging() {
  if (staged_ == nullptr) return absl::OkStatus();
  // Only a failed upload ends inside a chunk.
  const uint64_t open = chunk_.empty() ? 0 : filled_;
  chunk_ = {};
  return staged_->End(open);
}

}  // namespace opserver
