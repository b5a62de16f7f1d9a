// The class Session (opened by Client.create_session or
// DeviceSet.create_session) and the handles it gives: PendingRead, Buffer,
// Stream and Executor.

#include "python/opserver/bind_session.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace opserver::python {
namespace {

// token, routing_key, pipelined, closed, close(), flush(), lost(), stats().
void DefineSessionState(PySessionClass& session) {
  session
      .def_property_readonly("token",
                             [](PySession& s) { return s.session->token(); })
      .def_property_readonly(
          "routing_key", [](PySession& s) { return s.session->routing_key(); })
      .def_property_readonly(
          "pipelined", [](PySession& s) { return s.session->pipelined(); })
      .def_property_readonly("closed", &PySession::Closed)
      .def("close",
           [](PySession& s) {
             py::gil_scoped_release release;
             ThrowIfError(s.Close());
           })
      .def("flush",
           [](PySession& s) {
             py::gil_scoped_release release;
             ThrowIfError(s.session->Flush());
           })
      .def("lost",
           [](PySession& s) {
             absl::Status lost = s.session->Lost();
             return lost.ok()
                        ? py::object(py::none())
                        : py::object(py::str(std::string(lost.message())));
           })
      .def("stats", [](PySession& s) {
        absl::StatusOr<v1::SessionStats> stats;
        {
          py::gil_scoped_release release;
          stats = s.session->Stats();
        }
        return ToJson(ValueOrThrow(std::move(stats)));
      });
}

// malloc(), create_stream() and synchronize().
void DefineSessionMemory(PySessionClass& session) {
  session
      .def("malloc",
           [](const std::shared_ptr<PySession>& s, uint64_t size) {
             absl::StatusOr<remote::DeviceBuffer> buffer;
             {
               py::gil_scoped_release release;
               buffer = s->session->Malloc(size);
             }
             remote::DeviceBuffer b = ValueOrThrow(std::move(buffer));
             auto result = std::make_unique<PyBuffer>();
             result->session = s;
             result->size = b.size();
             result->handle = b.Release();
             return result;
           })
      .def("create_stream",
           [](const std::shared_ptr<PySession>& s) {
             absl::StatusOr<remote::Stream> stream;
             {
               py::gil_scoped_release release;
               stream = s->session->CreateStream();
             }
             auto result = std::make_unique<PyStream>();
             result->session = s;
             result->handle = ValueOrThrow(std::move(stream)).Release();
             return result;
           })
      .def(
          "synchronize",
          [](PySession& s, uint64_t stream) {
            py::gil_scoped_release release;
            ThrowIfError(s.session->Synchronize(stream));
          },
          py::arg("stream") = 0);
}

// upload() and download(), which wait; write() and read_async(), which
// queue on the command channel.
void DefineSessionTransfers(PySessionClass& session) {
  session
      .def(
          "upload",
          [](PySession& s, uint64_t buffer, uint64_t offset,
             const py::buffer& data, uint64_t stream) {
            py::buffer_info info = HostBytes(data, /*writable=*/false);
            py::gil_scoped_release release;
            ThrowIfError(s.session->Upload(buffer, offset, info.ptr,
                                           ByteSize(info), stream));
          },
          py::arg("buffer"), py::arg("offset"), py::arg("data"),
          py::arg("stream") = 0,
          "Copies a C-contiguous host array into buffer[offset:], after the "
          "work queued on `stream`.")
      .def(
          "download",
          [](PySession& s, uint64_t buffer, uint64_t offset,
             const py::buffer& data, uint64_t stream) {
            py::buffer_info info = HostBytes(data, /*writable=*/true);
            py::gil_scoped_release release;
            ThrowIfError(s.session->Download(buffer, offset, info.ptr,
                                             ByteSize(info), stream));
          },
          py::arg("buffer"), py::arg("offset"), py::arg("data"),
          py::arg("stream") = 0,
          "Fills a writable C-contiguous host array from buffer[offset:], "
          "after the work queued on `stream`; reports its deferred error.");
  session
      .def(
          "write",
          [](PySession& s, uint64_t buffer, uint64_t offset,
             const py::buffer& data, uint64_t stream) {
            py::buffer_info info = HostBytes(data, /*writable=*/false);
            py::gil_scoped_release release;
            ThrowIfError(s.session->WriteAsync(buffer, offset, info.ptr,
                                               ByteSize(info), stream));
          },
          py::arg("buffer"), py::arg("offset"), py::arg("data"),
          py::arg("stream") = 0,
          "Like upload, without waiting: up to 1 MiB is copied and queued on "
          "the command channel, after the work on `stream`.")
      .def(
          "read_async",
          [](const std::shared_ptr<PySession>& s, uint64_t buffer,
             uint64_t offset, const py::buffer& data, uint64_t stream) {
            py::buffer_info info = HostBytes(data, /*writable=*/true);
            absl::StatusOr<remote::PendingRead> read;
            {
              py::gil_scoped_release release;
              read = s->session->ReadAsync(buffer, offset, info.ptr,
                                           ByteSize(info), stream);
            }
            auto pending = std::make_unique<PyPendingRead>();
            pending->session = s;
            pending->target = data;
            pending->read = ValueOrThrow(std::move(read));
            return pending;
          },
          py::arg("buffer"), py::arg("offset"), py::arg("data"),
          py::arg("stream") = 0,
          "Queues a download into the writable array `data` after the work "
          "on `stream`; wait() on the result waits for it.");
}

// PendingRead, Buffer and Stream.
void DefineSessionHandles(py::module_& m) {
  py::class_<PyPendingRead>(m, "PendingRead",
                            "A queued read; wait() for its bytes.")
      .def("wait", [](PyPendingRead& p) {
        absl::Status waited;
        {
          py::gil_scoped_release release;
          waited = p.Wait();
        }
        ThrowIfError(waited);
        return p.target;
      });

  py::class_<PyBuffer>(m, "Buffer", "A device buffer (Malloc).")
      .def_readonly("handle", &PyBuffer::handle)
      .def_readonly("nbytes", &PyBuffer::size)
      .def_readonly("freed", &PyBuffer::released)
      .def("free", [](PyBuffer& b) {
        py::gil_scoped_release release;
        ThrowIfError(b.Release());
      });

  py::class_<PyStream>(m, "Stream", "A device stream besides stream 0.")
      .def_readonly("handle", &PyStream::handle)
      .def("synchronize",
           [](PyStream& st) {
             py::gil_scoped_release release;
             ThrowIfError(st.session->session->Synchronize(st.handle));
           })
      .def("destroy", [](PyStream& st) {
        py::gil_scoped_release release;
        ThrowIfError(st.Release());
      });
}

// Executor: phase one's plan, execute() and destroy().
void DefineExecutor(py::module_& m) {
  py::class_<PyExecutor>(m, "Executor",
                         "The plan of phase one; execute() is phase two.")
      .def_property_readonly(
          "workspace_size",
          [](PyExecutor& e) { return e.executor.workspace_size(); })
      .def_property_readonly("handle",
                             [](PyExecutor& e) { return e.executor.handle(); })
      .def("set_repeatable",
           [](PyExecutor& e) {
             py::gil_scoped_release release;
             ThrowIfError(e.executor.SetRepeatable());
           })
      .def(
          "execute",
          [](PyExecutor& e, uint64_t stream, uint64_t workspace,
             uint64_t workspace_offset,
             std::optional<uint64_t> workspace_size) {
            py::gil_scoped_release release;
            ThrowIfError(
                workspace_size.has_value()
                    ? e.executor.Execute(stream, workspace, workspace_offset,
                                         *workspace_size)
                    : e.executor.Execute(stream, workspace, workspace_offset));
          },
          py::arg("stream") = 0, py::arg("workspace") = 0,
          py::arg("workspace_offset") = 0,
          py::arg("workspace_size") = py::none())
      .def("destroy", [](PyExecutor& e) {
        py::gil_scoped_release release;
        ThrowIfError(e.executor.Destroy());
      });
}

}  // namespace

PySessionClass DefineSession(py::module_& m) {
  PySessionClass session(m, "Session");
  DefineSessionState(session);
  DefineSessionMemory(session);
  DefineSessionTransfers(session);
  return session;
}

void DefineSessionObjects(py::module_& m) {
  DefineSessionHandles(m);
  DefineExecutor(m);
}

}  // namespace opserver::python
