#include "python/opserver/bind_operators.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_signatures.h"

namespace opserver::python {
namespace {

using remote::ScalarValue;
using remote::TensorDesc;

// The operators' typed calls, from op_signatures.h: in Python
// session.ThresholdBackward(gradOutput, self, threshold, out, stream=0,
// launch=True). With launch, the plan is executed on `stream` at once
// (without a workspace: only a strided dropout mask needs one) and None is
// returned; without, the Executor.
#define OPSERVER_PY_PARAM_FLOAT double
#define OPSERVER_PY_PARAM_DOUBLE double
#define OPSERVER_PY_PARAM_BOOL bool
#define OPSERVER_PY_PARAM_SCALAR const ScalarValue&
#define OPSERVER_PY_PARAM(KIND, aclnn_name, field) \
  , OPSERVER_PY_PARAM_##KIND field
#define OPSERVER_PY_ARG(KIND, aclnn_name, field) , field
#define OPSERVER_PY_OP(Name, in0, in1, out, PARAMS)                           \
  session.def(                                                                \
      #Name,                                                                  \
      [](const std::shared_ptr<PySession>& s, const TensorDesc& in0,          \
         const TensorDesc& in1 PARAMS(OPSERVER_PY_PARAM),                     \
         const TensorDesc& out, uint64_t stream, bool launch) -> py::object { \
        absl::StatusOr<remote::Executor> executor;                            \
        {                                                                     \
          py::gil_scoped_release release;                                     \
          executor = s->session->Name(in0, in1 PARAMS(OPSERVER_PY_ARG), out); \
          if (executor.ok() && launch) {                                      \
            absl::Status launched = executor->Execute(stream);                \
            if (!launched.ok()) executor = launched;                          \
          }                                                                   \
        }                                                                     \
        if (!executor.ok()) throw StatusError{executor.status()};             \
        if (launch) return py::none();                                        \
        auto result = std::make_unique<PyExecutor>();                         \
        result->session = s;                                                  \
        result->executor = *std::move(executor);                              \
        return py::cast(std::move(result));                                   \
      },                                                                      \
      py::arg(ArgName(#in0)),                                                 \
      py::arg(ArgName(#in1)) PARAMS(OPSERVER_PY_ARG_NAME), py::arg(#out),     \
      py::arg("stream") = 0, py::arg("launch") = true);
#define OPSERVER_PY_ARG_NAME(KIND, aclnn_name, field) , py::arg(#field)

// A tensor argument's keyword: its wire name, except "self", which pybind11
// already gives the bound Session.
constexpr const char* ArgName(const char* name) {
  return std::string_view(name) == "self" ? "input" : name;
}

}  // namespace

void DefineOperators(PySessionClass& session) {
  OPSERVER_OPERATORS(OPSERVER_PY_OP)
}
#undef OPSERVER_PY_ARG_NAME

#undef OPSERVER_PY_OP
#undef OPSERVER_PY_ARG
#undef OPSERVER_PY_PARAM

namespace {

// Commands recorded for a graph (Session::LaunchCommand and friends), then
// defined by define() as one graph: the Python side of aclmdlRI capture.
struct PyGraphRecorder {
  std::shared_ptr<PySession> session;
  std::vector<v1::PipelineCommand> tasks;
};

// Graph capture: session.record_graph() gives a recorder; recorder.launch
// consumes an executor into it (as a launch would, checked at once);
// recorder.define() sends the definition, waits until the server took it
// (raising its refusal: no Graph is made then) and gives the Graph,
// replayed by replay(stream) and destroyed by destroy() or when its last
// reference goes.
void DefineRecorder(py::module_& m, PySessionClass& session) {
  session.def("record_graph", [](const std::shared_ptr<PySession>& s) {
    auto recorder = std::make_unique<PyGraphRecorder>();
    recorder->session = s;
    return recorder;
  });
  py::class_<PyGraphRecorder>(m, "GraphRecorder",
                              "The tasks of a graph being recorded.")
      .def("__len__", [](PyGraphRecorder& r) { return r.tasks.size(); })
      .def(
          "launch",
          [](PyGraphRecorder& r, PyExecutor& e, uint64_t stream) {
            if (e.session != r.session) {
              throw StatusError{absl::InvalidArgumentError(
                  "the executor belongs to another session")};
            }
            remote::Executor& executor = e.executor;
            if (executor.handle() == 0) {
              throw StatusError{kernels::AclnnError(
                  kernels::kAclnnErrInnerNullptr,
                  absl::StatusCode::kFailedPrecondition,
                  "the executor was already consumed by a launch or a graph, "
                  "or destroyed")};
            }
            py::gil_scoped_release release;
            r.tasks.push_back(ValueOrThrow(r.session->session->LaunchCommand(
                executor.handle(), stream, 0, 0, 0)));
            // Consumed into the graph, as a launch consumes it.
            if (!executor.repeatable()) executor.Release();
          },
          py::arg("executor"), py::arg("stream") = 0)
      .def("define", [](PyGraphRecorder& r) {
        const uint64_t tasks = r.tasks.size();
        absl::StatusOr<uint64_t> handle;
        {
          py::gil_scoped_release release;
          handle = r.session->session->DefineGraph(std::exchange(r.tasks, {}));
          // The server's refusal (a handle gone, its graph limits) here,
          // rather than as an unknown graph at the first replay.
          if (handle.ok()) {
            if (absl::Status taken = r.session->session->Flush(); !taken.ok()) {
              handle = taken;
            }
          }
        }
        const uint64_t id = ValueOrThrow(std::move(handle));
        auto graph = std::make_unique<PyGraph>();
        graph->session = r.session;
        graph->size = tasks;
        graph->handle = id;
        return graph;
      });
}

// Graph: its handle and task count, replay(stream) and destroy().
void DefineGraph(py::module_& m) {
  py::class_<PyGraph>(m, "Graph", "A graph defined on the server.")
      .def_readonly("handle", &PyGraph::handle)
      .def_readonly("tasks", &PyGraph::size)
      .def_readonly("destroyed", &PyGraph::released)
      .def(
          "replay",
          [](PyGraph& g, uint64_t stream) {
            if (g.released) {
              throw StatusError{absl::FailedPreconditionError(absl::StrCat(
                  "graph ", g.handle, " was destroyed; define it again"))};
            }
            py::gil_scoped_release release;
            ThrowIfError(g.session->session->ReplayGraph(g.handle, stream));
          },
          py::arg("stream") = 0)
      .def("destroy", [](PyGraph& g) {
        py::gil_scoped_release release;
        ThrowIfError(g.Release());
      });
}

}  // namespace

void DefineGraphs(py::module_& m, PySessionClass& session) {
  DefineRecorder(m, session);
  DefineGraph(m);
}

}  // namespace opserver::python
