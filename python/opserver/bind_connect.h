// The classes Client (one server) and DeviceSet (an etcd:// pool), whose
// create_session() opens a Session.
#ifndef OPSERVER_PYTHON_OPSERVER_BIND_CONNECT_H_
#define OPSERVER_PYTHON_OPSERVER_BIND_CONNECT_H_

#include "python/opserver/binding.h"

namespace opserver::python {

void DefineConnections(py::module_& m);

}  // namespace opserver::python

#endif  // OPSERVER_PYTHON_OPSERVER_BIND_CONNECT_H_
