// Messages of the raw (grpc::ByteBuffer) methods, parsed and serialized
// where the handler chooses (a worker, after the call was admitted) rather
// than by gRPC on its callback thread.
#ifndef OPSERVER_SERVER_RAW_MESSAGE_H_
#define OPSERVER_SERVER_RAW_MESSAGE_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/byte_buffer.h"

namespace opserver {

// Parses `bytes` (left as they are: the parse reads a copy sharing their
// slices) into `message`; INVALID_ARGUMENT `malformed` when they are not
// one.
template <typename Message>
absl::Status ParseRaw(const grpc::ByteBuffer& bytes, Message* message,
                      absl::string_view malformed) {
  grpc::ByteBuffer copy(bytes);
  if (!grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok()) {
    return absl::InvalidArgumentError(malformed);
  }
  return absl::OkStatus();
}

// Serializes `message` into `bytes`.
template <typename Message>
absl::Status SerializeRaw(const Message& message, grpc::ByteBuffer* bytes) {
  bool own_buffer = false;
  if (!grpc::SerializationTraits<Message>::Serialize(message, bytes,
                                                     &own_buffer)
           .ok()) {
    return absl::InternalError(
        absl::StrCat("cannot serialize a ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace opserver

#endif  // OPSERVER_SERVER_RAW_MESSAGE_H_
