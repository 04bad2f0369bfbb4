"""The engine's two event loops behind one interface: meshsim's own (sim/engine/loop.py) and simpy's.

`make_loop(engine)` returns a fresh loop with loop.Loop's interface (`now`, `event()`, `succeed(ev)`,
`timeout(d)`, `process(gen)`, `all_of(evs)`, `run()`; an event's `callbacks` list, None once processed).
SimpyLoop is that interface over `simpy.Environment`: simpy's own events, processes and heap, whose
ordering loop.Loop reproduces (loop.py's docstring), so both engines give bit-identical event logs
(tests/test_engine_loop.py checks it on real scenarios).

"python" (alias "native") is the Python core's loop: the same ordering at about half simpy's cost per event (simpy wraps every
process in a Process event, every yield in a Timeout or Event object with a value and an `ok` flag, and
schedules each process's completion; benchmarks/engine.py measures both), and meshsim does not pay
simpy's import (~65 ms) unless it is asked for.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import get_args

from meshsim.sim.core.engines import ALIASES, EngineName
from meshsim.sim.engine import compiled
from meshsim.sim.engine.loop import Loop


class SimpyLoop:
    """loop.Loop's interface on simpy.Environment."""

    def __init__(self) -> None:
        import simpy  # slow to import (~65 ms): loaded only when this engine is chosen

        env = self._env = simpy.Environment(initial_time=0.0)
        self.event, self.timeout, self.all_of, self.run = env.event, env.timeout, env.all_of, env.run

    @property
    def now(self) -> float:
        return self._env.now

    def process(self, gen: Generator) -> None:
        self._env.process(gen)

    @staticmethod
    def succeed(ev) -> None:
        ev.succeed()


LOOPS = {"python": Loop, "simpy": SimpyLoop}


def resolve_engine(engine: str) -> str:
    """The engine that runs for a name: "native" is "python"; "compiled" is "python" when the extension is
    not built (sim/engine/compiled.py). ValueError for an unknown name."""
    if engine not in get_args(EngineName):
        raise ValueError(f"unknown engine {engine!r}: use one of {', '.join(get_args(EngineName))}")
    engine = ALIASES.get(engine, engine)
    return "python" if engine == "compiled" and not compiled.AVAILABLE else engine


def make_loop(engine: EngineName = "python") -> Loop | SimpyLoop:
    """A fresh event loop of the named Python engine ("python", "native" or "simpy")."""
    engine = resolve_engine(engine)
    if engine not in LOOPS:
        raise ValueError(f"engine {engine!r} has no Python event loop: use one of {', '.join(LOOPS)}")
    return LOOPS[engine]()
