// The operators' registry, the dtype helpers and the value classes
// TensorDesc and Scalar.

#include "python/opserver/bind_values.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/op_signatures.h"
#include "kernels/validate.h"

namespace opserver::python {
namespace {

using remote::ScalarValue;
using remote::TensorDesc;

py::list Registry() {
  py::list ops;
  for (const kernels::OpInfo& info : kernels::OpRegistry()) {
    py::list tensors;
    for (const kernels::TensorArgInfo& t : info.tensors) {
      py::list dtypes;
      for (kernels::DType d : t.dtypes) dtypes.append(static_cast<int>(d));
      tensors.append(py::dict(py::arg("name") = std::string(t.name),
                              py::arg("is_output") = t.is_output,
                              py::arg("dtypes") = dtypes));
    }
    py::list scalars;
    for (const kernels::ScalarArgInfo& s : info.scalars) {
      py::object default_value = py::none();
      if (s.default_value.has_value())
        default_value = py::float_(*s.default_value);
      scalars.append(py::dict(py::arg("name") = std::string(s.name),
                              py::arg("type") = std::string(s.type),
                              py::arg("default") = default_value));
    }
    ops.append(
        py::dict(py::arg("name") = std::string(info.name),
                 py::arg("tensors") = tensors, py::arg("scalars") = scalars,
                 py::arg("bit_mask_input") = info.bit_mask_input,
                 py::arg("description") = std::string(info.description)));
  }
  return ops;
}

// operators(), dtype_name(), dtype_size() and promote().
void DefineRegistry(py::module_& m) {
  m.def("operators", &Registry,
        "The operators' registry: names, tensor and scalar arguments.");
  m.def(
      "dtype_name",
      [](int dtype) {
        return std::string(
            kernels::DTypeName(static_cast<kernels::DType>(dtype)));
      },
      "aclDataType's name without ACL_ ('FLOAT', 'BFLOAT16', ...).");
  m.def(
      "dtype_size",
      [](int dtype) {
        return kernels::DTypeSize(static_cast<kernels::DType>(dtype));
      },
      "Bytes per element (0 for an unknown value).");
  m.def(
      "promote",
      [](int a, int b) {
        return static_cast<int>(kernels::PromoteDType(
            static_cast<kernels::DType>(a), static_cast<kernels::DType>(b)));
      },
      "The compute dtype of two floating dtypes (the spec's promotion).");
}

void DefineTensorDesc(py::module_& m) {
  py::class_<TensorDesc>(m, "TensorDesc",
                         "aclCreateTensor's description of a tensor in a "
                         "device buffer (strides and offset in elements).")
      .def(py::init([](uint64_t buffer, int dtype, std::vector<int64_t> shape,
                       std::vector<int64_t> strides, int64_t offset,
                       uint64_t buffer_offset,
                       std::vector<int64_t> storage_shape) {
             TensorDesc d;
             d.buffer = buffer;
             d.dtype = static_cast<kernels::DType>(dtype);
             d.shape = std::move(shape);
             d.strides = std::move(strides);
             d.offset = offset;
             d.buffer_offset = buffer_offset;
             d.storage_shape = std::move(storage_shape);
             return d;
           }),
           py::arg("buffer"), py::arg("dtype"), py::arg("shape"),
           py::arg("strides") = std::vector<int64_t>(), py::arg("offset") = 0,
           py::arg("buffer_offset") = 0,
           py::arg("storage_shape") = std::vector<int64_t>())
      .def_readonly("buffer", &TensorDesc::buffer)
      .def_readonly("buffer_offset", &TensorDesc::buffer_offset)
      .def_property_readonly(
          "dtype",
          [](const TensorDesc& d) { return static_cast<int>(d.dtype); })
      .def_readonly("shape", &TensorDesc::shape)
      .def_readonly("strides", &TensorDesc::strides)
      .def_readonly("offset", &TensorDesc::offset)
      .def_readonly("storage_shape", &TensorDesc::storage_shape);
}

void DefineScalar(py::module_& m) {
  py::class_<ScalarValue>(m, "Scalar", "aclCreateScalar: a typed value.")
      .def(py::init([](double value, int dtype) {
             return ScalarValue{static_cast<kernels::DType>(dtype), value};
           }),
           py::arg("value"), py::arg("dtype") = 0)
      .def_property_readonly(
          "dtype",
          [](const ScalarValue& s) { return static_cast<int>(s.dtype); })
      .def_readonly("value", &ScalarValue::value);
  py::implicitly_convertible<py::float_, ScalarValue>();
  py::implicitly_convertible<py::int_, ScalarValue>();
}

}  // namespace

void DefineValues(py::module_& m) {
  DefineRegistry(m);
  DefineTensorDesc(m);
  DefineScalar(m);
}

}  // namespace opserver::python
