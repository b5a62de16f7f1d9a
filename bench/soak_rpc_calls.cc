// The raw-RPC client's typed wrappers, one per RPC (soak_rpc_client.h):
// each records its outcome and keeps the session's handles exact.

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "bench/soak_rpc_client.h"

namespace opserver::soak::rpc {

bool Client::OpenSession(SessionState* s, bool attach) {
  v1::CreateSessionRequest request;
  request.set_client_name(absl::StrCat("soak client ", id_));
  v1::CreateSessionResponse response;
  if (!Unary("CreateSession", SOAK_RT(CreateSession), request, &response, V())
           .ok()) {
    return false;
  }
  *s = SessionState();
  s->token = response.session();
  PublishSessionName(tenant_, s->token);
  if (attach) {
    s->attach_context = std::make_unique<grpc::ClientContext>();
    // Longer than the run: the server closes the session when it ends.
    SetDeadline(s->attach_context.get(), absl::Hours(2));
    v1::AttachRequest attach_request;
    attach_request.set_session(s->token);
    s->attach_reader =
        conn_->rt->Attach(s->attach_context.get(), attach_request);
    v1::AttachEvent event;
    if (!s->attach_reader->Read(&event) || event.event() != "attached") {
      EndAttach(s, V());
      if (mode_ == Mode::kSoak) {
        stats_->Problem("attach", "no 'attached' event");
      }
      return false;
    }
    s->attached = true;
  }
  return true;
}

void Client::EndAttach(SessionState* s, const Expect& e) {
  if (s->attach_reader == nullptr) return;
  s->attach_context->TryCancel();
  v1::AttachEvent event;
  while (s->attach_reader->Read(&event)) {
  }
  grpc::Status status = s->attach_reader->Finish();
  Record("Attach", e, status, *s->attach_context);
  s->attach_reader.reset();
  s->attach_context.reset();
  s->attached = false;
}

void Client::CloseSession(SessionState* s) {
  if (!s->open()) return;
  v1::CloseSessionRequest request;
  request.set_session(s->token);
  v1::CloseSessionResponse response;
  Unary("CloseSession", SOAK_RT(CloseSession), request, &response, V());
  EndAttach(s, AttachEnd());
  *s = SessionState();
}

uint64_t Client::Malloc(SessionState* s, uint64_t size, const Expect& e) {
  v1::MallocRequest request;
  request.set_session(s->token);
  request.set_size(size);
  v1::MallocResponse response;
  if (!Unary("Malloc", SOAK_RT(Malloc), request, &response, e).ok()) return 0;
  s->buffers[response.buffer()] = size;
  Foreign().Publish('b', response.buffer());
  return response.buffer();
}

Outcome Client::Free(SessionState* s, uint64_t buffer, const Expect& e) {
  v1::FreeRequest request;
  request.set_session(s->token);
  request.set_buffer(buffer);
  v1::FreeResponse response;
  Outcome o = Unary("Free", SOAK_RT(Free), request, &response, e);
  if (o.ok()) s->buffers.erase(buffer);
  return o;
}

uint64_t Client::CreateStream(SessionState* s, const Expect& e) {
  v1::CreateStreamRequest request;
  request.set_session(s->token);
  v1::CreateStreamResponse response;
  if (!Unary("CreateStream", SOAK_RT(CreateStream), request, &response, e)
           .ok()) {
    return 0;
  }
  s->streams.insert(response.stream());
  Foreign().Publish('s', response.stream());
  return response.stream();
}

Outcome Client::DestroyStream(SessionState* s, uint64_t stream,
                              const Expect& e) {
  v1::DestroyStreamRequest request;
  request.set_session(s->token);
  request.set_stream(stream);
  v1::DestroyStreamResponse response;
  Outcome o = Unary("DestroyStream", SOAK_RT(DestroyStream), request, &response,
                    e, kTransferDeadline);
  if (o.ok()) s->streams.erase(stream);
  return o;
}

Outcome Client::Sync(SessionState* s, uint64_t stream, const Expect& e) {
  v1::SynchronizeStreamRequest request;
  request.set_session(s->token);
  request.set_stream(stream);
  v1::SynchronizeStreamResponse response;
  return Unary("SynchronizeStream", SOAK_RT(SynchronizeStream), request,
               &response, e, kTransferDeadline);
}

uint64_t Client::PickStream() {
  if (Chance(0.5)) return 0;
  if (main_.streams.size() < 3) {
    uint64_t stream = CreateStream(&main_, V());
    if (stream != 0) return stream;
    return 0;
  }
  auto it = main_.streams.begin();
  std::advance(it, Rand(main_.streams.size()));
  return *it;
}

Outcome Client::Upload(SessionState* s, uint64_t buffer, uint64_t offset,
                       const std::string& data, uint64_t stream, uint64_t chunk,
                       const Expect& e, bool header_alone, uint64_t announced) {
  grpc::ClientContext context;
  SetDeadline(&context, kTransferDeadline);
  v1::UploadResponse response;
  auto writer = conn_->rt->Upload(&context, &response);
  v1::UploadRequest message;
  message.set_session(s->token);
  message.set_buffer(buffer);
  message.set_offset(offset);
  message.set_size(announced == UINT64_MAX ? data.size() : announced);
  message.set_stream(stream);
  bool ok = true;
  if (header_alone) ok = writer->Write(message);
  message.Clear();
  if (!header_alone) {
    message.set_session(s->token);
    message.set_buffer(buffer);
    message.set_offset(offset);
    message.set_size(announced == UINT64_MAX ? data.size() : announced);
    message.set_stream(stream);
  }
  size_t at = 0;
  bool first = !header_alone;
  while (ok && (at < data.size() || first)) {
    const size_t n = std::min<size_t>(chunk, data.size() - at);
    message.set_data(data.data() + at, n);
    ok = writer->Write(message);
    message.Clear();
    at += n;
    first = false;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  Outcome o = Record("Upload", e, status, context);
  if (o.ok() && response.bytes_written() != data.size() &&
      mode_ == Mode::kSoak) {
    stats_->Problem(
        "upload_bytes_written",
        absl::StrCat(response.bytes_written(), " of ", data.size()));
  }
  return o;
}

Outcome Client::Download(SessionState* s, uint64_t buffer, uint64_t offset,
                         uint64_t size, uint64_t stream, std::string* out,
                         const Expect& e) {
  grpc::ClientContext context;
  SetDeadline(&context, kTransferDeadline);
  v1::DownloadRequest request;
  request.set_session(s->token);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_stream(stream);
  auto reader = conn_->rt->Download(&context, request);
  out->clear();
  v1::DownloadResponse chunk;
  while (reader->Read(&chunk)) out->append(chunk.data());
  grpc::Status status = reader->Finish();
  Outcome o = Record("Download", e, status, context);
  if (o.ok() && out->size() != size && mode_ == Mode::kSoak) {
    stats_->Problem("download_size",
                    absl::StrCat("got ", out->size(), " of ", size));
  }
  return o;
}

Outcome Client::WriteValues(SessionState* s, uint64_t buffer, uint64_t offset,
                            DataType dt, const std::vector<double>& values,
                            uint64_t stream, const Expect& e) {
  v1::WriteValuesRequest request;
  request.set_session(s->token);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_dtype(dt);
  request.mutable_values()->Add(values.begin(), values.end());
  request.set_stream(stream);
  v1::WriteValuesResponse response;
  return Unary("WriteValues", SOAK_RT(WriteValues), request, &response, e);
}

Outcome Client::ReadValues(SessionState* s, uint64_t buffer, uint64_t offset,
                           DataType dt, uint64_t count, uint64_t stream,
                           std::vector<double>* values, const Expect& e) {
  v1::ReadValuesRequest request;
  request.set_session(s->token);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_dtype(dt);
  request.set_count(count);
  request.set_stream(stream);
  v1::ReadValuesResponse response;
  Outcome o = Unary("ReadValues", SOAK_RT(ReadValues), request, &response, e);
  if (values != nullptr) {
    values->assign(response.values().begin(), response.values().end());
  }
  return o;
}

uint64_t Client::GetWorkspaceSize(SessionState* s,
                                  v1::GetWorkspaceSizeRequest request,
                                  uint64_t* workspace, const Expect& e) {
  request.set_session(s->token);
  v1::GetWorkspaceSizeResponse response;
  Outcome o = Unary("GetWorkspaceSize", SOAK_OPS(GetWorkspaceSize), request,
                    &response, e);
  if (!o.ok()) return 0;
  if (response.aclnn_status() != 0 && mode_ == Mode::kSoak) {
    stats_->Problem("gws_status", "OK call with a non-zero aclnn_status");
  }
  if (workspace != nullptr) *workspace = response.workspace_size();
  s->executors.insert(response.executor());
  Foreign().Publish('e', response.executor());
  return response.executor();
}

v1::ExecuteRequest Client::LaunchRequest(SessionState* s, uint64_t executor,
                                         uint64_t stream, uint64_t ws_buffer,
                                         uint64_t ws_offset, uint64_t ws_size) {
  v1::ExecuteRequest request;
  request.set_session(s->token);
  request.set_executor(executor);
  request.set_stream(stream);
  request.set_workspace_buffer(ws_buffer);
  request.set_workspace_offset(ws_offset);
  request.set_workspace_size(ws_size);
  return request;
}

Outcome Client::Execute(SessionState* s, const v1::ExecuteRequest& request,
                        const Expect& e) {
  v1::ExecuteResponse response;
  Outcome o = Unary("Execute", SOAK_OPS(Execute), request, &response, e);
  if (o.ok()) NoteLaunched(s, request.executor());
  return o;
}

bool Client::ExecuteStream(SessionState* s,
                           const std::vector<v1::ExecuteRequest>& launches,
                           const std::vector<Expect>& expects,
                           const Expect& call) {
  grpc::ClientContext context;
  SetDeadline(&context, kTransferDeadline);
  auto stream = conn_->ops->ExecuteStream(&context);
  size_t replies = 0;
  bool all_ok = true;
  auto take = [&](const v1::ExecuteResponse& r) {
    if (replies >= launches.size()) {
      stats_->Problem("execute_stream_reply", "more replies than launches");
      return;
    }
    Outcome o;
    o.code = static_cast<StatusCode>(r.code());
    o.aclnn = r.aclnn_status();
    o.message = r.message();
    if (r.executor() != launches[replies].executor() && mode_ == Mode::kSoak) {
      stats_->Problem("execute_stream_order",
                      absl::StrCat("reply for executor ", r.executor(),
                                   ", launch ", replies, " was executor ",
                                   launches[replies].executor()));
    }
    stats_->Record("ExecuteStream launch", expects[replies], o);
    if (o.ok()) {
      NoteLaunched(s, launches[replies].executor());
    } else {
      all_ok = false;
    }
    ++replies;
  };
  v1::ExecuteResponse response;
  for (const v1::ExecuteRequest& launch : launches) {
    if (!stream->Write(launch)) break;
  }
  stream->WritesDone();
  while (stream->Read(&response)) take(response);
  grpc::Status status = stream->Finish();
  Outcome o = Record("ExecuteStream", call, status, context);
  if (o.ok() && replies != launches.size() && mode_ == Mode::kSoak) {
    stats_->Problem(
        "execute_stream_replies",
        absl::StrCat(replies, " replies to ", launches.size(), " launches"));
  }
  return o.ok() && all_ok && replies == launches.size();
}

Outcome Client::SetRepeatable(SessionState* s, uint64_t executor,
                              const Expect& e) {
  v1::SetExecutorRepeatableRequest request;
  request.set_session(s->token);
  request.set_executor(executor);
  v1::SetExecutorRepeatableResponse response;
  Outcome o = Unary("SetExecutorRepeatable", SOAK_OPS(SetExecutorRepeatable),
                    request, &response, e);
  if (o.ok()) s->repeatable.insert(executor);
  return o;
}

Outcome Client::DestroyExecutor(SessionState* s, uint64_t executor,
                                const Expect& e) {
  v1::DestroyExecutorRequest request;
  request.set_session(s->token);
  request.set_executor(executor);
  v1::DestroyExecutorResponse response;
  Outcome o = Unary("DestroyExecutor", SOAK_OPS(DestroyExecutor), request,
                    &response, e);
  if (o.ok()) {
    s->executors.erase(executor);
    s->repeatable.erase(executor);
  }
  return o;
}

v1::GetWorkspaceSizeRequest Client::TinyThreshold(uint64_t buffer) {
  v1::GetWorkspaceSizeRequest request;
  request.set_op("ThresholdBackward");
  request.mutable_params()->set_threshold(0.5);
  for (const char* name : {"gradOutput", "self", "out"}) {
    (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {4});
  }
  return request;
}

uint64_t Client::ForeignHandle(char kind) {
  for (int i = 0; i < 8; ++i) {
    uint64_t h = Foreign().Pick(kind, rng_);
    if (h != 0 && !main_.Owns(h)) return h;
  }
  return 0;
}

}  // namespace opserver::soak::rpc
