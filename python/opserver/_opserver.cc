// The C++ client (client/client.h) as the Python module opserver._opserver.
// Python reaches the server only through this binding, so pipelining, the
// local phase one, split transfers, the data path, TLS and tokens are the
// C++ client's own; the Python package (opserver/__init__.py) adds the
// conveniences (numpy and torch arrays, result allocation) on top.
//
// Every call that can wait for the network or the device releases the GIL.
// A failed call raises the exception opserver.errors.from_status builds
// from its gRPC code, aclnn status and message.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/device_set.h"
#include "client/etcd_pool.h"
#include "kernels/op_signatures.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/validate.h"

namespace opserver::python {
namespace {

namespace py = pybind11;
using remote::ScalarValue;
using remote::TensorDesc;

// Carries a failed absl::Status out of a binding; the translator registered
// in the module turns it into the Python exception.
struct StatusError {
  absl::Status status;
};

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return *std::move(value);
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    throw StatusError{absl::InternalError("a reply could not be printed")};
  }
  return json;
}

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
py::buffer_info HostBytes(const py::buffer& data, bool writable) {
  py::buffer_info info = data.request(writable);
  int64_t expected = info.itemsize;
  for (int i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] > 1 && info.strides[i] != expected) {
      throw StatusError{absl::InvalidArgumentError(
          "the host array is not C-contiguous; pass a contiguous copy")};
    }
    expected *= info.shape[i];
  }
  return info;
}

uint64_t ByteSize(const py::buffer_info& info) {
  return static_cast<uint64_t>(info.size) * info.itemsize;
}

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

void DefineOperators(
    py::class_<PySession, std::shared_ptr<PySession>>& session){
    OPSERVER_OPERATORS(OPSERVER_PY_OP)}
#undef OPSERVER_PY_ARG_NAME

#undef OPSERVER_PY_OP
#undef OPSERVER_PY_ARG
#undef OPSERVER_PY_PARAM

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
void DefineGraphs(py::module_& m,
                  py::class_<PySession, std::shared_ptr<PySession>>& session) {
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

remote::ConnectOptions MakeOptions(const py::dict& kw) {
  remote::ConnectOptions o;
  auto seconds = [](const py::handle& v) {
    return absl::Seconds(v.cast<double>());
  };
  for (const auto& [key, value] : kw) {
    const std::string name = key.cast<std::string>();
    if (value.is_none()) continue;
    if (name == "connect_timeout") {
      o.connect_timeout = seconds(value);
    } else if (name == "call_timeout") {
      o.call_timeout = seconds(value);
    } else if (name == "wait_timeout") {
      o.wait_timeout = seconds(value);
    } else if (name == "tls_ca_file") {
      o.tls_ca_file = value.cast<std::string>();
    } else if (name == "tls_cert_file") {
      o.tls_cert_file = value.cast<std::string>();
    } else if (name == "tls_key_file") {
      o.tls_key_file = value.cast<std::string>();
    } else if (name == "tls_server_name") {
      o.tls_server_name = value.cast<std::string>();
    } else if (name == "token") {
      o.token = value.cast<std::string>();
    } else if (name == "pipeline") {
      o.pipeline = value.cast<bool>();
    } else if (name == "data_path") {
      o.data_path = value.cast<bool>();
    } else if (name == "transfer_connections") {
      o.transfer_connections = value.cast<int>();
    } else if (name == "max_message_bytes") {
      o.max_message_bytes = value.cast<uint64_t>();
    } else {
      throw StatusError{absl::InvalidArgumentError(
          absl::StrCat("connect() got an unknown option '", name, "'"))};
    }
  }
  return o;
}

// A claim argument that must be a whole number: TypeError naming it for
// anything else (a bool too: True is no device count), `-1` (outside every
// claim setting's range) for one too large for int64_t, so that the range
// check refuses it with its own message.
int64_t ClaimInteger(const py::object& value, absl::string_view name,
                     absl::string_view what) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr())) {
    throw py::type_error(absl::StrCat(name, " must be an int (", what,
                                      "), not ",
                                      Py_TYPE(value.ptr())->tp_name));
  }
  py::object whole =
      py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!whole) throw py::error_already_set();
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(whole.ptr(), &overflow);
  if (number == -1 && PyErr_Occurred()) throw py::error_already_set();
  return overflow != 0 ? -1 : number;
}

// claim_wait_s: an int or a float (anything with __float__ but a bool or a
// string), else TypeError naming it.
double ClaimSeconds(const py::object& value, absl::string_view name,
                    absl::string_view what) {
  PyObject* o = value.ptr();
  if (!PyBool_Check(o) && PyIndex_Check(o)) {
    return static_cast<double>(ClaimInteger(value, name, what));
  }
  if (PyBool_Check(o) || PyUnicode_Check(o) || PyBytes_Check(o) ||
      Py_TYPE(o)->tp_as_number == nullptr ||
      Py_TYPE(o)->tp_as_number->nb_float == nullptr) {
    throw py::type_error(absl::StrCat(name, " must be a number (", what,
                                      "), not ", Py_TYPE(o)->tp_name));
  }
  const double seconds = PyFloat_AsDouble(o);
  if (seconds == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return seconds;
}

// How the caller spelled an argument: "claim=5", as Python prints it.
std::string Shown(absl::string_view name, const py::object& value) {
  return absl::StrCat(name, "=", std::string(py::str(value)));
}

// connect()'s claim arguments over OPSERVER_CLAIM, OPSERVER_CLAIM_WAIT_S
// and OPSERVER_CLAIM_TTL_S: an argument given wins, its variable is not
// read; the same bounds and messages as the variables' (so a value out of
// range is INVALID_ARGUMENT, opserver.InvalidArgument, a ValueError), and
// TypeError for a value of the wrong type.
ClaimOptions MakeClaimOptions(const py::object& claim,
                              const py::object& claim_wait_s,
                              const py::object& claim_ttl_s) {
  std::vector<std::string> given;
  if (!claim.is_none()) given.push_back("OPSERVER_CLAIM");
  if (!claim_wait_s.is_none()) given.push_back("OPSERVER_CLAIM_WAIT_S");
  if (!claim_ttl_s.is_none()) given.push_back("OPSERVER_CLAIM_TTL_S");
  ClaimOptions options = ValueOrThrow(ClaimOptionsFromEnv(given));
  if (!claim.is_none()) {
    const std::string what = absl::StrCat("a device count, 0 to ", kMaxClaim);
    ThrowIfError(SetClaimCount(ClaimInteger(claim, "claim", what),
                               Shown("claim", claim), &options));
  }
  if (!claim_wait_s.is_none()) {
    const std::string what = absl::StrCat("seconds, 0 to ", kMaxClaimWaitS);
    ThrowIfError(SetClaimWait(ClaimSeconds(claim_wait_s, "claim_wait_s", what),
                              Shown("claim_wait_s", claim_wait_s), &options));
  }
  if (!claim_ttl_s.is_none()) {
    const std::string what = absl::StrCat("a lease TTL in seconds, ",
                                          kMinClaimTtlS, " to ", kMaxClaimTtlS);
    ThrowIfError(SetClaimTtl(ClaimInteger(claim_ttl_s, "claim_ttl_s", what),
                             Shown("claim_ttl_s", claim_ttl_s), &options));
  }
  return options;
}

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

PYBIND11_MODULE(_opserver, m) {
  m.doc() = "opserver's C++ client; use the opserver package instead.";

  // Failures become the exception opserver.errors.from_status makes.
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

  py::class_<PyClient, std::shared_ptr<PyClient>>(m, "Client")
      .def_static(
          "connect",
          [](const std::string& address, const py::kwargs& kw) {
            remote::ConnectOptions options = MakeOptions(kw);
            absl::StatusOr<std::unique_ptr<remote::Client>> client;
            {
              py::gil_scoped_release release;
              client = remote::Client::Connect(address, options);
            }
            return std::make_shared<PyClient>(
                PyClient{ValueOrThrow(std::move(client))});
          },
          py::arg("address"))
      .def_property_readonly("address",
                             [](PyClient& c) { return c.client->address(); })
      .def(
          "device_info",
          [](PyClient& c) {
            absl::StatusOr<v1::GetDeviceInfoResponse> info;
            {
              py::gil_scoped_release release;
              info = c.client->GetDeviceInfo();
            }
            return ToJson(ValueOrThrow(std::move(info)));
          },
          "GetDeviceInfo as JSON.")
      .def(
          "health",
          [](PyClient& c, const std::string& service) {
            py::gil_scoped_release release;
            return ValueOrThrow(c.client->CheckHealth(service));
          },
          py::arg("service") = "")
      .def(
          "create_session",
          [](const std::shared_ptr<PyClient>& c, const std::string& name,
             bool attach, uint32_t device) {
            absl::StatusOr<std::unique_ptr<remote::Session>> session;
            {
              py::gil_scoped_release release;
              session = c->client->CreateSession(name, attach, device);
            }
            auto s = std::make_shared<PySession>();
            s->owner = c;
            s->session = ValueOrThrow(std::move(session));
            return s;
          },
          py::arg("name"), py::arg("attach") = true, py::arg("device") = 0);

  py::class_<PyDeviceSet, std::shared_ptr<PyDeviceSet>>(m, "DeviceSet")
      .def_static(
          "connect",
          [](const std::string& address, const py::object& claim,
             const py::object& claim_wait_s, const py::object& claim_ttl_s,
             const py::kwargs& kw) {
            remote::ConnectOptions options = MakeOptions(kw);
            ClaimOptions claims =
                MakeClaimOptions(claim, claim_wait_s, claim_ttl_s);
            const EtcdCredentials etcd = EtcdCredentialsFromEnv();
            absl::StatusOr<std::unique_ptr<remote::DeviceSet>> set;
            {
              py::gil_scoped_release release;
              set = remote::DeviceSet::ConnectAddress(address, options, claims,
                                                      etcd);
            }
            return std::make_shared<PyDeviceSet>(
                PyDeviceSet{ValueOrThrow(std::move(set))});
          },
          py::arg("address"), py::arg("claim") = py::none(),
          py::arg("claim_wait_s") = py::none(),
          py::arg("claim_ttl_s") = py::none())
      .def_property_readonly("size",
                             [](PyDeviceSet& d) { return d.set->size(); })
      .def(
          "device",
          [](PyDeviceSet& d, uint32_t ordinal) {
            remote::DeviceSet::Device device =
                ValueOrThrow(d.set->device(ordinal));
            return py::make_tuple(d.set->addresses()[device.server],
                                  device.local, ToJson(device.info));
          },
          py::arg("ordinal"),
          "(server address, the server's device index, DeviceInfo as JSON)")
      .def(
          "create_session",
          [](const std::shared_ptr<PyDeviceSet>& d, uint32_t ordinal,
             const std::string& name, bool attach) {
            absl::StatusOr<std::unique_ptr<remote::Session>> session;
            {
              py::gil_scoped_release release;
              session = d->set->CreateSession(ordinal, name, attach);
            }
            auto s = std::make_shared<PySession>();
            s->owner = d;
            s->session = ValueOrThrow(std::move(session));
            return s;
          },
          py::arg("ordinal"), py::arg("name"), py::arg("attach") = true)
      .def("release_claim", [](PyDeviceSet& d) {
        py::gil_scoped_release release;
        d.set->ReleaseClaim();
      });

  py::class_<PySession, std::shared_ptr<PySession>> session(m, "Session");
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
      .def("stats",
           [](PySession& s) {
             absl::StatusOr<v1::SessionStats> stats;
             {
               py::gil_scoped_release release;
               stats = s.session->Stats();
             }
             return ToJson(ValueOrThrow(std::move(stats)));
           })
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
          py::arg("stream") = 0)
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
  DefineOperators(session);
  DefineGraphs(m, session);

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
}  // namespace opserver::python
