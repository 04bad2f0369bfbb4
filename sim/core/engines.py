"""The names of the discrete-event engines (`meshsim run --engine`, scenario `run.engine`): one definition.

"native" is meshsim's own event loop (sim/engine/loop.py), "simpy" the same engine on simpy's
(sim/engine/simpy_loop.py); both give bit-identical event logs.
"""

from __future__ import annotations

from typing import Literal, get_args

from meshsim.sim.core.errors import UserError

EngineName = Literal["native", "simpy"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
DEFAULT_ENGINE: EngineName = "native"


def check_engine(flag: str, engine: str | None) -> None:
    """A command-line engine name is one of ENGINE_NAMES (or absent: the scenario's run.engine)."""
    if engine is not None and engine not in ENGINE_NAMES:
        raise UserError(flag, engine, f"use one of {', '.join(ENGINE_NAMES)}")
