// Host callbacks as a person drives them (Operators.LaunchCallback and
// ReleaseCallback with grpcurl) and as a client speaks the Pipeline by
// hand: the notice, the hold of a blocking callback, and refusals with
// their exact codes.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace remote {
namespace {

using ::testing::HasSubstr;

class CallbacksRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ConnectOptions connect;
    connect.pipeline = false;
    auto client = Client::Connect(server_->address(), connect);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("callbacks", /*attach=*/false);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  grpc::Status Launch(uint64_t id, bool block, uint64_t stream = 0) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::minutes(1));
    v1::LaunchCallbackRequest request;
    request.set_session(session_->token());
    request.set_id(id);
    request.set_block(block);
    request.set_stream(stream);
    v1::LaunchCallbackResponse response;
    return client_->operators().LaunchCallback(&context, request, &response);
  }
  grpc::Status Release(uint64_t id) {
    grpc::ClientContext context;
    v1::ReleaseCallbackRequest request;
    request.set_session(session_->token());
    request.set_id(id);
    v1::ReleaseCallbackResponse response;
    return client_->operators().ReleaseCallback(&context, request, &response);
  }
  // SynchronizeStream that gives up after `wait`.
  grpc::Status Synchronize(absl::Duration wait) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + wait));
    v1::SynchronizeStreamRequest request;
    request.set_session(session_->token());
    v1::SynchronizeStreamResponse response;
    return client_->runtime().SynchronizeStream(&context, request, &response);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(CallbacksRpcTest, UnaryBlockingCallbackHoldsTheStreamUntilReleased) {
  // Answered once the (idle) stream reached it.
  ASSERT_TRUE(Launch(4, /*block=*/true).ok());
  // The stream is held: a synchronize cannot finish, however long.
  EXPECT_EQ(Synchronize(absl::Milliseconds(100)).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(Release(4).ok());
  EXPECT_TRUE(Synchronize(absl::Minutes(1)).ok());
  grpc::Status again = Release(4);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(again.error_message(),
              HasSubstr("no blocking callback 4 holds a stream"));
  // A non-blocking one holds nothing.
  ASSERT_TRUE(Launch(5, /*block=*/false).ok());
  EXPECT_TRUE(Synchronize(absl::Minutes(1)).ok());
  EXPECT_EQ(Release(5).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CallbacksRpcTest, UnaryRefusals) {
  EXPECT_EQ(Launch(1, false, /*stream=*/777).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Launch(2, true).ok());
  // Its id is pending: a second blocking one under it is refused (and the
  // call does not wait for the held stream).
  grpc::Status twice = Launch(2, true);
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(twice.error_message(), HasSubstr("blocking callback 2 is "
                                               "still pending"));
  ASSERT_TRUE(Release(2).ok());
}

TEST_F(CallbacksRpcTest, PipelineNoticesAndRelease) {
  grpc::ClientContext context;
  auto stream = client_->operators().Pipeline(&context);
  v1::PipelineRequest open;
  open.set_session(session_->token());
  ASSERT_TRUE(stream->Write(open));
  v1::PipelineRequest batch;
  auto callback = [&](uint64_t id, bool block, uint64_t on) {
    v1::CallbackCommand* c = batch.add_commands()->mutable_callback();
    c->set_id(id);
    c->set_block(block);
    c->set_stream(on);
  };
  callback(1, /*block=*/true, 0);
  callback(2, /*block=*/false, 0);
  callback(3, /*block=*/false, /*stream=*/777);
  v1::FenceCommand* fence = batch.add_commands()->mutable_fence();
  fence->set_id(10);
  ASSERT_TRUE(stream->Write(batch));

  // 1 is reached at once and holds the stream; 3 is refused at once; 2
  // and the fence wait behind 1.
  std::vector<v1::CallbackNotice> notices;
  v1::PipelineEvent event;
  while (notices.size() < 2 && stream->Read(&event)) {
    EXPECT_EQ(event.fences_size(), 0);
    for (const v1::CallbackNotice& notice : event.callbacks()) {
      notices.push_back(notice);
    }
  }
  ASSERT_EQ(notices.size(), 2u);
  std::map<uint64_t, v1::CallbackNotice> by_id;
  for (const auto& notice : notices) by_id[notice.id()] = notice;
  EXPECT_EQ(by_id[1].code(), 0);
  EXPECT_EQ(by_id[3].code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(by_id[3].message(), HasSubstr("callback 3"));

  v1::PipelineRequest release;
  release.add_commands()->set_release_callback(1);
  ASSERT_TRUE(stream->Write(release));
  bool got_two = false, got_fence = false;
  while (!(got_two && got_fence) && stream->Read(&event)) {
    for (const v1::CallbackNotice& notice : event.callbacks()) {
      EXPECT_EQ(notice.id(), 2u);
      EXPECT_EQ(notice.code(), 0);
      got_two = true;
    }
    for (const v1::FenceResult& result : event.fences()) {
      EXPECT_EQ(result.id(), 10u);
      EXPECT_EQ(result.code(), 0) << result.message();
      got_fence = true;
    }
  }
  EXPECT_TRUE(got_two);
  EXPECT_TRUE(got_fence);
  stream->WritesDone();
  context.TryCancel();
  stream->Finish();
}

}  // namespace
}  // namespace remote
}  // namespace opserver
