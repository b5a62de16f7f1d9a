"""cc_grpc_proto: C++ message + gRPC stubs for one .proto with the system protoc.

Bazel's native proto rules need @com_google_protobuf, which these offline
machines cannot fetch, so a genrule runs Debian's protoc and grpc_cpp_plugin
and a cc_library wraps what they generate.

Usage (one line per .proto):

    cc_grpc_proto(name = "opserver_proto", src = "opserver.proto")

Two libraries come out: `<name>_messages`, the messages alone (`.pb.h`,
linking protobuf but not gRPC), for code that must not depend on the
transport (//runtime), and `<name>`, the gRPC stubs over them (`.grpc.pb.h`,
with the messages as a dependency), for everything else.

Generated headers are included by their path relative to the workspace root,
e.g. `#include "proto/opserver.grpc.pb.h"`. For a proto outside the workspace
(a system .proto such as grpc/health/v1/health.proto), pass `system_src` with
its path below `system_root`; its headers are then included by that path.
"""

def cc_grpc_proto(name, src = None, system_src = None, system_root = "/usr/share/grpc-proto", deps = [], visibility = None):
    if (src == None) == (system_src == None):
        fail("cc_grpc_proto needs exactly one of src and system_src")
    pkg = native.package_name()
    if src:
        base = src[:-len(".proto")]
        outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
        cmd = ("$(location @system//:protoc) --proto_path=. " +
               "--cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=$(location @system//:grpc_cpp_plugin) " +
               "$(location " + src + ")")
        srcs = [src]
        includes = []
    else:
        base = system_src[:-len(".proto")]
        outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
        cmd = ("$(location @system//:protoc) --proto_path=" + system_root + " " +
               "--cpp_out=$(@D) --grpc_out=$(@D) " +
               "--plugin=protoc-gen-grpc=$(location @system//:grpc_cpp_plugin) " +
               system_root + "/" + system_src)
        srcs = []
        includes = ["."]

    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs,
        cmd = cmd,
        tools = ["@system//:protoc", "@system//:grpc_cpp_plugin"],
    )
    native.cc_library(
        name = name + "_messages",
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        includes = includes,
        deps = deps + ["@system//:protobuf"],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".grpc.pb.cc"],
        hdrs = [base + ".grpc.pb.h"],
        includes = includes,
        deps = [name + "_messages", "@system//:grpc++"],
        visibility = visibility,
    )
