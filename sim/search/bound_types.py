"""The bounds' shared records and pricing: `Bound` (either level), `StageBound`, the float margins, and
`Pricer`, the priced duration of an op (sim/search/bound.py step 3; cheap_bound.py step 1)."""

from __future__ import annotations

from dataclasses import dataclass

from meshsim.scenarios.resolved import ResolvedScenario
from meshsim.sim.results.costers import CollectiveCoster, compute_fn
from meshsim.sim.schedule.ops import Collective

RELATIVE_MARGIN = 1e-9  # bound.py step 6: float rounding of the engine's sums
PER_OP_MARGIN_S = 2e-15  # bound.py step 6: the arbiter's completion epsilon, per op summed
LEVELS = ("cheap", "refined")  # cheap_bound.py; bound.py


@dataclass(frozen=True)
class StageBound:
    """One stage's terms: every FIFO stream's bound and the host's static clock, for the full step."""

    stage: int
    busy_s: tuple[tuple[str, float], ...]  # (stream, seconds), streams with ops only
    host_s: float

    @property
    def worst(self) -> tuple[str, float]:
        """The binding term: ("compute", s), ("tp_comm", s), ... or ("host", s)."""
        return max((*self.busy_s, ("host", self.host_s)), key=lambda t: t[1])


@dataclass(frozen=True)
class Bound:
    step_s: float  # the lower bound, margins applied
    stages: tuple[StageBound, ...]
    short_micro_batches: int  # m' of bound.py step 5 (== micro_batches: no premise used; 0: the cheap level)
    micro_batches: int
    level: str = "refined"  # LEVELS

    @property
    def binding(self) -> tuple[int, str]:
        """(stage, term) that gives the bound."""
        best = max(self.stages, key=lambda sb: sb.worst[1])
        return best.stage, best.worst[0]


class Pricer:
    """Priced duration of a FIFO op (or a block template's op) on a rank: compute_s, or latency + bandwidth of
    its collective on the rank's group (bound.py step 3)."""

    def __init__(self, rs: ResolvedScenario):
        self.rs, self.compute_s, self.coster = rs, compute_fn(rs), CollectiveCoster(rs)

    def __call__(self, op, rank: int) -> float:
        if isinstance(op.work, Collective):
            latency_s, bandwidth_s, _ = self.coster(op, self.rs.group(op.work.group, rank))
            return latency_s + bandwidth_s
        return self.compute_s(op, rank)
