// The client's checks of what a server answers, apart from any transport so
// that tests and fuzzers drive them without gRPC: Download's data chunks
// and the Pipeline channel's replies. A client treats every byte from its
// server as hostile, as the server does its clients': a length, count or id
// is checked before it is used, and what a server can make the client hold
// is bounded by what the client asked for.
#ifndef OPSERVER_CLIENT_SERVER_REPLIES_H_
#define OPSERVER_CLIENT_SERVER_REPLIES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "proto/opserver.pb.h"

namespace opserver {
namespace remote {

// Parses one serialized DownloadResponse, `message_bytes` long, read from
// `message`, copying its data straight into out[at, capacity) (the only
// copy of the data on the client). Returns the data's size. INTERNAL when
// the message is not a DownloadResponse (malformed, or a data field longer
// than the bytes left in the message) or its data does not fit in what is
// left of the download; a data field is refused before any of its bytes is
// copied. Unknown fields are skipped; a repeated data field replaces the
// previous one, as protobuf's own parser would. What protobuf's parser
// refuses is refused too (a tag or length longer than 5 bytes), and so are
// groups, which no proto3 message has.
absl::StatusOr<uint64_t> ParseDownloadChunk(
    google::protobuf::io::ZeroCopyInputStream* message, uint64_t message_bytes,
    char* out, uint64_t at, uint64_t capacity);

// The most bytes of a server's error text a fence result keeps.
inline constexpr size_t kMaxFenceMessageBytes = 4096;

// The replies of one Pipeline channel (PipelineEvents): the acknowledged
// count, and the results of the fences the client awaits. A reply the
// protocol does not allow is INTERNAL from Apply, and the channel ends:
//   - an acknowledged count that goes back, or beyond the commands sent;
//   - a result for a fence the client did not send, already took, or
//     already has (the server answers each fence once);
//   - a result whose code is not a canonical gRPC code;
//   - an OK read whose bytes are not the size asked for, or bytes on a
//     failed read or on a fence that reads nothing.
// So at most one result is held per awaited fence, with at most its read's
// size of data and kMaxFenceMessageBytes of text.
//
// Thread-compatible: CommandChannel calls it under its mutex.
class PipelineReplies {
 public:
  // Fence `id` (ids are never reused) is about to be sent; an OK result
  // must carry `read_size` bytes (0 for a fence that reads nothing).
  void Await(uint64_t id, uint64_t read_size);
  // The client will not take `id`'s result: dropped now if it came, or
  // when it comes. Nothing for an id not awaited.
  void Forget(uint64_t id);
  // Fence `id` was not sent after all: no result may come for it.
  void Withdraw(uint64_t id);

  // Callback `id` (CallbackCommand; ids are never reused) is about to be
  // sent: exactly one notice may come for it.
  void AwaitCallback(uint64_t id);
  // Callback `id` was not sent after all.
  void WithdrawCallback(uint64_t id);
  // The notices Apply accepted since the last call, in the server's order
  // (each at most kMaxFenceMessageBytes of text).
  std::vector<v1::CallbackNotice> TakeNotices();
  // Callbacks sent whose notice has not come, in id order (for a channel
  // that ends: each is told).
  std::vector<uint64_t> UnnoticedCallbacks() const;

  // Applies one event of the server; `sent`: the commands handed to the
  // transport so far (the server cannot have applied more).
  absl::Status Apply(const v1::PipelineEvent& event, uint64_t sent);

  uint64_t acknowledged() const { return acknowledged_; }
  bool Has(uint64_t id) const { return results_.contains(id); }
  // Takes `id`'s result, if it came; `id` is then no longer awaited.
  std::optional<v1::FenceResult> Take(uint64_t id);

  // Fences sent and not yet taken or forgotten-and-answered.
  size_t awaited() const { return awaited_.size(); }
  // Results held, and the bytes of their data and text.
  size_t stored() const { return results_.size(); }
  uint64_t stored_bytes() const { return stored_bytes_; }

 private:
  struct Awaited {
    uint64_t read_size;
    bool forgotten;
  };
  absl::Status Store(v1::FenceResult result);
  absl::Status Notice(v1::CallbackNotice notice);

  uint64_t acknowledged_ = 0;
  absl::flat_hash_map<uint64_t, Awaited> awaited_;
  absl::flat_hash_map<uint64_t, v1::FenceResult> results_;
  uint64_t stored_bytes_ = 0;
  absl::flat_hash_set<uint64_t> callbacks_;  // Sent, not yet noticed.
  std::vector<v1::CallbackNotice> notices_;
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_SERVER_REPLIES_H_
