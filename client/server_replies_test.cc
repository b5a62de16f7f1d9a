#include "client/server_replies.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"
#include "proto/opserver.pb.h"

namespace opserver {
namespace remote {
namespace {

using ::testing::HasSubstr;

// A base-128 varint, as the wire writes lengths.
std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(0x80 | (v & 0x7f)));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

// A DownloadResponse whose data field (1, length-delimited) claims
// `claimed` bytes and is followed by `follow` bytes.
std::string LyingChunk(uint64_t claimed, size_t follow) {
  return "\x0a" + Varint(claimed) + std::string(follow, 'A');
}

absl::StatusOr<uint64_t> Parse(const std::string& message, char* out,
                               uint64_t at, uint64_t capacity,
                               int block_size = -1) {
  google::protobuf::io::ArrayInputStream input(
      message.data(), static_cast<int>(message.size()), block_size);
  return ParseDownloadChunk(&input, message.size(), out, at, capacity);
}

// The third review, finding 1: with 2 GiB or more left to download, a data
// length of 2^31 or more passed the room check and became a negative copy
// size. Every length beyond the bytes the message really has is refused
// before a byte is copied, whatever room the download has: `out` is 64
// bytes, so a copy would be an overflow ASan reports, and stays unwritten.
TEST(ParseDownloadChunkTest, LengthsBeyondTheMessageAreRefusedBeforeAnyCopy) {
  constexpr uint64_t kThreeGiB = uint64_t{3} << 30;
  for (const uint64_t claimed :
       {uint64_t{1} << 31, uint64_t{0xffffffff}, uint64_t{65}}) {
    for (const int block_size : {-1, 1, 7}) {
      SCOPED_TRACE(testing::Message()
                   << claimed << " in blocks of " << block_size);
      std::string out(64, '#');
      absl::StatusOr<uint64_t> n =
          Parse(LyingChunk(claimed, 64), out.data(), 0, kThreeGiB, block_size);
      EXPECT_EQ(n.status().code(), absl::StatusCode::kInternal) << n.status();
      EXPECT_THAT(n.status().message(),
                  HasSubstr("the server sent a message that is not a "
                            "DownloadResponse: its data claims "));
      EXPECT_THAT(n.status().message(), HasSubstr("but only 64 follow"));
      EXPECT_EQ(out, std::string(64, '#')) << "copied before refusing";
    }
  }
}

TEST(ParseDownloadChunkTest, CopiesTheDataAndSkipsUnknownFields) {
  v1::DownloadResponse response;
  response.set_data("hello");
  std::string message = response.SerializeAsString();
  message += "\x48\x2a";  // Field 9, varint 42: unknown.
  for (const int block_size : {-1, 1, 3}) {
    std::string out(10, '#');
    absl::StatusOr<uint64_t> n = Parse(message, out.data(), 2, 7, block_size);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, 5u);
    EXPECT_EQ(out, "##hello###");
  }
}

TEST(ParseDownloadChunkTest, DataBeyondTheDownloadIsRefused) {
  v1::DownloadResponse response;
  response.set_data("hello");
  std::string out(10, '#');
  absl::StatusOr<uint64_t> n =
      Parse(response.SerializeAsString(), out.data(), 6, 10);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(n.status().message(),
              HasSubstr("the server sent 5 bytes of data where 4 were left to "
                        "download"));
  EXPECT_EQ(out, std::string(10, '#'));
}

TEST(ParseDownloadChunkTest, MalformedMessagesAreRefused) {
  for (const std::string& message :
       {std::string("\x0a"), std::string("\x0a\x80"), std::string("\x0b"),
        std::string("\x00", 1), std::string("\x48"),
        // A tag, and a length, in 6 bytes (protobuf's parser takes 5).
        std::string("\x88\x80\x80\x80\x80\x00\x01", 7),
        std::string("\x0a\x81\x80\x80\x80\x80\x00x", 8),
        // An unknown group, and an unknown field longer than the message.
        std::string("\x13\x14"), std::string("\x12\x05" "abc")}) {
    std::string out(4, '#');
    absl::StatusOr<uint64_t> n = Parse(message, out.data(), 0, 4);
    EXPECT_EQ(n.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(n.status().message(),
                HasSubstr("the server sent a message that is not a "
                          "DownloadResponse"));
  }
}

v1::PipelineEvent Event(uint64_t acknowledged,
                        std::vector<v1::FenceResult> fences = {}) {
  v1::PipelineEvent event;
  event.set_acknowledged(acknowledged);
  for (v1::FenceResult& fence : fences) *event.add_fences() = fence;
  return event;
}

v1::FenceResult Result(uint64_t id, std::string data = "", int32_t code = 0) {
  v1::FenceResult result;
  result.set_id(id);
  result.set_data(std::move(data));
  result.set_code(code);
  return result;
}

// The third review, finding 2: results already taken were stored again
// when the server sent them again, without bound. A result for a fence the
// client no longer awaits ends the channel, and what is held never exceeds
// one result per awaited fence.
TEST(PipelineRepliesTest, ATakenResultSentAgainIsAViolation) {
  PipelineReplies replies;
  for (uint64_t id = 1; id <= 3; ++id) {
    replies.Await(id, 0);
    ASSERT_TRUE(replies.Apply(Event(id, {Result(id)}), id).ok());
    ASSERT_TRUE(replies.Take(id).has_value());
  }
  EXPECT_EQ(replies.awaited(), 0u);
  absl::Status replay = replies.Apply(Event(3, {Result(2)}), 3);
  EXPECT_EQ(replay.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(replay.message(),
            "the server sent a result for fence 2, which this client did not "
            "send, already took, or already has");
  EXPECT_EQ(replies.stored(), 0u);
}

TEST(PipelineRepliesTest, ResultsForFencesNotAwaitedAreViolations) {
  PipelineReplies replies;
  replies.Await(1, 0);
  EXPECT_FALSE(replies.Apply(Event(0, {Result(0)}), 1).ok());
  EXPECT_FALSE(replies.Apply(Event(0, {Result(2)}), 1).ok());
  // Answered twice before it was taken: the second is a violation, and
  // only one is held.
  ASSERT_TRUE(replies.Apply(Event(1, {Result(1)}), 1).ok());
  EXPECT_FALSE(replies.Apply(Event(1, {Result(1)}), 1).ok());
  EXPECT_EQ(replies.stored(), 1u);
  // Withdrawn (never sent): no result may come.
  replies.Await(2, 0);
  replies.Withdraw(2);
  EXPECT_FALSE(replies.Apply(Event(1, {Result(2)}), 1).ok());
}

TEST(PipelineRepliesTest, AForgottenResultIsDroppedOnceAndNotHeld) {
  PipelineReplies replies;
  replies.Await(1, 4);
  replies.Forget(1);
  ASSERT_TRUE(replies.Apply(Event(1, {Result(1, "abcd")}), 1).ok());
  EXPECT_EQ(replies.stored(), 0u);
  EXPECT_EQ(replies.awaited(), 0u);
  EXPECT_FALSE(replies.Apply(Event(1, {Result(1, "abcd")}), 1).ok());
  // Forgotten after it came: dropped at once.
  replies.Await(2, 0);
  ASSERT_TRUE(replies.Apply(Event(1, {Result(2)}), 1).ok());
  replies.Forget(2);
  EXPECT_EQ(replies.stored(), 0u);
  EXPECT_EQ(replies.awaited(), 0u);
}

// A read's bytes are exactly what it asked for: the server cannot make the
// client hold more than that (the receive limit, 64 MiB, per result).
TEST(PipelineRepliesTest, ReadBytesMustBeTheSizeAskedFor) {
  struct Case {
    uint64_t read_size;
    std::string data;
    int32_t code;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {4, "abc", 0, "the server sent 3 bytes for fence 1, a read of 4"},
           {4, "abcde", 0, "the server sent 5 bytes for fence 1, a read of 4"},
           {0, "x", 0, "the server sent 1 bytes for fence 1, a read of 0"},
           {4, "abcd", 3,
            "the server sent 4 bytes with the failed result of fence 1"},
       }) {
    PipelineReplies replies;
    replies.Await(1, c.read_size);
    absl::Status s = replies.Apply(Event(1, {Result(1, c.data, c.code)}), 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(s.message(), c.error);
    EXPECT_EQ(replies.stored(), 0u);
  }
  PipelineReplies replies;
  replies.Await(1, 4);
  ASSERT_TRUE(replies.Apply(Event(1, {Result(1, "abcd")}), 1).ok());
  EXPECT_EQ(replies.stored_bytes(), 4u);
  EXPECT_EQ(replies.Take(1)->data(), "abcd");
  EXPECT_EQ(replies.stored_bytes(), 0u);
}

TEST(PipelineRepliesTest, CodesMustBeGrpcCodesAndTextIsShortened) {
  for (const int32_t code : {-1, 17, INT32_MAX}) {
    PipelineReplies replies;
    replies.Await(1, 0);
    absl::Status s = replies.Apply(Event(1, {Result(1, "", code)}), 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(s.message(), HasSubstr("not a gRPC status code"));
  }
  PipelineReplies replies;
  replies.Await(1, 0);
  v1::FenceResult result = Result(1, "", 16);
  result.set_message(std::string(1 << 20, 'm'));
  ASSERT_TRUE(replies.Apply(Event(1, {result}), 1).ok());
  EXPECT_EQ(replies.stored_bytes(), kMaxFenceMessageBytes);
  EXPECT_EQ(replies.Take(1)->message().size(), kMaxFenceMessageBytes);
}

// The server's acknowledged count only grows, and never past what was
// written to it.
TEST(PipelineRepliesTest, AcknowledgementsGrowWithinWhatWasSent) {
  PipelineReplies replies;
  ASSERT_TRUE(replies.Apply(Event(0), 0).ok());
  ASSERT_TRUE(replies.Apply(Event(3), 5).ok());
  ASSERT_TRUE(replies.Apply(Event(3), 5).ok());
  EXPECT_EQ(replies.acknowledged(), 3u);
  absl::Status back = replies.Apply(Event(2), 5);
  EXPECT_EQ(back.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(back.message(),
            "the server acknowledged 2 commands after 3, with 5 sent");
  EXPECT_FALSE(replies.Apply(Event(6), 5).ok());
  EXPECT_EQ(replies.acknowledged(), 3u);
}

// A callback notice is accepted once per callback sent; anything else
// ends the channel.
TEST(PipelineRepliesTest, CallbackNoticesMatchTheCallbacksSent) {
  PipelineReplies replies;
  replies.AwaitCallback(4);
  replies.AwaitCallback(5);
  EXPECT_EQ(replies.UnnoticedCallbacks(), (std::vector<uint64_t>{4, 5}));
  v1::PipelineEvent event;
  event.add_callbacks()->set_id(5);
  ASSERT_TRUE(replies.Apply(event, 0).ok());
  std::vector<v1::CallbackNotice> notices = replies.TakeNotices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].id(), 5u);
  EXPECT_TRUE(replies.TakeNotices().empty());
  EXPECT_EQ(replies.UnnoticedCallbacks(), (std::vector<uint64_t>{4}));
  // Twice, or never sent.
  absl::Status again = replies.Apply(event, 0);
  EXPECT_EQ(again.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(again.message(),
            "the server sent a notice for callback 5, which this client did "
            "not send or heard of already");
  v1::PipelineEvent bad;
  v1::CallbackNotice* notice = bad.add_callbacks();
  notice->set_id(4);
  notice->set_code(99);
  EXPECT_THAT(replies.Apply(bad, 0).message(),
              HasSubstr("has code 99, not a gRPC status code"));
  // A long text is cut.
  replies.AwaitCallback(6);
  v1::PipelineEvent wordy;
  notice = wordy.add_callbacks();
  notice->set_id(6);
  notice->set_code(1);
  notice->set_message(std::string(1 << 20, 'm'));
  ASSERT_TRUE(replies.Apply(wordy, 0).ok());
  EXPECT_EQ(replies.TakeNotices()[0].message().size(), kMaxFenceMessageBytes);
}

}  // namespace
}  // namespace remote
}  // namespace opserver
