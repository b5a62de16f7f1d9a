#include "common/transfer_framing.h"

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/opserver.pb.h"

namespace opserver {
namespace {

std::string LengthDelimitedPrefix(int field_number, uint64_t size) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  // A tag takes at most 5 bytes, a 64-bit varint at most 10.
  uint8_t bytes[16];
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(field_number,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      bytes);
  end = CodedOutputStream::WriteVarint64ToArray(size, end);
  return std::string(reinterpret_cast<const char*>(bytes), end - bytes);
}

}  // namespace

std::string UploadDataPrefix(uint64_t size) {
  return LengthDelimitedPrefix(v1::UploadRequest::kDataFieldNumber, size);
}

std::string DownloadDataPrefix(uint64_t size) {
  return LengthDelimitedPrefix(v1::DownloadResponse::kDataFieldNumber, size);
}

}  // namespace opserver
