// The transport's data path as the runtime sees it: the CommandPipeline
// checks a data_transfer command (DataTransferCommand in
// proto/opserver.proto) against its session and hands it here, and the
// server (server/data_transfer.cc) moves its bytes over a connection of
// its data listener. So the runtime stays free of sockets.
#ifndef OPSERVER_RUNTIME_DATA_TRANSFERS_H_
#define OPSERVER_RUNTIME_DATA_TRANSFERS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/opserver.pb.h"
#include "runtime/buffer.h"
#include "runtime/stream.h"

namespace opserver {

// What OpenDataTransfer and the data_transfer command both answer a
// server without a data path.
inline absl::Status NoDataPath() {
  return absl::UnimplementedError(
      "this server has no data path (it is off with TLS and with "
      "--data_port=-1): use Upload and Download");
}

// Whether `direction` is an upload (DIRECTION_HOST_TO_DEVICE) or a
// download; INVALID_ARGUMENT for any other value (the rule both share).
inline absl::StatusOr<bool> IsUpload(
    v1::OpenDataTransferRequest::Direction direction) {
  using Request = v1::OpenDataTransferRequest;
  if (direction != Request::DIRECTION_HOST_TO_DEVICE &&
      direction != Request::DIRECTION_DEVICE_TO_HOST) {
    return absl::InvalidArgumentError(
        "direction: DIRECTION_HOST_TO_DEVICE or DIRECTION_DEVICE_TO_HOST");
  }
  return direction == Request::DIRECTION_HOST_TO_DEVICE;
}

class DataTransfers {
 public:
  // buffer[offset, offset + size), checked, to move to (`upload`) or from
  // the connection that presents `ticket` (the client's, unchecked),
  // ordered on `stream`.
  struct Request {
    std::shared_ptr<Stream> stream;
    std::shared_ptr<Buffer> buffer;
    uint64_t offset = 0;
    uint64_t size = 0;
    bool upload = false;
    std::string ticket;
    // Whose transfer it is (the session): only it may cancel it.
    const void* owner = nullptr;
  };

  virtual ~DataTransfers() = default;

  // Queues the transfer on its stream; once the stream reaches it and the
  // connection has come, its bytes move, and a failure then becomes the
  // stream's deferred error. An error here (a malformed or reused ticket,
  // a cancelled stream): nothing was queued.
  virtual absl::Status Start(Request request) = 0;
  // The command carrying `ticket` was refused: a connection presenting it
  // is closed, so its client stops waiting.
  virtual void Refuse(const std::string& ticket) = 0;
  // `owner`'s client gives up the transfer of `ticket`: ended now if its
  // connection has not come, and its failure is not its stream's error.
  // Unknown tickets (and others' and finished ones) are ignored.
  virtual void Cancel(const void* owner, const std::string& ticket) = 0;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_DATA_TRANSFERS_H_
