"""Offline stand-in for @rules_java: re-exports Bazel 4.2.3's native Java rules.

Nothing in opserver is Java; the default JDK toolchains merely load this file.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_plugin = native.java_plugin
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
