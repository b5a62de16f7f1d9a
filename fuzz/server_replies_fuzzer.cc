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

void FuzzPipelineReplies(const uint8_t* data, size_t size) {
  PipelineReplies replies;
  // The driver's own record: each fence awaited and not yet taken or
  // withdrawn, with its read size.
  std::map<uint64_t, uint64_t> awaited;
  uint64_t next_id = 1;
  uint64_t sent = 0;
  auto pick = [&](uint8_t b) -> uint64_t { return b % (next_id + 1); };
  size_t at = 1;
  while (at < size) {
    const uint8_t op = data[at++];
    const uint8_t arg = at < size ? data[at] : 0;
    switch ((op & 7) % 5) {  // Bit 3 is a flag of the op.
      case 0: {  // Send a fence; a read of `arg` bytes when op's bit 3.
        const uint64_t read_size = (op & 8) != 0 ? arg : 0;
        at += (op & 8) != 0;
        replies.Await(next_id, read_size);
        awaited[next_id++] = read_size;
        ++sent;
        break;
      }
      case 1:  // Another command (a write, a launch) goes out.
        sent += 1 + arg % 4;
        ++at;
        break;
      case 2: {  // The client takes a result, or forgets a read.
        const uint64_t id = pick(arg);
        ++at;
        if ((op & 8) != 0) {
          replies.Forget(id);
          break;
        }
        const bool held = replies.Has(id);
        std::optional<v1::FenceResult> result = replies.Take(id);
        FUZZ_CHECK(result.has_value() == held, "Has and Take disagree on ", id);
        if (!result.has_value()) break;
        FUZZ_CHECK(awaited.count(id) == 1, "took fence ", id,
                   " that was never awaited");
        FUZZ_CHECK(result->code() >= 0 && result->code() <= 16, "code ",
                   result->code());
        FUZZ_CHECK(
            result->data().size() == (result->code() == 0 ? awaited[id] : 0),
            result->data().size(), " bytes for a read of ", awaited[id]);
        FUZZ_CHECK(result->message().size() <= kMaxFenceMessageBytes,
                   "a message of ", result->message().size(), " bytes");
        FUZZ_CHECK(!replies.Has(id), "fence ", id, " held after it was taken");
        awaited.erase(id);
        break;
      }
      case 3: {  // The last fence is withdrawn: it was never written.
        if (next_id == 1 || awaited.count(next_id - 1) == 0 ||
            replies.acknowledged() == sent) {
          break;
        }
        replies.Withdraw(next_id - 1);
        awaited.erase(next_id - 1);
        --sent;
        break;
      }
      case 4: {  // The server's next event.
        v1::PipelineEvent event;
        if (!NextEvent(data, size, &at, &event)) return;
        const uint64_t before = replies.acknowledged();
        absl::Status applied = replies.Apply(event, sent);
        Report("event", applied);
        FUZZ_CHECK(
            replies.acknowledged() >= before && replies.acknowledged() <= sent,
            "acknowledged ", replies.acknowledged(), " after ", before,
            " with ", sent, " sent");
        if (!applied.ok()) {
          FUZZ_CHECK(applied.code() == absl::StatusCode::kInternal,
                     applied.ToString());
          FUZZ_CHECK(applied.message().size() <= 256, "an error of ",
                     applied.message().size(), " bytes");
          return;  // The channel ends.
        }
        FUZZ_CHECK(replies.acknowledged() == event.acknowledged(),
                   "acknowledged ", replies.acknowledged(), " of ",
                   event.acknowledged());
        break;
      }
    }
    // What a server can make the client hold: one result per fence
    // awaited, each at most its read's bytes and a short message.
    uint64_t read_bytes = 0;
    for (const auto& [id, read_size] : awaited) read_bytes += read_size;
    FUZZ_CHECK(replies.awaited() <= awaited.size(), replies.awaited(),
               " awaited of ", awaited.size());
    FUZZ_CHECK(replies.stored() <= awaited.size(), replies.stored(),
               " results held for ", awaited.size(), " fences");
    FUZZ_CHECK(replies.stored_bytes() <=
                   read_bytes + replies.stored() * kMaxFenceMessageBytes,
               replies.stored_bytes(), " bytes held");
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
