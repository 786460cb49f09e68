# SPDX-License-Identifier: Apache-2.0
# `pip install --no-build-isolation .`: builds the binding (CMake target squall_python, Release)
# in build/pip and puts it beside the package's Python files (pyproject.toml has the rest).
import os
import pathlib
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = ROOT / "build" / "pip"
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DSQUALL_BUILD_TESTS=OFF", "-DSQUALL_BUILD_BENCH=OFF", "-DSQUALL_BUILD_EXAMPLES=OFF",
            "-DSQUALL_BUILD_TOOLS=OFF", "-DSQUALL_BUILD_MPI_INTERPOSE=OFF",
            "-DSQUALL_BUILD_PYTHON=ON", "-DSQUALL_WITH_CUDA=OFF",
            "-DPython_EXECUTABLE=" + sys.executable])
        subprocess.check_call(["cmake", "--build", str(build), "--target", "squall_python",
                               "-j", str(os.cpu_count() or 1)])
        built = next((build / "python" / "squall").glob("_squall*.so"))
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built), str(target))


setup(ext_modules=[Extension("squall._squall", sources=[])], cmdclass={"build_ext": CMakeBuild})
