// Client.connect() and DeviceSet.connect() with their options (connect()'s
// keywords and the pool's claim arguments), and the sessions they open.

#include "python/opserver/bind_connect.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/etcd_pool.h"

namespace opserver::python {
namespace {

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
    } else if (name == "keep_data_connections") {
      o.keep_data_connections = value.cast<bool>();
    } else if (name == "transfer_connections") {
      o.transfer_connections = value.cast<int>();
    } else if (name == "transfer_idle_timeout") {
      o.transfer_idle_timeout = seconds(value);
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

void DefineClient(py::module_& m) {
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
}

void DefineDeviceSet(py::module_& m) {
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
}

}  // namespace

void DefineConnections(py::module_& m) {
  DefineClient(m);
  DefineDeviceSet(m);
}

}  // namespace opserver::python
