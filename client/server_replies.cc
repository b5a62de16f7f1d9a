#include "client/server_replies.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace opserver {
namespace remote {

namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr absl::string_view kNotAResponse =
    "the server sent a message that is not a DownloadResponse";

// A tag or a length as protobuf's own parser takes it: at most 5 bytes
// (CodedInputStream takes up to 10 and drops the high bits, which would
// accept messages protobuf refuses).
bool ReadVarint32Strictly(CodedInputStream* input, uint32_t* value) {
  const int before = input->CurrentPosition();
  return input->ReadVarint32(value) && input->CurrentPosition() - before <= 5;
}

// The bytes of the message after the current position.
uint64_t Left(const CodedInputStream& input, uint64_t message_bytes) {
  const uint64_t position = static_cast<uint64_t>(input.CurrentPosition());
  return message_bytes > position ? message_bytes - position : 0;
}

// Skips the value of a field other than data. Groups are refused: no
// proto3 message has them.
bool SkipOther(CodedInputStream* input, uint32_t tag, uint64_t message_bytes) {
  switch (WireFormatLite::GetTagWireType(tag)) {
    case WireFormatLite::WIRETYPE_VARINT: {
      uint64_t value;
      return input->ReadVarint64(&value);
    }
    case WireFormatLite::WIRETYPE_FIXED64:
      return input->Skip(8);
    case WireFormatLite::WIRETYPE_FIXED32:
      return input->Skip(4);
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
      uint32_t size;
      return ReadVarint32Strictly(input, &size) &&
             size <= Left(*input, message_bytes) &&
             input->Skip(static_cast<int>(size));
    }
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<uint64_t> ParseDownloadChunk(
    google::protobuf::io::ZeroCopyInputStream* message, uint64_t message_bytes,
    char* out, uint64_t at, uint64_t capacity) {
  CodedInputStream input(message);
  const uint32_t data_tag =
      WireFormatLite::MakeTag(v1::DownloadResponse::kDataFieldNumber,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  uint64_t data_size = 0;
  for (;;) {
    const int before = input.CurrentPosition();
    const uint32_t tag = input.ReadTag();
    if (tag == 0) {
      // The end of the message, or a malformed tag.
      if (!input.ConsumedEntireMessage()) {
        return absl::InternalError(kNotAResponse);
      }
      return data_size;
    }
    // No field has number 0.
    if (input.CurrentPosition() - before > 5 ||
        WireFormatLite::GetTagFieldNumber(tag) == 0) {
      return absl::InternalError(kNotAResponse);
    }
    if (tag != data_tag) {
      if (!SkipOther(&input, tag, message_bytes)) {
        return absl::InternalError(kNotAResponse);
      }
      continue;
    }
    uint32_t size = 0;
    if (!ReadVarint32Strictly(&input, &size)) {
      return absl::InternalError(kNotAResponse);
    }
    // The length is the server's word: checked against the bytes the
    // message really has left before ReadRaw copies any (ReadRaw takes an
    // int, and a length of 2^31 or more would turn negative).
    const uint64_t left = Left(input, message_bytes);
    if (size > left || size > static_cast<uint64_t>(INT_MAX)) {
      return absl::InternalError(
          absl::StrCat(kNotAResponse, ": its data claims ", size,
                       " bytes, but only ", left, " follow"));
    }
    if (size > capacity - at) {
      return absl::InternalError(
          absl::StrCat("the server sent ", size, " bytes of data where ",
                       capacity - at, " were left to download"));
    }
    if (!input.ReadRaw(out + at, static_cast<int>(size))) {
      return absl::InternalError(kNotAResponse);
    }
    data_size = size;
  }
}

void PipelineReplies::Await(uint64_t id, uint64_t read_size) {
  awaited_[id] = Awaited{read_size, false};
}

void PipelineReplies::Forget(uint64_t id) {
  auto it = awaited_.find(id);
  if (it == awaited_.end()) return;
  if (std::optional<v1::FenceResult> dropped = Take(id); dropped.has_value()) {
    return;  // Take stopped awaiting it.
  }
  it->second.forgotten = true;
}

void PipelineReplies::Withdraw(uint64_t id) {
  awaited_.erase(id);
  if (auto it = results_.find(id); it != results_.end()) {
    stored_bytes_ -= it->second.data().size() + it->second.message().size();
    results_.erase(it);
  }
}

std::optional<v1::FenceResult> PipelineReplies::Take(uint64_t id) {
  auto it = results_.find(id);
  if (it == results_.end()) return std::nullopt;
  v1::FenceResult result = std::move(it->second);
  results_.erase(it);
  stored_bytes_ -= result.data().size() + result.message().size();
  awaited_.erase(id);
  return result;
}

absl::Status PipelineReplies::Apply(const v1::PipelineEvent& event,
                                    uint64_t sent) {
  // The server's count only grows (every event carries it), and it cannot
  // have applied commands it never got.
  if (event.acknowledged() < acknowledged_ || event.acknowledged() > sent) {
    return absl::InternalError(absl::StrCat(
        "the server acknowledged ", event.acknowledged(), " commands after ",
        acknowledged_, ", with ", sent, " sent"));
  }
  acknowledged_ = event.acknowledged();
  for (const v1::FenceResult& result : event.fences()) {
    RETURN_IF_ERROR(Store(result));
  }
  for (const v1::CallbackNotice& notice : event.callbacks()) {
    RETURN_IF_ERROR(Notice(notice));
  }
  return absl::OkStatus();
}

void PipelineReplies::AwaitCallback(uint64_t id) { callbacks_.insert(id); }

void PipelineReplies::WithdrawCallback(uint64_t id) { callbacks_.erase(id); }

std::vector<v1::CallbackNotice> PipelineReplies::TakeNotices() {
  return std::exchange(notices_, {});
}

std::vector<uint64_t> PipelineReplies::UnnoticedCallbacks() const {
  std::vector<uint64_t> ids(callbacks_.begin(), callbacks_.end());
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::Status PipelineReplies::Notice(v1::CallbackNotice notice) {
  const uint64_t id = notice.id();
  if (callbacks_.erase(id) == 0) {
    return absl::InternalError(absl::StrCat(
        "the server sent a notice for callback ", id,
        ", which this client did not send or heard of already"));
  }
  if (notice.code() < 0 ||
      notice.code() >
          static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(absl::StrCat("the server's notice for callback ",
                                            id, " has code ", notice.code(),
                                            ", not a gRPC status code"));
  }
  if (notice.message().size() > kMaxFenceMessageBytes) {
    notice.mutable_message()->resize(kMaxFenceMessageBytes);
  }
  notices_.push_back(std::move(notice));
  return absl::OkStatus();
}

absl::Status PipelineReplies::Store(v1::FenceResult result) {
  const uint64_t id = result.id();
  auto it = awaited_.find(id);
  if (it == awaited_.end() || results_.contains(id)) {
    return absl::InternalError(absl::StrCat(
        "the server sent a result for fence ", id,
        ", which this client did not send, already took, or already has"));
  }
  if (result.code() < 0 ||
      result.code() >
          static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(absl::StrCat("the server's result for fence ",
                                            id, " has code ", result.code(),
                                            ", not a gRPC status code"));
  }
  const uint64_t expected = result.code() == 0 ? it->second.read_size : 0;
  if (result.data().size() != expected) {
    return absl::InternalError(
        result.code() == 0
            ? absl::StrCat("the server sent ", result.data().size(),
                           " bytes for fence ", id, ", a read of ", expected)
            : absl::StrCat("the server sent ", result.data().size(),
                           " bytes with the failed result of fence ", id));
  }
  if (it->second.forgotten) {
    awaited_.erase(it);
    return absl::OkStatus();
  }
  // A hostile server's text, kept short.
  if (result.message().size() > kMaxFenceMessageBytes) {
    result.mutable_message()->resize(kMaxFenceMessageBytes);
  }
  stored_bytes_ += result.data().size() + result.message().size();
  results_.emplace(id, std::move(result));
  return absl::OkStatus();
}

}  // namespace remote
}  // namespace opserver
