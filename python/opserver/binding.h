// What the parts of the Python module opserver._opserver share: the
// Python-side objects that own a client, a session and the session's
// buffers, streams, graphs, reads and executors, and how a failed
// absl::Status leaves a binding (StatusError, which the module's
// translator turns into opserver.errors' exception).
//
// Each part defines its classes in a function that _opserver.cc's
// PYBIND11_MODULE calls: bind_values (dtypes, TensorDesc, Scalar, the
// registry), bind_connect (Client, DeviceSet), bind_session (Session and
// its handles) and bind_operators (the operators' calls, graph capture).
#ifndef OPSERVER_PYTHON_OPSERVER_BINDING_H_
#define OPSERVER_PYTHON_OPSERVER_BINDING_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/device_set.h"
#include "google/protobuf/message.h"

namespace opserver::python {

namespace py = pybind11;

// Carries a failed absl::Status out of a binding; the translator registered
// in the module turns it into the Python exception.
struct StatusError {
  absl::Status status;
};

void ThrowIfError(const absl::Status& status);

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return *std::move(value);
}

// `message` as JSON with the proto's field names and every field printed.
std::string ToJson(const google::protobuf::Message& message);

// A connected client. Shared by its sessions, which must not outlive it.
struct PyClient {
  std::unique_ptr<remote::Client> client;
};

// Several servers' devices as one list of ordinals (connect() of an
// etcd:// pool), with the pool's claim when it made one. Shared by its
// sessions, which must not outlive it.
struct PyDeviceSet {
  std::unique_ptr<remote::DeviceSet> set;
};

// A session and the client or device set it was opened on (`owner`, kept
// alive by it). Buffers, streams and executors hold the session, so it
// lives until the last of them is gone; close() ends it on the server
// earlier, after which their frees are no-ops.
struct PySession {
  std::shared_ptr<const void> owner;
  std::unique_ptr<remote::Session> session;
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;

  bool Closed() {
    absl::MutexLock lock(&mu);
    return closed;
  }
  absl::Status Close() {
    {
      absl::MutexLock lock(&mu);
      if (closed) return absl::OkStatus();
      closed = true;
    }
    return session->Close();
  }
  ~PySession() {
    py::gil_scoped_release release;
    session.reset();
  }
};

// A buffer or stream of a session, released on the server by `kRelease`
// (FreeBuffer, DestroyStream) when the last Python reference goes (queued
// on the pipelined channel: no wait), or at once by Release(). Once the
// session is closed, releasing is a no-op: the server freed it already.
template <absl::Status (remote::Session::*kRelease)(uint64_t)>
struct SessionHandle {
  SessionHandle() = default;
  SessionHandle(const SessionHandle&) = delete;
  SessionHandle& operator=(const SessionHandle&) = delete;
  std::shared_ptr<PySession> session;
  uint64_t handle = 0;
  uint64_t size = 0;  // Bytes, for buffers.
  bool released = false;

  absl::Status Release() {
    if (released) return absl::OkStatus();
    released = true;
    if (session->Closed()) return absl::OkStatus();
    return (session->session.get()->*kRelease)(handle);
  }
  ~SessionHandle() {
    py::gil_scoped_release release;
    Release().IgnoreError();
  }
};
using PyBuffer = SessionHandle<&remote::Session::FreeBuffer>;
using PyStream = SessionHandle<&remote::Session::DestroyStream>;
// `size` is the graph's task count.
using PyGraph = SessionHandle<&remote::Session::DestroyGraph>;

// A queued read and the array it fills (kept alive until it is done).
struct PyPendingRead {
  std::shared_ptr<PySession> session;
  py::object target;
  remote::PendingRead read;
  bool waited = false;

  absl::Status Wait() {
    if (waited) return absl::OkStatus();
    waited = true;
    if (session->Closed()) {
      return absl::FailedPreconditionError(
          "the session was closed before the read was waited for");
    }
    return read.Wait();
  }
  ~PyPendingRead() {
    // Dropped unwaited: the destination is never written (and the read is
    // forgotten before the array may go).
    {
      py::gil_scoped_release release;
      if (!session->Closed()) read = remote::PendingRead();
    }
  }
};

// GetWorkspaceSize's plan (phase one), launched by execute() (phase two).
struct PyExecutor {
  PyExecutor() = default;
  PyExecutor(const PyExecutor&) = delete;
  PyExecutor& operator=(const PyExecutor&) = delete;
  std::shared_ptr<PySession> session;
  remote::Executor executor;

  ~PyExecutor() {
    py::gil_scoped_release release;
    if (session->Closed()) executor.Release();
    executor = remote::Executor();
  }
};

// The host bytes of a buffer-protocol object: C-contiguous, and writable
// when `writable`.
py::buffer_info HostBytes(const py::buffer& data, bool writable);

uint64_t ByteSize(const py::buffer_info& info);

// The class Session, which bind_session defines and bind_operators extends.
using PySessionClass = py::class_<PySession, std::shared_ptr<PySession>>;

}  // namespace opserver::python

#endif  // OPSERVER_PYTHON_OPSERVER_BINDING_H_
