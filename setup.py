"""Compiles the native CPU kernels at ``pip install`` (metadata is in pyproject.toml).

``build_ext`` compiles ``jaxgen/backends/cpu_kernels/native`` into ``cpu_kernels/_native`` of the
wheel, or of the checkout for ``pip install -e .``, with the flags the build on first use takes
(``cpu_kernels/compile.py``, loaded by path: building imports neither jax nor jaxgen). Without a
compiler, or where the build fails, the install still succeeds with a warning, and a run builds
the kernels on first use or keeps the pure-JAX path.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

KERNELS = Path("jaxgen", "backends", "cpu_kernels")


def _compile_module():
    path = Path(__file__).resolve().parent / KERNELS / "compile.py"
    spec = importlib.util.spec_from_file_location("_jaxgen_kernels_compile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildCpuKernels(build_ext):
    """``build_ext`` that also compiles the native kernels' shared library."""

    def _target(self) -> Path:
        if self.inplace:  # editable install: beside the sources the checkout imports
            return Path(__file__).resolve().parent / KERNELS / "_native"
        return Path(self.build_lib) / KERNELS / "_native"

    def run(self):
        super().run()
        compile_module = _compile_module()
        compiler = compile_module.find_compiler()
        if compiler is None:
            self._warn("no C++ compiler (g++, c++ or $CXX)")
            return
        try:
            library = compile_module.build_installed(compiler, self._target())
        except Exception as error:  # noqa: BLE001 (a failed build never fails the install)
            self._warn(getattr(error, "stderr", "") or str(error))
            return
        print(f"jaxgen: native CPU kernels built into {library}")

    def _warn(self, reason: str) -> None:
        print(
            f"WARNING: jaxgen's native CPU kernels were not built at install: {reason}. "
            "A run builds them on first use where it can, else takes the pure-JAX path.",
            file=sys.stderr,
        )

    def get_outputs(self):
        target = self._target()
        built = [target / "jaxgen_cpu_kernels.so", target / "jaxgen_cpu_kernels.json"]
        return [*super().get_outputs(), *(str(path) for path in built if path.exists())]


class PlatformDistribution(Distribution):
    """A platform wheel (it holds a shared library), so ``build_ext`` runs."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_ext": BuildCpuKernels}, distclass=PlatformDistribution)
