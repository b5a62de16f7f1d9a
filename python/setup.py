"""Packages opserver's Python client for pip.

The extension (opserver/_opserver.so) is the C++ client bound with
pybind11; it is built by Bazel, not by setuptools, so the package uses the
same compiler flags, libraries and link script as every other build of the
project. With OPSERVER_EXTENSION set to a built _opserver.so, that file is
packaged instead (the package test does so: a test cannot run Bazel).
"""

import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET = "//python:opserver/_opserver.so"


def release():
    """The release every binary reports (common/version.h), when the
    checkout is there; a copied python/ directory has no version.h."""
    path = os.path.join(ROOT, "common", "version.h")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            m = re.search(r'kRelease\[\] = "([^"]+)"', f.read())
            if m:
                return m.group(1)
    return os.environ.get("OPSERVER_VERSION", "0.0.0")


def built_extension():
    prebuilt = os.environ.get("OPSERVER_EXTENSION")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise SystemExit("OPSERVER_EXTENSION=%s is not a file" % prebuilt)
        return prebuilt
    if not os.path.exists(os.path.join(ROOT, "WORKSPACE")):
        raise SystemExit(
            "setup.py: no opserver checkout above %s to build the extension "
            "in; build //python:opserver/_opserver.so and set "
            "OPSERVER_EXTENSION to it" % HERE)
    subprocess.run(["bazel", "build", "-c", "opt", TARGET], cwd=ROOT,
                   check=True)
    bazel_bin = subprocess.run(
        ["bazel", "info", "-c", "opt", "bazel-bin"], cwd=ROOT, check=True,
        capture_output=True, text=True).stdout.strip()
    return os.path.join(bazel_bin, "python", "opserver", "_opserver.so")


class BuildPyWithExtension(build_py):
    """Copies the Bazel-built extension beside the package's sources."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "opserver", "_opserver.so")
        shutil.copyfile(built_extension(), target)
        os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    """A platform wheel: the package holds a compiled extension."""

    def has_ext_modules(self):
        return True


setup(
    version=release(),
    packages=["opserver", "opserver.torch"],
    package_dir={"": "."},
    cmdclass={"build_py": BuildPyWithExtension},
    distclass=BinaryDistribution,
)
