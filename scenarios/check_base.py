"""What every cross-field rule shares: the check context, the GPU / dp arithmetic and the error form.

scenarios/checks.py (dense model and layout rules) and scenarios/moe_checks.py (mixture-of-experts and
expert-parallel rules) both build on these; `check_scenario` (checks.py) runs both rule lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshsim.scenarios.schema import Scenario
from meshsim.sim.core.errors import UserError


@dataclass(frozen=True)
class CheckContext:
    source: str  # scenario file or "builtin:NAME", for messages
    topology_gpus: int  # GPUs in the whole topology (all nodes)
    gpus_per_node: int | None = None  # default: topology_gpus / topology.nodes


def divisors(n: int) -> list[int]:
    """Divisors of n in increasing order, by trial division up to sqrt(n) (n <= MAX_MODEL_DIM: <= 4,096 steps)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def gpus_used(scenario: Scenario, topology_gpus: int) -> int:
    """parallel.gpus, or every GPU of the topology."""
    return scenario.parallel.gpus or topology_gpus


def data_parallel(scenario: Scenario, gpus: int) -> int:
    """dp as given, or gpus / (tp x cp x pp) when 'auto'."""
    p = scenario.parallel
    return gpus // (p.tp * p.cp * p.pp) if p.dp == "auto" else p.dp


def fmt_set(values: list[int]) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def use_in(name: str, values: list[int]) -> str:
    """The fix 'use NAME in {1, 2, 4}', or, when no value fits, what to change instead: never an empty set."""
    return f"use {name} in {fmt_set(values)}" if values else f"no {name} fits the other settings (change them)"


def rule_error(ctx: CheckContext, field: str, value: object, problem: str, fix: str) -> UserError:
    return UserError(field, value, fix, source=ctx.source, problem=problem)
