"""Builds the optional compiled engine core (sim/engine/_core.pyx, sim/engine/compiled.py) with Cython.

Everything else is in pyproject.toml. The extension is optional: without Cython or a working C compiler the
build goes on without it and the Python core runs (`meshsim --version` names the core in use). Compiled
with -O2 and -ffp-contract=off (no fused multiply-add) and no fast-math, so every float operation is the
IEEE double operation the Python core performs: the two cores give bit-identical results.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
PYX = os.path.join("sim", "engine", "_core.pyx")
C_SOURCE = os.path.join("sim", "engine", "_core.c")
FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on when the extension cannot be compiled (no compiler, no headers)."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure leaves the Python core in place
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._skip(exc)

    @staticmethod
    def _skip(exc: Exception) -> None:
        sys.stderr.write(f"meshsim: the compiled engine core was not built ({exc}); the Python core will run\n")


def extensions() -> list[Extension]:
    """The core from the .pyx through Cython when it is installed, else from a shipped .c, else none."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        if os.path.exists(os.path.join(HERE, C_SOURCE)):
            return [Extension("meshsim.sim.engine._core", [C_SOURCE], extra_compile_args=FLAGS)]
        return []
    try:
        return cythonize([Extension("meshsim.sim.engine._core", [PYX], extra_compile_args=FLAGS)],
                         compiler_directives={"language_level": "3"}, quiet=True)
    except Exception as exc:  # noqa: BLE001 - a Cython failure leaves the Python core in place
        OptionalBuildExt._skip(exc)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
