// What a client parses of its server's answers (client/server_replies):
// Download's data chunks and the Pipeline channel's replies. A client does
// not trust its server, so nothing a server sends may crash it, make it
// copy outside the caller's range, or make it hold more than it asked for.
//
// The input's first byte picks the half:
//   even: a Download chunk. Byte 1: bit 7 gives the download 3 GiB of room
//         (the buffer is only as large as the message: a length the
//         message does not back would overflow it), bits 0-5 the size of
//         the pieces the message arrives in (0: one piece); byte 2 the
//         room otherwise, byte 3 where the chunk lands; the rest is the
//         message.
//   odd:  a script of a Pipeline channel's life: the client awaits fences
//         (plain or reads of up to 255 bytes), forgets, takes and withdraws
//         them, and the server's PipelineEvents (length-prefixed) arrive
//         between; a refused event ends the channel, as in CommandChannel.
//
// Invariants besides memory safety: an accepted chunk fits in the room
// left and matches what protobuf's own parser reads; a refused one is
// INTERNAL. Results held never outnumber the fences awaited, their bytes
// never exceed those reads' sizes plus kMaxFenceMessageBytes each; a taken
// result has a gRPC code, the read's exact size, and is never held again;
// the acknowledged count only grows and never passes the commands sent.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "client/server_replies.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/opserver.pb.h"

namespace opserver::fuzz {
namespace {

using remote::kMaxFenceMessageBytes;
using remote::PipelineReplies;

void FuzzDownloadChunk(const uint8_t* data, size_t size) {
  if (size < 4) return;
  const bool huge = (data[1] & 0x80) != 0;
  const int block = data[1] & 0x3f;
  const std::string message(reinterpret_cast<const char*>(data) + 4, size - 4);
  // Each buffer is its own heap block of exactly its size: ASan sees a
  // byte written past it.
  const uint64_t capacity = huge ? uint64_t{3} << 30 : data[2];
  const uint64_t buffer_bytes = huge ? message.size() : capacity;
  const uint64_t at = huge ? 0 : data[3] % (capacity + 1);
  std::unique_ptr<char[]> out(new char[buffer_bytes + 1]);
  google::protobuf::io::ArrayInputStream input(message.data(),
                                               static_cast<int>(message.size()),
                                               block == 0 ? -1 : block);
  absl::StatusOr<uint64_t> n = remote::ParseDownloadChunk(
      &input, message.size(), out.get(), at, capacity);
  Report("download chunk", n.status());
  if (!n.ok()) {
    FUZZ_CHECK(n.status().code() == absl::StatusCode::kInternal,
               n.status().ToString());
    return;
  }
  FUZZ_CHECK(*n <= capacity - at, *n, " bytes at ", at, " of ", capacity);
  v1::DownloadResponse parsed;
  FUZZ_CHECK(parsed.ParseFromString(message), "accepted what protobuf refuses");
  FUZZ_CHECK(parsed.data().size() == *n, *n, " bytes, protobuf reads ",
             parsed.data().size());
  FUZZ_CHECK(std::memcmp(out.get() + at, parsed.data().data(), *n) == 0,
             "the copied bytes differ from the message's");
}

// Reads a length-prefixed PipelineEvent at data[*at]; false when the input
// ends or the bytes are not one.
bool NextEvent(const uint8_t* data, size_t size, size_t* at,
               v1::PipelineEvent* event) {
  if (size - *at < 2) return false;
  const size_t length = data[*at] | size_t{data[*at + 1]} << 8;
  *at += 2;
  const size_t n = std::min(length, size - *at);
  const bool parsed = event->ParseFromArray(data + *at, static_cast<int>(n));
  *at += n;
  return parsed;
}

// The client's side of a Pipeline channel as the driver plays it: the
// replies parser, and the driver's own record of each fence awaited and
// not yet taken or withdrawn, with its read size.
class PipelineDriver {
 public:
  // Sends a fence; a read of `arg` bytes when op's bit 3 (which then
  // consumes `arg`).
  void SendFence(uint8_t op, uint8_t arg, size_t* at) {
    const uint64_t read_size = (op & 8) != 0 ? arg : 0;
    *at += (op & 8) != 0;
    replies_.Await(next_id_, read_size);
    awaited_[next_id_++] = read_size;
    ++sent_;
  }

  // Another command (a write, a launch) goes out.
  void SendOther(uint8_t arg) { sent_ += 1 + arg % 4; }

  // The client takes a result, or forgets a read when op's bit 3.
  void TakeOrForget(uint8_t op, uint8_t arg) {
    const uint64_t id = arg % (next_id_ + 1);
    if ((op & 8) != 0) {
      replies_.Forget(id);
      return;
    }
    const bool held = replies_.Has(id);
    std::optional<v1::FenceResult> result = replies_.Take(id);
    FUZZ_CHECK(result.has_value() == held, "Has and Take disagree on ", id);
    if (!result.has_value()) return;
    FUZZ_CHECK(awaited_.count(id) == 1, "took fence ", id,
               " that was never awaited");
    FUZZ_CHECK(result->code() >= 0 && result->code() <= 16, "code ",
               result->code());
    FUZZ_CHECK(
        result->data().size() == (result->code() == 0 ? awaited_[id] : 0),
        result->data().size(), " bytes for a read of ", awaited_[id]);
    FUZZ_CHECK(result->message().size() <= kMaxFenceMessageBytes,
               "a message of ", result->message().size(), " bytes");
    FUZZ_CHECK(!replies_.Has(id), "fence ", id, " held after it was taken");
    awaited_.erase(id);
  }

  // The last fence is withdrawn: it was never written.
  void WithdrawLast() {
    if (next_id_ == 1 || awaited_.count(next_id_ - 1) == 0 ||
        replies_.acknowledged() == sent_) {
      return;
    }
    replies_.Withdraw(next_id_ - 1);
    awaited_.erase(next_id_ - 1);
    --sent_;
  }

  // The server's next event; false when the input or the channel ends.
  bool ApplyEvent(const uint8_t* data, size_t size, size_t* at) {
    v1::PipelineEvent event;
    if (!NextEvent(data, size, at, &event)) return false;
    const uint64_t before = replies_.acknowledged();
    absl::Status applied = replies_.Apply(event, sent_);
    Report("event", applied);
    FUZZ_CHECK(
        replies_.acknowledged() >= before && replies_.acknowledged() <= sent_,
        "acknowledged ", replies_.acknowledged(), " after ", before, " with ",
        sent_, " sent");
    if (!applied.ok()) {
      FUZZ_CHECK(applied.code() == absl::StatusCode::kInternal,
                 applied.ToString());
      FUZZ_CHECK(applied.message().size() <= 256, "an error of ",
                 applied.message().size(), " bytes");
      return false;  // The channel ends.
    }
    FUZZ_CHECK(replies_.acknowledged() == event.acknowledged(), "acknowledged ",
               replies_.acknowledged(), " of ", event.acknowledged());
    return true;
  }

  // What a server can make the client hold: one result per fence
  // awaited, each at most its read's bytes and a short message.
  void CheckBounds() const {
    uint64_t read_bytes = 0;
    for (const auto& [id, read_size] : awaited_) read_bytes += read_size;
    FUZZ_CHECK(replies_.awaited() <= awaited_.size(), replies_.awaited(),
               " awaited of ", awaited_.size());
    FUZZ_CHECK(replies_.stored() <= awaited_.size(), replies_.stored(),
               " results held for ", awaited_.size(), " fences");
    FUZZ_CHECK(replies_.stored_bytes() <=
                   read_bytes + replies_.stored() * kMaxFenceMessageBytes,
               replies_.stored_bytes(), " bytes held");
  }

 private:
  PipelineReplies replies_;
  std::map<uint64_t, uint64_t> awaited_;
  uint64_t next_id_ = 1;
  uint64_t sent_ = 0;
};

void FuzzPipelineReplies(const uint8_t* data, size_t size) {
  PipelineDriver driver;
  size_t at = 1;
  while (at < size) {
    const uint8_t op = data[at++];
    const uint8_t arg = at < size ? data[at] : 0;
    switch ((op & 7) % 5) {  // Bit 3 is a flag of the op.
      case 0:
        driver.SendFence(op, arg, &at);
        break;
      case 1:
        driver.SendOther(arg);
        ++at;
        break;
      case 2:
        ++at;
        driver.TakeOrForget(op, arg);
        break;
      case 3:
        driver.WithdrawLast();
        break;
      case 4:
        if (!driver.ApplyEvent(data, size, &at)) return;
        break;
    }
    driver.CheckBounds();
  }
}

}  // namespace
}  // namespace opserver::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  opserver::fuzz::QuietProtobuf();
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    opserver::fuzz::FuzzDownloadChunk(data, size);
  } else {
    opserver::fuzz::FuzzPipelineReplies(data, size);
  }
  return 0;
}
