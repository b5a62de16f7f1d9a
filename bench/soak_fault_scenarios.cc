// The raw-RPC client's faults inside the process: calls cancelled, cut by
// deadlines or left unread, and sessions closed under running calls.

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/soak_reference.h"
#include "bench/soak_rpc_client.h"

namespace opserver::soak::rpc {

void Client::FaultScenario() {
  switch (Rand(8)) {
    case 6:
      CloseMidTransfer();
      return;
    case 7:
      UnreadPipeline();
      return;
    case 0:
      CancelUpload();
      break;
    case 1:
      CancelDownload();
      break;
    case 2:
      CancelPipeline();
      break;
    case 3:
      CloseMidPipeline();
      break;
    case 4:
      CancelAttach();
      break;
    default:
      CloseWithWork();
      break;
  }
}

void Client::CancelUpload() {
  SessionState* s = &main_;
  const uint64_t size = (8 + Rand(25)) << 20;
  const uint64_t b = Malloc(s, size);
  if (b == 0) return;
  const std::string chunk(256 << 10, 'u');
  grpc::ClientContext context;
  const bool by_deadline = Chance(0.3);
  SetDeadline(&context, by_deadline ? absl::Milliseconds(5 + Rand(50))
                                    : kTransferDeadline);
  v1::UploadResponse response;
  auto writer = conn_->rt->Upload(&context, &response);
  v1::UploadRequest message;
  message.set_session(s->token);
  message.set_buffer(b);
  message.set_size(size);
  const uint64_t stop_after = Rand(size / chunk.size());
  uint64_t sent = 0;
  for (uint64_t i = 0; sent < size; ++i) {
    if (!by_deadline && i == stop_after) {
      context.TryCancel();
      break;
    }
    message.set_data(chunk);
    if (!writer->Write(message)) break;
    message.Clear();
    sent += chunk.size();
  }
  if (sent >= size) writer->WritesDone();
  grpc::Status status = writer->Finish();
  Record("Upload",
         Invalid("cancel_upload", Bit(StatusCode::CANCELLED) |
                                      Bit(StatusCode::DEADLINE_EXCEEDED) |
                                      Bit(StatusCode::OK)),
         status, context);
  // The session is unharmed.
  CheckSessionStats();
  Free(s, b);
}

void Client::CancelDownload() {
  SessionState* s = &main_;
  const uint64_t size = (8 + Rand(25)) << 20;
  const uint64_t b = Malloc(s, size);
  if (b == 0) return;
  grpc::ClientContext context;
  const int how = static_cast<int>(Rand(3));
  SetDeadline(&context,
              how == 2 ? absl::Milliseconds(5 + Rand(50)) : kTransferDeadline);
  v1::DownloadRequest request;
  request.set_session(s->token);
  request.set_buffer(b);
  request.set_size(size);
  auto reader = conn_->rt->Download(&context, request);
  v1::DownloadResponse chunk;
  if (how == 0) {
    context.TryCancel();  // Before reading anything.
  } else if (how == 1) {
    const uint64_t k = 1 + Rand(3);
    for (uint64_t i = 0; i < k && reader->Read(&chunk); ++i) {
    }
    context.TryCancel();
  } else {
    absl::SleepFor(absl::Milliseconds(Rand(20)));  // A slow reader.
  }
  while (reader->Read(&chunk)) {
  }
  Record("Download",
         Invalid("cancel_download", Bit(StatusCode::CANCELLED) |
                                        Bit(StatusCode::DEADLINE_EXCEEDED) |
                                        Bit(StatusCode::OK)),
         reader->Finish(), context);
  CheckSessionStats();
  Free(s, b);
}

// ExecuteStream cancelled with launches in flight; what was queued runs
// and the stream synchronizes OK.
void Client::CancelPipeline() {
  SessionState* s = &main_;
  const int64_t n = 1 << 16;
  const uint64_t b = Malloc(s, n * 4);
  if (b == 0) return;
  v1::GetWorkspaceSizeRequest request;
  request.set_op("SoftshrinkBackward");
  request.mutable_params()->set_lambd(0.5);
  for (const char* name : {"gradOutput", "self", "gradInput"}) {
    (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
  }
  const uint64_t executor = GetWorkspaceSize(s, request, nullptr, V());
  if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
  const uint64_t stream = PickStream();
  grpc::ClientContext context;
  SetDeadline(&context, kTransferDeadline);
  auto call = conn_->ops->ExecuteStream(&context);
  const int launches = 64 + static_cast<int>(Rand(448));
  const v1::ExecuteRequest launch = LaunchRequest(s, executor, stream);
  for (int i = 0; i < launches; ++i) {
    if (!call->Write(launch)) break;
  }
  const uint64_t k = Rand(16);
  v1::ExecuteResponse reply;
  for (uint64_t i = 0; i < k && call->Read(&reply); ++i) {
    Outcome o;
    o.code = static_cast<StatusCode>(reply.code());
    o.aclnn = reply.aclnn_status();
    o.message = reply.message();
    stats_->Record("ExecuteStream launch", V(), o);
  }
  context.TryCancel();
  while (call->Read(&reply)) {
  }
  Record("ExecuteStream",
         Invalid("cancel_pipeline",
                 Bit(StatusCode::CANCELLED) | Bit(StatusCode::OK)),
         call->Finish(), context);
  Sync(s, stream);
  DestroyExecutor(s, executor, V());
  Free(s, b);
}

// CloseSession while its ExecuteStream runs: later launches are refused
// in their replies; the call ends OK.
void Client::CloseMidPipeline() {
  SessionState temp;
  if (!OpenSession(&temp, Chance(0.5))) return;
  const int64_t n = 1 << 16;
  const uint64_t b = Malloc(&temp, n * 4);
  if (b == 0) return CloseSession(&temp);
  v1::GetWorkspaceSizeRequest request;
  request.set_op("ThresholdBackward");
  for (const char* name : {"gradOutput", "self", "out"}) {
    (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
  }
  const uint64_t executor = GetWorkspaceSize(&temp, request, nullptr, V());
  if (executor == 0 || !SetRepeatable(&temp, executor, V()).ok()) {
    return CloseSession(&temp);
  }
  grpc::ClientContext context;
  SetDeadline(&context, kTransferDeadline);
  auto call = conn_->ops->ExecuteStream(&context);
  const v1::ExecuteRequest launch = LaunchRequest(&temp, executor, 0);
  const int before = 8 + static_cast<int>(Rand(24));
  for (int i = 0; i < before; ++i) call->Write(launch);
  v1::ExecuteResponse reply;
  const Expect either = Invalid(
      "close_mid_pipeline", Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND) |
                                Bit(StatusCode::CANCELLED));
  int read = 0;
  for (; read < 4 && call->Read(&reply); ++read) {
    Outcome o;
    o.code = static_cast<StatusCode>(reply.code());
    o.aclnn = reply.aclnn_status();
    o.message = reply.message();
    stats_->Record("ExecuteStream launch", either, o);
  }
  CloseSession(&temp);
  const int after = 1 + static_cast<int>(Rand(8));
  for (int i = 0; i < after; ++i) call->Write(launch);
  call->WritesDone();
  Outcome last;
  while (call->Read(&reply)) {
    ++read;
    last.code = static_cast<StatusCode>(reply.code());
    last.aclnn = reply.aclnn_status();
    last.message = reply.message();
    stats_->Record("ExecuteStream launch", either, last);
  }
  Outcome o = Record("ExecuteStream", V(), call->Finish(), context);
  if (o.ok() &&
      (read != before + after || last.code != StatusCode::NOT_FOUND)) {
    stats_->Problem("close_mid_pipeline",
                    absl::StrCat(read, " replies to ", before + after,
                                 " launches; the last after CloseSession: ",
                                 CodeName(last.code)));
  }
}

// CloseSession from another thread while the session's transfer runs.
void Client::CloseMidTransfer() {
  SessionState temp;
  if (!OpenSession(&temp, Chance(0.5))) return;
  const uint64_t size = 16 << 20;
  const uint64_t b = Malloc(&temp, size);
  if (b == 0) return CloseSession(&temp);
  const bool upload = Chance(0.5);
  const Expect e = Invalid("close_mid_transfer",
                           Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND) |
                               Bit(StatusCode::CANCELLED));
  SessionState view;  // The transfer's own copy of what it names.
  view.token = temp.token;
  std::thread transfer([&] {
    PacedTransfer(upload, view.token, b, size, 256 << 10,
                  absl::Microseconds(500), absl::Milliseconds(5),
                  upload ? "Upload" : "Download", e);
  });
  absl::SleepFor(absl::Milliseconds(Rand(30)));
  CloseSession(&temp);
  transfer.join();
}

// ExecuteStream that never reads its replies: the server stops reading
// at --max_pending_replies, the client's writes block, the deadline ends
// the call.
void Client::UnreadPipeline() {
  SessionState* s = &main_;
  const uint64_t b = AnyBuffer(64);
  if (b == 0) return;
  const uint64_t executor = GetWorkspaceSize(s, TinyThreshold(b), nullptr, V());
  if (executor == 0 || !SetRepeatable(s, executor, V()).ok()) return;
  grpc::ClientContext context;
  SetDeadline(&context, absl::Milliseconds(1000 + Rand(2000)));
  auto call = conn_->ops->ExecuteStream(&context);
  const v1::ExecuteRequest launch = LaunchRequest(s, executor, 0);
  int written = 0;
  while (written < 3000 && call->Write(launch)) ++written;
  call->WritesDone();
  v1::ExecuteResponse reply;
  int replies = 0;
  while (call->Read(&reply)) {
    ++replies;
    if (reply.code() != 0) {
      stats_->Problem("unread_pipeline",
                      absl::StrCat("launch failed: ", reply.message()));
    }
  }
  Record("ExecuteStream",
         Invalid("unread_pipeline",
                 Bit(StatusCode::DEADLINE_EXCEEDED) | Bit(StatusCode::OK)),
         call->Finish(), context);
  Sync(s, 0);
  DestroyExecutor(s, executor, V());
}

// Cancelling the Attach call ends the session on the server.
void Client::CancelAttach() {
  SessionState temp;
  if (!OpenSession(&temp, true)) return;
  Malloc(&temp, 1 + Rand(1 << 20));
  const std::string token = temp.token;
  DropAttach(&temp);
  temp.token = token;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  const Expect e = Invalid("attach_cancel",
                           Bit(StatusCode::OK) | Bit(StatusCode::NOT_FOUND));
  for (;;) {
    v1::GetSessionStatsRequest request;
    request.set_session(token);
    v1::SessionStats stats;
    Outcome o =
        Unary("GetSessionStats", SOAK_RT(GetSessionStats), request, &stats, e);
    if (o.code == StatusCode::NOT_FOUND) return;
    if (!o.ok()) return;
    if (absl::Now() > deadline) {
      stats_->Problem("attach_cancel",
                      "the session outlived its cancelled Attach by 10 s");
      return;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// CloseSession with work queued on its streams returns promptly.
void Client::CloseWithWork() {
  SessionState temp;
  if (!OpenSession(&temp, Chance(0.5))) return;
  const int64_t n = 1 << 18;
  const uint64_t b = Malloc(&temp, n * 4);
  if (b == 0) return CloseSession(&temp);
  v1::GetWorkspaceSizeRequest request;
  request.set_op("HardswishBackward");
  for (const char* name : {"gradOutput", "self", "out"}) {
    (*request.mutable_tensors())[name] = Desc(b, v1::FLOAT, {n});
  }
  const uint64_t executor = GetWorkspaceSize(&temp, request, nullptr, V());
  if (executor == 0 || !SetRepeatable(&temp, executor, V()).ok()) {
    return CloseSession(&temp);
  }
  const uint64_t stream = CreateStream(&temp, V());
  for (int i = 0; i < 32; ++i) {
    Execute(&temp, LaunchRequest(&temp, executor, i % 2 ? stream : 0), V());
  }
  CloseSession(&temp);
}

}  // namespace opserver::soak::rpc
