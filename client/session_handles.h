// The values a Session's calls take (TensorDesc, ScalarValue) and the
// RAII handles they give (DeviceBuffer, Stream, Executor, PendingRead),
// each tied to its Session. Part of the client library; include
// client/client.h.
#ifndef OPSERVER_CLIENT_SESSION_HANDLES_H_
#define OPSERVER_CLIENT_SESSION_HANDLES_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/background_copy.h"
#include "kernels/dtype.h"
#include "proto/opserver.pb.h"

namespace opserver {
namespace remote {

class Session;

// aclCreateTensor's description of a tensor in a device buffer.
struct TensorDesc {
  uint64_t buffer = 0;
  // Byte offset of the storage base within the buffer.
  uint64_t buffer_offset = 0;
  kernels::DType dtype = kernels::DType::kFloat;
  std::vector<int64_t> shape;
  // In elements; empty = contiguous row-major.
  std::vector<int64_t> strides;
  // View offset from the storage base, in elements.
  int64_t offset = 0;
  std::vector<int64_t> storage_shape;

  // A contiguous tensor at the start of `buffer`.
  static TensorDesc Contiguous(uint64_t buffer, kernels::DType dtype,
                               std::vector<int64_t> shape);
  v1::TensorDesc ToProto() const;
};

// aclCreateScalar: a typed scalar (LeakyReluBackward's negativeSlope).
struct ScalarValue {
  kernels::DType dtype = kernels::DType::kFloat;
  double value = 0;
};

// A device buffer (Malloc). Freed when destroyed unless released.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Session* session, uint64_t handle, uint64_t size)
      : session_(session), handle_(handle), size_(size) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  uint64_t handle() const { return handle_; }
  uint64_t size() const { return size_; }
  bool valid() const { return session_ != nullptr; }

  // Frees now and reports the outcome.
  absl::Status Free();
  // Gives up ownership; returns the handle.
  uint64_t Release();

 private:
  Session* session_ = nullptr;
  uint64_t handle_ = 0;
  uint64_t size_ = 0;
};

// A device stream besides the default stream 0. Destroyed (after its queued
// work) when this object goes away.
class Stream {
 public:
  Stream() = default;
  Stream(Session* session, uint64_t handle)
      : session_(session), handle_(handle) {}
  Stream(Stream&& other) noexcept { *this = std::move(other); }
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();

  uint64_t handle() const { return handle_; }
  absl::Status Synchronize();
  absl::Status Destroy();
  // Gives up ownership; returns the handle.
  uint64_t Release();

 private:
  Session* session_ = nullptr;
  uint64_t handle_ = 0;
};

// The plan GetWorkspaceSize returned. Single-use unless SetRepeatable(); an
// executor that was never launched, or a repeatable one, is destroyed on the
// server when this object goes away.
class Executor {
 public:
  Executor() = default;
  Executor(Session* session, uint64_t handle, uint64_t workspace_size)
      : session_(session), handle_(handle), workspace_size_(workspace_size) {}
  Executor(Executor&& other) noexcept { *this = std::move(other); }
  Executor& operator=(Executor&& other) noexcept;
  ~Executor();

  uint64_t handle() const { return handle_; }
  uint64_t workspace_size() const { return workspace_size_; }
  bool repeatable() const { return repeatable_; }

  absl::Status SetRepeatable();
  // Queues the plan on `stream` (0 = default). `workspace` must hold at least
  // workspace_size() bytes from `workspace_offset` when that is non-zero.
  absl::Status Execute(uint64_t stream = 0, uint64_t workspace = 0,
                       uint64_t workspace_offset = 0);
  // Same with an explicit workspace size (as aclnnXxx passes it).
  absl::Status Execute(uint64_t stream, uint64_t workspace,
                       uint64_t workspace_offset, uint64_t workspace_size);
  absl::Status Destroy();
  // Gives up ownership; returns the handle.
  uint64_t Release();

 private:
  Session* session_ = nullptr;
  uint64_t handle_ = 0;
  uint64_t workspace_size_ = 0;
  bool repeatable_ = false;
};

// A read queued by Session::ReadAsync, or a copy by UploadAsync or
// DownloadAsync. Wait() for its bytes; dropped without Wait(), a read's
// destination is never written, and a copy still moving is cancelled (what
// it wrote stays, and it writes nothing more).
class PendingRead {
 public:
  PendingRead() = default;
  PendingRead(PendingRead&& other) noexcept { *this = std::move(other); }
  PendingRead& operator=(PendingRead&& other) noexcept;
  ~PendingRead();

  // Waits until the bytes are in the destination. The stream's deferred
  // error otherwise (consumed, as Synchronize does). Once only.
  absl::Status Wait();
  // One already done with `status` (what Wait() then returns).
  explicit PendingRead(absl::Status status) : done_(std::move(status)) {}

 private:
  friend class Session;
  PendingRead(Session* session, uint64_t id) : session_(session), id_(id) {}
  explicit PendingRead(std::unique_ptr<BackgroundCopy> background)
      : background_(std::move(background)) {}
  Session* session_ = nullptr;
  uint64_t id_ = 0;
  absl::Status done_;
  std::unique_ptr<BackgroundCopy> background_;
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_SESSION_HANDLES_H_
