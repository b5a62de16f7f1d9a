// The soak's fault children (RunFaultChild in soak_scenarios.h): a client
// process that opens a session, starts a long upload, download or
// pipeline, says "R" on stdout once it is under way, and goes on until the
// killer SIGKILLs it. Any failure before that exits with a status of its
// own, which the killer reports.

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/soak_reference.h"
#include "bench/soak_scenarios.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver::soak {
namespace {

constexpr uint64_t kChildBuffer = 16 << 20;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "soak fault child: %s\n", what.c_str());
  _exit(5);
}

// Tells the killer that the transfer is under way.
void Ready() {
  if (write(1, "R", 1) != 1) _exit(6);
}

// The child's session (attached when asked) and its one buffer.
struct ChildSession {
  std::shared_ptr<Conn> conn;
  std::string session;
  uint64_t buffer = 0;
  grpc::ClientContext attach_context;
  std::unique_ptr<grpc::ClientReader<v1::AttachEvent>> attached;
};

void OpenChildSession(const std::string& kind, const std::string& address,
                      bool attach, const std::string& token, ChildSession* c) {
  c->conn = Connect(address, true, token);
  grpc::ClientContext create_context;
  v1::CreateSessionRequest create;
  create.set_client_name(absl::StrCat("soak fault child ", kind));
  v1::CreateSessionResponse session;
  grpc::Status status =
      c->conn->rt->CreateSession(&create_context, create, &session);
  if (!status.ok()) Fail("CreateSession: " + status.error_message());
  c->session = session.session();
  if (attach) {
    v1::AttachRequest request;
    request.set_session(c->session);
    c->attached = c->conn->rt->Attach(&c->attach_context, request);
    v1::AttachEvent event;
    if (!c->attached->Read(&event)) Fail("Attach");
  }
  grpc::ClientContext malloc_context;
  v1::MallocRequest malloc_request;
  malloc_request.set_session(c->session);
  malloc_request.set_size(kChildBuffer);
  v1::MallocResponse buffer;
  status = c->conn->rt->Malloc(&malloc_context, malloc_request, &buffer);
  if (!status.ok()) Fail("Malloc: " + status.error_message());
  c->buffer = buffer.buffer();
}

// Uploads of the whole buffer, paced, one after another.
[[noreturn]] void UploadForever(const ChildSession& c) {
  const std::string chunk(256 << 10, 'c');
  bool said = false;
  for (;;) {
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = c.conn->rt->Upload(&context, &response);
    v1::UploadRequest message;
    message.set_session(c.session);
    message.set_buffer(c.buffer);
    message.set_size(kChildBuffer);
    for (uint64_t sent = 0; sent < kChildBuffer; sent += chunk.size()) {
      message.set_data(chunk);
      if (!writer->Write(message)) Fail("Upload write");
      message.Clear();
      if (!said && sent >= 4 * chunk.size()) {
        Ready();
        said = true;
      }
      usleep(2000);
    }
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    if (!status.ok()) Fail("Upload: " + status.error_message());
  }
}

// Downloads of the whole buffer by a slow reader, one after another.
[[noreturn]] void DownloadForever(const ChildSession& c) {
  bool said = false;
  for (;;) {
    grpc::ClientContext context;
    v1::DownloadRequest request;
    request.set_session(c.session);
    request.set_buffer(c.buffer);
    request.set_size(kChildBuffer);
    auto reader = c.conn->rt->Download(&context, request);
    v1::DownloadResponse chunk;
    while (reader->Read(&chunk)) {
      if (!said) {
        Ready();
        said = true;
      }
      usleep(50000);  // A slow reader: the server waits on flow control.
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) Fail("Download: " + status.error_message());
  }
}

// A repeatable HardswishBackward over the buffer; its id.
uint64_t RepeatableExecutor(const ChildSession& c) {
  const int64_t n = kChildBuffer / 4;
  grpc::ClientContext plan_context;
  v1::GetWorkspaceSizeRequest plan;
  plan.set_session(c.session);
  plan.set_op("HardswishBackward");
  for (const char* name : {"gradOutput", "self", "out"}) {
    (*plan.mutable_tensors())[name] = Desc(c.buffer, v1::FLOAT, {n / 16});
  }
  v1::GetWorkspaceSizeResponse executor;
  grpc::Status status =
      c.conn->ops->GetWorkspaceSize(&plan_context, plan, &executor);
  if (!status.ok()) Fail("GetWorkspaceSize: " + status.error_message());
  grpc::ClientContext repeat_context;
  v1::SetExecutorRepeatableRequest repeat;
  repeat.set_session(c.session);
  repeat.set_executor(executor.executor());
  v1::SetExecutorRepeatableResponse repeated;
  status =
      c.conn->ops->SetExecutorRepeatable(&repeat_context, repeat, &repeated);
  if (!status.ok()) Fail("SetExecutorRepeatable: " + status.error_message());
  return executor.executor();
}

// Launches of it on one ExecuteStream call, at most 32 in flight: what
// it leaves queued is bounded.
[[noreturn]] void PipelineForever(const ChildSession& c) {
  const uint64_t executor = RepeatableExecutor(c);
  grpc::ClientContext context;
  auto call = c.conn->ops->ExecuteStream(&context);
  v1::ExecuteRequest launch;
  launch.set_session(c.session);
  launch.set_executor(executor);
  int in_flight = 0, replies = 0;
  v1::ExecuteResponse reply;
  for (;;) {
    while (in_flight < 32) {
      if (!call->Write(launch)) Fail("ExecuteStream write");
      ++in_flight;
    }
    if (!call->Read(&reply)) Fail("ExecuteStream read");
    if (reply.code() != 0) Fail("ExecuteStream launch: " + reply.message());
    --in_flight;
    if (++replies == 16) Ready();
  }
}

}  // namespace

[[noreturn]] void RunFaultChild(const std::string& kind,
                                const std::string& address, bool attach,
                                int parent, const std::string& token) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(4);
  alarm(60);
  ChildSession session;
  OpenChildSession(kind, address, attach, token, &session);
  if (kind == "upload") UploadForever(session);
  if (kind == "download") DownloadForever(session);
  PipelineForever(session);
}

}  // namespace opserver::soak
