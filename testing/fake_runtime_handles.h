// The Runtime calls a test's fake opserver answers alike whatever the test
// is about: a session named "fake-session"; buffers and streams numbered
// from 1; closes, frees and stream destroys accepted. A fake derives from
// it (over the raw or callback methods it replaces) and adds what it
// checks.
#ifndef OPSERVER_TESTING_FAKE_RUNTIME_HANDLES_H_
#define OPSERVER_TESTING_FAKE_RUNTIME_HANDLES_H_

#include <atomic>
#include <cstdint>

#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver {

template <typename Base>
class FakeRuntimeHandles : public Base {
 public:
  grpc::Status CreateSession(grpc::ServerContext*,
                             const v1::CreateSessionRequest*,
                             v1::CreateSessionResponse* response) override {
    response->set_session("fake-session");
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*,
                            const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status Malloc(grpc::ServerContext*, const v1::MallocRequest*,
                      v1::MallocResponse* response) override {
    response->set_buffer(++next_);
    return grpc::Status::OK;
  }
  grpc::Status Free(grpc::ServerContext*, const v1::FreeRequest*,
                    v1::FreeResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status CreateStream(grpc::ServerContext*,
                            const v1::CreateStreamRequest*,
                            v1::CreateStreamResponse* response) override {
    response->set_stream(++next_);
    return grpc::Status::OK;
  }
  grpc::Status DestroyStream(grpc::ServerContext*,
                             const v1::DestroyStreamRequest*,
                             v1::DestroyStreamResponse*) override {
    return grpc::Status::OK;
  }

 private:
  std::atomic<uint64_t> next_{0};
};

}  // namespace opserver

#endif  // OPSERVER_TESTING_FAKE_RUNTIME_HANDLES_H_
