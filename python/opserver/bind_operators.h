// The operators' typed calls on Session (from op_signatures.h) and graph
// capture: Session.record_graph(), GraphRecorder and Graph.
#ifndef OPSERVER_PYTHON_OPSERVER_BIND_OPERATORS_H_
#define OPSERVER_PYTHON_OPSERVER_BIND_OPERATORS_H_

#include "python/opserver/binding.h"

namespace opserver::python {

// session.ThresholdBackward(...) and every other operator's call.
void DefineOperators(PySessionClass& session);

// session.record_graph() and the classes GraphRecorder and Graph.
void DefineGraphs(py::module_& m, PySessionClass& session);

}  // namespace opserver::python

#endif  // OPSERVER_PYTHON_OPSERVER_BIND_OPERATORS_H_
