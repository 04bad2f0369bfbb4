"""Builds meshsim's optional compiled extensions with Cython:
- meshsim.sim.engine._core (sim/engine/_core.pyx), the engine's core, when that source is present;
- meshsim.sim.kineto._collect (sim/kineto/_collect.pyx), the trace reader's byte scanner (sim/kineto/fast.py);
- meshsim.sim.engine._rows (sim/engine/_rows.pyx), the compiled core's event log as arrays (built with _core:
  the core needs both);
- meshsim.sim.outputs._trace (sim/outputs/_trace.pyx), trace.json's op slices written from those arrays
  (sim/outputs/trace_rows.py; without it the Python writer runs, same bytes);
- meshsim.sim.results._walk (sim/results/_walk.pyx), the critical-path walk over the log's columns
  (sim/results/critical_path.py; without it the Python walk runs, same segments);
- meshsim.sim.cost.collectives._maxmin (sim/cost/collectives/_maxmin.pyx), max-min fair progressive filling
  (sim/cost/collectives/maxmin.py; without it the Python filling runs, same floats).

Everything else is in pyproject.toml. Each extension is optional: without Cython or a working C compiler
the build goes on without it and the Python code runs (the trace reader falls back silently; its output
is the same either way). Compiled with -O2 and -ffp-contract=off (no fused multiply-add) and no
fast-math, so every float operation is the IEEE double operation the Python code performs.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]
MODULES = (  # (module, .pyx source), each built when its source is in the tree
    ("meshsim.sim.engine._core", os.path.join("sim", "engine", "_core.pyx")),
    ("meshsim.sim.kineto._collect", os.path.join("sim", "kineto", "_collect.pyx")),
    ("meshsim.sim.engine._rows", os.path.join("sim", "engine", "_rows.pyx")),
    ("meshsim.sim.outputs._trace", os.path.join("sim", "outputs", "_trace.pyx")),
    ("meshsim.sim.results._walk", os.path.join("sim", "results", "_walk.pyx")),
    ("meshsim.sim.cost.collectives._maxmin", os.path.join("sim", "cost", "collectives", "_maxmin.pyx")),
)


class OptionalBuildExt(build_ext):
    """build_ext that warns and goes on when an extension cannot be compiled (no compiler, no headers)."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure leaves the Python code in place
            self._skip(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._skip(exc, ext.name)

    @staticmethod
    def _skip(exc: Exception, name: str = "extensions") -> None:
        sys.stderr.write(f"meshsim: the compiled {name} was not built ({exc}); the Python code will run\n")


def extensions() -> list[Extension]:
    """Each present module from its .pyx through Cython when it is installed, else from a shipped .c."""
    present = [(name, pyx) for name, pyx in MODULES if os.path.exists(os.path.join(HERE, pyx))]
    try:
        from Cython.Build import cythonize
    except ImportError:
        return [Extension(name, [pyx[:-4] + ".c"], extra_compile_args=FLAGS) for name, pyx in present
                if os.path.exists(os.path.join(HERE, pyx[:-4] + ".c"))]
    out = []
    for name, pyx in present:  # one at a time: a Cython failure in one leaves the others
        try:
            out += cythonize([Extension(name, [pyx], extra_compile_args=FLAGS)],
                             compiler_directives={"language_level": "3"}, quiet=True)
        except Exception as exc:  # noqa: BLE001 - a Cython failure leaves the Python code in place
            OptionalBuildExt._skip(exc, name)
    return out


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
