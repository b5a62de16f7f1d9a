// The C++ thin client: the ThresholdBackward worked example through a
// session, device buffers, a stream and the two operator phases.
//
//   bazel run //examples:cpp_client -- 127.0.0.1:50051
#include <cstdio>
#include <vector>

#include "client/client.h"

int main(int argc, char** argv) {
  using opserver::kernels::DType;
  using opserver::remote::Client;
  using opserver::remote::TensorDesc;
  const char* address = argc > 1 ? argv[1] : "127.0.0.1:50051";

  auto client = Client::Connect(address);  // UNAVAILABLE if nobody answers.
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  // Closed (and everything in it freed) when `session` goes away, or by the
  // server if this process dies.
  auto session = (*client)->CreateSession("cpp_client example");
  if (!session.ok()) return 1;
  opserver::remote::Session& s = **session;

  const std::vector<float> grad = {4.5, 4.4, 4.3, 4.2};
  const std::vector<float> self = {0.2, 1.2, 2.2, 3.2};
  auto grad_buffer = s.Malloc(16);  // DeviceBuffer: freed when destroyed.
  auto self_buffer = s.Malloc(16);
  auto out_buffer = s.Malloc(16);
  auto stream = s.CreateStream();
  if (!grad_buffer.ok() || !self_buffer.ok() || !out_buffer.ok() ||
      !stream.ok()) {
    return 1;
  }
  // Streamed straight from (and below, into) the caller's memory.
  if (!s.Upload(grad_buffer->handle(), 0, grad.data(), 16).ok() ||
      !s.Upload(self_buffer->handle(), 0, self.data(), 16).ok()) {
    return 1;
  }

  // Phase one: checks and plans; errors carry the aclnn status
  // (opserver::kernels::GetAclnnStatus(status) == 161002, ...).
  auto executor = s.ThresholdBackward(
      TensorDesc::Contiguous(grad_buffer->handle(), DType::kFloat, {4}),
      TensorDesc::Contiguous(self_buffer->handle(), DType::kFloat, {4}),
      /*threshold=*/1.0,
      TensorDesc::Contiguous(out_buffer->handle(), DType::kFloat, {4}));
  if (!executor.ok()) {
    std::fprintf(stderr, "%s\n", executor.status().ToString().c_str());
    return 1;
  }
  // Phase two: queued on the stream (workspace_size() is 0 here).
  if (!executor->Execute(stream->handle()).ok()) return 1;
  if (!stream->Synchronize().ok()) return 1;

  std::vector<float> out(4);
  if (!s.Download(out_buffer->handle(), 0, out.data(), 16, stream->handle())
           .ok()) {
    return 1;
  }
  for (int i = 0; i < 4; ++i) std::printf("result[%d] is: %f\n", i, out[i]);
  return 0;
}
