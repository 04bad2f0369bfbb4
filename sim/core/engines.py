"""The names of the discrete-event engines (`meshsim run --engine`, scenario `run.engine`): one definition.

"compiled" (the default) runs the whole engine on the compiled core (sim/engine/_core.pyx; the Python core
when the extension is not built), "python" is the Python core on meshsim's own event loop
(sim/engine/loop.py; "native" is its former name, still accepted), "simpy" the Python core on simpy's loop
(sim/engine/simpy_loop.py). All give bit-identical event logs (tests/test_engine_compiled.py,
tests/test_engine_loop.py).
"""

from __future__ import annotations

from typing import Literal, get_args

from meshsim.sim.core.errors import UserError

EngineName = Literal["compiled", "python", "native", "simpy"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
ALIASES: dict[str, str] = {"native": "python"}  # former name -> name
DEFAULT_ENGINE: EngineName = "compiled"


def check_engine(flag: str, engine: str | None) -> None:
    """A command-line engine name is one of ENGINE_NAMES (or absent: the scenario's run.engine)."""
    if engine is not None and engine not in ENGINE_NAMES:
        raise UserError(flag, engine, f"use one of {', '.join(n for n in ENGINE_NAMES if n not in ALIASES)}")
