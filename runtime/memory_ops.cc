#include "runtime/memory_ops.h"

#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace opserver {
namespace {

absl::Status NoDevice() {
  return absl::FailedPreconditionError(
      "the stream has no device stream (the device could not create one)");
}

}  // namespace

absl::StatusOr<std::shared_ptr<Buffer>> BufferRange(Session& session,
                                                    uint64_t handle,
                                                    uint64_t offset,
                                                    uint64_t size,
                                                    absl::string_view what) {
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, session.GetBuffer(handle));
  const uint64_t capacity = buffer->size();
  if (offset > capacity || size > capacity - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        what, " [", offset, ", ", offset, " + ", size, ") is outside buffer ",
        handle, " of ", capacity, " bytes"));
  }
  return buffer;
}

absl::Status QueueMemset(Session& session, Stream& stream,
                         const v1::MemsetRequest& request) {
  if (request.value() > 0xff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memset value ", request.value(), " is not a byte (0 to 255)"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer,
                   BufferRange(session, request.buffer(), request.offset(),
                               request.size(), "memset of"));
  std::shared_ptr<DeviceStream> device = stream.device_stream();
  if (device == nullptr) return NoDevice();
  // The task holds the device stream, not the Stream (see LaunchExecutor).
  return stream.Enqueue([buffer = std::move(buffer), device,
                         offset = request.offset(), size = request.size(),
                         value = static_cast<int>(request.value())] {
    return device->Memset(static_cast<char*>(buffer->data()) + offset, value,
                          size);
  });
}

absl::Status QueueCopy(Session& session, Stream& stream,
                       const v1::CopyDeviceToDeviceRequest& request) {
  ASSIGN_OR_RETURN(
      std::shared_ptr<Buffer> src,
      BufferRange(session, request.src_buffer(), request.src_offset(),
                  request.size(), "copy source"));
  ASSIGN_OR_RETURN(
      std::shared_ptr<Buffer> dst,
      BufferRange(session, request.dst_buffer(), request.dst_offset(),
                  request.size(), "copy destination"));
  std::shared_ptr<DeviceStream> device = stream.device_stream();
  if (device == nullptr) return NoDevice();
  return stream.Enqueue([src = std::move(src), dst = std::move(dst), device,
                         src_offset = request.src_offset(),
                         dst_offset = request.dst_offset(),
                         size = request.size()] {
    return device->CopyOnDevice(
        static_cast<char*>(dst->data()) + dst_offset,
        static_cast<const char*>(src->data()) + src_offset, size);
  });
}

}  // namespace opserver
