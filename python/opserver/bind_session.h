// The class Session and the handles its calls give (PendingRead, Buffer,
// Stream, Executor).
#ifndef OPSERVER_PYTHON_OPSERVER_BIND_SESSION_H_
#define OPSERVER_PYTHON_OPSERVER_BIND_SESSION_H_

#include "python/opserver/binding.h"

namespace opserver::python {

// Defines Session with its state, memory and transfer calls; the operators
// and graph capture are added to it by bind_operators.
PySessionClass DefineSession(py::module_& m);

// Defines PendingRead, Buffer, Stream and Executor.
void DefineSessionObjects(py::module_& m);

}  // namespace opserver::python

#endif  // OPSERVER_PYTHON_OPSERVER_BIND_SESSION_H_
