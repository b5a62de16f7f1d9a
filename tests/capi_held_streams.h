// A fixture for C API tests over a device whose streams a test can hold
// (FakeDevice): an in-process server on a free port, aclInit and device 0
// set, and helpers to make streams (with their device stream's record, to
// hold and release launches), device buffers and launches that take a
// while. Held launches are released at teardown.
#ifndef OPSERVER_TESTS_CAPI_HELD_STREAMS_H_
#define OPSERVER_TESTS_CAPI_HELD_STREAMS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "devices/testing/fake_device.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {

class CApiHeldStreamsTest : public ::testing::Test {
 protected:
  // Above the server's inline-launch size, so launches run on their
  // stream's thread (a held launch run inline would hold the command
  // channel).
  static constexpr int64_t kN = 20000;

  static std::string LastError() { return aclGetRecentErrMsg(); }

  void SetUp() override;
  // Changes the server's options before it starts (the default: none).
  virtual void Configure(Options& /*options*/) {}
  void TearDown() override;

  // A new stream and its device stream's record.
  std::pair<aclrtStream, std::shared_ptr<FakeStreamRecord>> NewStream();
  // A device buffer holding `values`.
  void* Floats(const std::vector<float>& values);
  // out = grad (self is all positive): a copy made by a launch on `stream`.
  void CopyByLaunch(void* grad, void* self, void* out, aclrtStream stream);
  // Queues y = g on `stream`, whose launches are held, and waits until the
  // launch is held on the device: the stream cannot finish until Release.
  struct Held {
    void* g;
    void* x;
    void* y;
  };
  Held HoldOne(aclrtStream stream, FakeStreamRecord& record);
  // y holds g: the held launch ran. Frees the three buffers.
  void ExpectRan(const Held& held);

  std::unique_ptr<Server> server_;
  FakeDevice* device_ = nullptr;  // Owned by server_.
};

}  // namespace opserver

#endif  // OPSERVER_TESTS_CAPI_HELD_STREAMS_H_
