// The C++ client (client/client.h) as the Python module opserver._opserver.
// Python reaches the server only through this binding, so pipelining, the
// local phase one, split transfers, the data path, TLS and tokens are the
// C++ client's own; the Python package (opserver/__init__.py) adds the
// conveniences (numpy and torch arrays, result allocation) on top.
//
// Every call that can wait for the network or the device releases the GIL.
// A failed call raises the exception opserver.errors.from_status builds
// from its gRPC code, aclnn status and message.
//
// The module is defined in parts, one function each: bind_values,
// bind_connect, bind_session and bind_operators; binding.h holds what they
// share.

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "kernels/aclnn_status.h"
#include "python/opserver/bind_connect.h"
#include "python/opserver/bind_operators.h"
#include "python/opserver/bind_session.h"
#include "python/opserver/bind_values.h"
#include "python/opserver/binding.h"

namespace opserver::python {
namespace {

// Failures become the exception opserver.errors.from_status makes.
void RegisterStatusTranslator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object make =
          py::module_::import("opserver.errors").attr("from_status");
      py::object error = make(static_cast<int>(e.status.code()),
                              kernels::GetAclnnStatus(e.status),
                              std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())),
                      error.ptr());
    }
  });
}

}  // namespace
}  // namespace opserver::python

PYBIND11_MODULE(_opserver, m) {
  namespace python = opserver::python;
  m.doc() = "opserver's C++ client; use the opserver package instead.";
  python::RegisterStatusTranslator();
  python::DefineValues(m);
  python::DefineConnections(m);
  python::PySessionClass session = python::DefineSession(m);
  python::DefineOperators(session);
  python::DefineGraphs(m, session);
  python::DefineSessionObjects(m);
}
