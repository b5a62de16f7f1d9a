// How Upload and Download carry their bytes without copying them into a
// message: each message is the serialized fields other than `data`, then
// the data field's tag and length (the prefix below), then the data itself
// as a slice of its own that points at the caller's memory or the device
// buffer. The field numbers come from the generated code, so the two ends
// cannot disagree with the .proto. Both ends use these: the server's
// Download writer and the client's Upload writer.
#ifndef OPSERVER_COMMON_TRANSFER_FRAMING_H_
#define OPSERVER_COMMON_TRANSFER_FRAMING_H_

#include <cstdint>
#include <string>

namespace opserver {

// The tag and varint length that precede `size` bytes of UploadRequest.data.
std::string UploadDataPrefix(uint64_t size);
// The same for DownloadResponse.data.
std::string DownloadDataPrefix(uint64_t size);

}  // namespace opserver

#endif  // OPSERVER_COMMON_TRANSFER_FRAMING_H_
