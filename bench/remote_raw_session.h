// A session on opserver's raw gRPC stubs for remote_bench's benchmarks:
// Malloc, streams, Upload (through the stub, and serialized by hand so that
// nothing is copied), Download and a tiny repeatable executor. Every setup
// call must succeed: a benchmark on handle 0 would measure an error path.
#ifndef OPSERVER_BENCH_REMOTE_RAW_SESSION_H_
#define OPSERVER_BENCH_REMOTE_RAW_SESSION_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "bench/remote_bench_support.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/grpcpp.h"
#include "proto/opserver.grpc.pb.h"

namespace opserver::remote_bench {

struct Remote {
  std::unique_ptr<v1::Runtime::Stub> runtime;
  std::unique_ptr<v1::Operators::Stub> ops;
  std::string session;

  explicit Remote(int port) {
    auto channel = Channel(port);
    runtime = v1::Runtime::NewStub(channel);
    ops = v1::Operators::NewStub(channel);
    grpc::ClientContext context;
    v1::CreateSessionResponse response;
    MustSucceed(
        runtime->CreateSession(&context, v1::CreateSessionRequest(), &response),
        "CreateSession");
    session = response.session();
  }
  ~Remote() {
    grpc::ClientContext context;
    v1::CloseSessionRequest request;
    request.set_session(session);
    v1::CloseSessionResponse response;
    runtime->CloseSession(&context, request, &response);
  }
  uint64_t Malloc(uint64_t size) {
    grpc::ClientContext context;
    v1::MallocRequest request;
    request.set_session(session);
    request.set_size(size);
    v1::MallocResponse response;
    MustSucceed(runtime->Malloc(&context, request, &response), "Malloc");
    return response.buffer();
  }
  uint64_t CreateStream() {
    grpc::ClientContext context;
    v1::CreateStreamRequest request;
    request.set_session(session);
    v1::CreateStreamResponse response;
    MustSucceed(runtime->CreateStream(&context, request, &response),
                "CreateStream");
    return response.stream();
  }
  // A benchmark on handle 0 would measure an error path: stop instead.
  static void MustSucceed(const grpc::Status& status, const char* what) {
    if (status.ok()) return;
    std::fprintf(stderr, "remote_bench: %s: %s\n", what,
                 status.error_message().c_str());
    std::abort();
  }
  // Streams `size` bytes of `data` (repeated) into the buffer.
  bool Upload(uint64_t buffer, const char* data, size_t size) {
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = runtime->Upload(&context, &response);
    v1::UploadRequest chunk;
    chunk.set_session(session);
    chunk.set_buffer(buffer);
    chunk.set_size(size);
    for (size_t at = 0; at < size; at += kChunk) {
      chunk.set_data(data + at, std::min(kChunk, size - at));
      if (!writer->Write(chunk)) break;
      chunk.clear_session();
    }
    writer->WritesDone();
    return writer->Finish().ok();
  }
  // The same upload, serialized by hand: each message is a few header bytes
  // plus a slice that points into the caller's memory, so the client copies
  // nothing before the socket write (what the stub's set_data cannot do).
  // Ordered on `stream` (0: the session's default stream), in messages of
  // `chunk` bytes.
  bool UploadZeroCopy(grpc::Channel* channel, uint64_t buffer, const char* data,
                      size_t size, uint64_t offset = 0, uint64_t stream = 0,
                      size_t chunk = kChunk) {
    grpc::ClientContext context;
    grpc::ByteBuffer response;
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel,
            grpc::internal::RpcMethod(
                "/opserver.v1.Runtime/Upload",
                grpc::internal::RpcMethod::CLIENT_STREAMING),
            &context, &response));
    v1::UploadRequest header;
    header.set_session(session);
    header.set_buffer(buffer);
    header.set_offset(offset);
    header.set_size(size);
    header.set_stream(stream);
    std::string prefix = header.SerializeAsString();
    size_t at = 0;
    do {  // At least one message: an empty upload is its header alone.
      const size_t n = std::min(chunk, size - at);
      uint8_t tag[11];
      tag[0] = google::protobuf::internal::WireFormatLite::MakeTag(
          v1::UploadRequest::kDataFieldNumber,
          google::protobuf::internal::WireFormatLite::
              WIRETYPE_LENGTH_DELIMITED);
      uint8_t* end =
          google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
              n, tag + 1);
      prefix.append(reinterpret_cast<char*>(tag), end - tag);
      grpc::Slice slices[] = {grpc::Slice(prefix),
                              grpc::Slice(const_cast<char*>(data + at), n,
                                          grpc::Slice::STATIC_SLICE)};
      grpc::ByteBuffer message(slices, 2);
      if (!writer->Write(message)) break;
      prefix.clear();
      at += n;
    } while (at < size);
    writer->WritesDone();
    return writer->Finish().ok();
  }

  bool Download(uint64_t buffer, char* out, size_t size) {
    grpc::ClientContext context;
    v1::DownloadRequest request;
    request.set_session(session);
    request.set_buffer(buffer);
    request.set_size(size);
    auto reader = runtime->Download(&context, request);
    v1::DownloadResponse chunk;
    size_t at = 0;
    while (reader->Read(&chunk)) {
      std::memcpy(out + at, chunk.data().data(), chunk.data().size());
      at += chunk.data().size();
    }
    return reader->Finish().ok() && at == size;
  }
  // A repeatable ThresholdBackward executor over fresh 16-element buffers.
  uint64_t RepeatableTinyExecutor() {
    uint64_t grad = Malloc(64), self = Malloc(64), out = Malloc(64);
    grpc::ClientContext context;
    v1::GetWorkspaceSizeResponse planned;
    ops->GetWorkspaceSize(&context, TinyThreshold(grad, self, out), &planned);
    grpc::ClientContext repeatable_context;
    v1::SetExecutorRepeatableRequest request;
    request.set_session(session);
    request.set_executor(planned.executor());
    v1::SetExecutorRepeatableResponse response;
    ops->SetExecutorRepeatable(&repeatable_context, request, &response);
    return planned.executor();
  }

  v1::GetWorkspaceSizeRequest TinyThreshold(uint64_t grad, uint64_t self,
                                            uint64_t out) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(session);
    request.set_op("ThresholdBackward");
    for (auto [name, buffer] :
         {std::pair{"gradOutput", grad}, std::pair{"self", self},
          std::pair{"out", out}}) {
      v1::TensorDesc& desc = (*request.mutable_tensors())[name];
      desc.set_buffer(buffer);
      desc.set_dtype(v1::FLOAT);
      desc.add_shape(16);
    }
    return request;
  }
};

}  // namespace opserver::remote_bench

#endif  // OPSERVER_BENCH_REMOTE_RAW_SESSION_H_
