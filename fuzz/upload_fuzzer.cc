// The raw Upload parser: the input is the bytes of an Upload call's
// messages, given to ParseUploadHeader and UploadWriter (what the Upload
// reactor calls) as gRPC byte buffers:
//   1. the whole input as one message in one slice,
//   2. the same message in three slices (the parser reads across them),
//   3. the input split in two messages at its middle (a header message,
//      then a data message),
// each into buffer 1 of the session (4 KiB, an exact heap block), once on
// a host-addressable device (data read straight into the buffer) and once
// on one that is not (through the staging copy).
//
// Invariants besides memory safety: slicing a message differently changes
// nothing (same outcome, same bytes written, same buffer contents, a failed
// upload's too: through staging, the chunk it was filling is copied as far
// as it got); no more bytes are written than the header announced.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/fuzz_support.h"
#include "grpc/grpc.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/opserver.pb.h"
#include "runtime/byte_range.h"
#include "server/upload_parser.h"

namespace {

constexpr uint64_t kBufferBytes = 4096;
constexpr uint64_t kBufferHandle = 1;

struct Outcome {
  absl::Status status;
  uint64_t written = 0;
  std::string contents;  // The buffer afterwards.
};

// One message of `pieces` slices.
grpc::ByteBuffer Message(const std::vector<std::string>& pieces) {
  std::vector<grpc::Slice> slices;
  for (const std::string& piece : pieces) slices.emplace_back(piece);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The Upload reactor's sequence over `messages`, without the transport.
Outcome RunUpload(std::vector<grpc::ByteBuffer> messages,
                  bool host_addressable) {
  using namespace opserver;
  Outcome outcome;
  std::unique_ptr<char[]> buffer(new char[kBufferBytes]());
  fuzz::HeapDevice device(0, host_addressable);
  auto finish = [&](absl::Status status, uint64_t written) {
    outcome.status = std::move(status);
    outcome.written = written;
    outcome.contents.assign(buffer.get(), kBufferBytes);
    return outcome;
  };
  if (messages.empty()) {
    return finish(absl::InvalidArgumentError("no header"), 0);
  }
  absl::StatusOr<v1::UploadRequest> header = ParseUploadHeader(&messages[0]);
  if (!header.ok()) return finish(header.status(), 0);
  // ResolveTransfer: the session has one buffer.
  if (header->buffer() != kBufferHandle) {
    return finish(absl::NotFoundError("no such buffer"), 0);
  }
  if (absl::Status s = CheckRange(header->offset(), header->size(),
                                  kBufferBytes, "upload range");
      !s.ok()) {
    return finish(s, 0);
  }
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = device.CreateStream();
  if (!stream.ok()) return finish(stream.status(), 0);
  // Small staging chunks, so that messages span chunks and chunks span
  // messages.
  UploadWriter writer(&device, *std::move(stream),
                      buffer.get() + header->offset(), header->size(),
                      /*chunk_bytes=*/7);
  for (grpc::ByteBuffer& message : messages) {
    if (absl::Status s = writer.Write(&message); !s.ok()) {
      return finish(s, writer.written());
    }
    FUZZ_CHECK(writer.written() <= header->size(), writer.written(),
               " bytes written of ", header->size());
  }
  return finish(writer.Finish(), writer.written());
}

// `b` is `a` sliced or copied another way.
void CheckSame(const Outcome& a, const Outcome& b, const char* what) {
  FUZZ_CHECK(a.status.code() == b.status.code(), what, ": ",
             a.status.ToString(), " vs ", b.status.ToString());
  FUZZ_CHECK(a.written == b.written, what, ": ", a.written, " vs ", b.written,
             " bytes written");
  FUZZ_CHECK(a.contents == b.contents, what, ": buffer contents differ");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // gRPC stays initialized: otherwise the last byte buffer of each input
  // shuts the library down (and the next starts it again), which costs
  // milliseconds.
  static const bool grpc_initialized = (grpc_init(), true);
  (void)grpc_initialized;
  const std::string input(reinterpret_cast<const char*>(data), size);
  // 1. One message, one slice, on both kinds of device.
  const Outcome whole = RunUpload({Message({input})}, true);
  opserver::fuzz::Report(absl::StrCat("one message, ", whole.written, " bytes"),
                         whole.status);
  CheckSame(whole, RunUpload({Message({input})}, false), "staging copy");
  // 2. One message in three slices.
  const size_t a = size / 3, b = 2 * size / 3;
  CheckSame(whole,
            RunUpload({Message({input.substr(0, a), input.substr(a, b - a),
                                input.substr(b)})},
                      true),
            "three slices");
  // 3. Two messages.
  const size_t half = size / 2;
  const Outcome two = RunUpload(
      {Message({input.substr(0, half)}), Message({input.substr(half)})}, true);
  opserver::fuzz::Report(absl::StrCat("two messages, ", two.written, " bytes"),
                         two.status);
  return 0;
}
