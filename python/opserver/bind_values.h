// Module functions operators(), dtype_name(), dtype_size() and promote(),
// and the classes TensorDesc and Scalar.
#ifndef OPSERVER_PYTHON_OPSERVER_BIND_VALUES_H_
#define OPSERVER_PYTHON_OPSERVER_BIND_VALUES_H_

#include "python/opserver/binding.h"

namespace opserver::python {

void DefineValues(py::module_& m);

}  // namespace opserver::python

#endif  // OPSERVER_PYTHON_OPSERVER_BIND_VALUES_H_
