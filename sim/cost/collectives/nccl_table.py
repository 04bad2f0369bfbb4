"""nccl-tests, simulated: the size sweep and its rows (bytes, time_us, algbw_GBps, busbw_GBps, algorithm).

Sizes follow nccl-tests' -b/-e/-f: min, min x f, min x f^2, ... up to max inclusive (rounded to whole
bytes). Every size reuses the same evaluated plans (cost.py memoizes per group, not per size), so a sweep
costs one plan evaluation per algorithm plus a closed form per size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from meshsim.sim.core.errors import UserError
from meshsim.sim.cost.collectives.choose import algorithms_for
from meshsim.sim.cost.collectives.cost import CollectiveCost, collective_costs
from meshsim.sim.cost.collectives.protocols import IDEAL, protocols_for
from meshsim.topologies.model import Topology

ROW_KEYS = ("bytes", "time_us", "algbw_GBps", "busbw_GBps", "algorithm")  # the JSON spells GB/s (1e9 B/s)


@dataclass(frozen=True)
class Row:
    bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    algorithm: str  # "ring/simple"

    def to_dict(self) -> dict:
        return dict(zip(ROW_KEYS, asdict(self).values(), strict=True))


def sweep_sizes(min_bytes: int, max_bytes: int, step_factor: float) -> list[int]:
    """min, min*f, ... <= max (nccl-tests -b -e -f). UserError for min < 1, min > max or f <= 1."""
    if min_bytes < 1:
        raise UserError("--min-bytes", min_bytes, "use a size >= 1 byte, e.g. 1K")
    if max_bytes < min_bytes:
        raise UserError("--max-bytes", max_bytes, f"use a size >= --min-bytes ({min_bytes})")
    if not step_factor > 1:
        raise UserError("--step-factor", step_factor, "use a factor > 1, e.g. 2")
    sizes, size = [], float(min_bytes)
    while round(size) <= max_bytes:
        if not sizes or round(size) > sizes[-1]:
            sizes.append(round(size))
        size *= step_factor
    return sizes


def row_of(cost: CollectiveCost) -> Row:
    return Row(cost.nbytes, cost.time_s * 1e6, cost.algbw_gbps, cost.busbw_gbps, f"{cost.algo}/{cost.protocol}")


def sweep(topo: Topology, op: str, ranks: Sequence[int], sizes: Sequence[int], *, algo: str = "auto",
          protocol: str = "auto", tuning=None) -> list[Row]:
    return [row_of(c) for c in collective_costs(topo, op, ranks, sizes, algo=algo, protocol=protocol, tuning=tuning,
                                                link_loads=False)]


def curves(topo: Topology, op: str, ranks: Sequence[int], sizes: Sequence[int], *, protocol: str = "auto",
           tuning=None, known: dict[str, list[Row]] | None = None) -> dict[str, list[Row]]:
    """Rows per applicable algorithm (best protocol for it, or `protocol` where the algorithm supports it)
    plus the auto choice under key "auto"; curves already swept are passed in `known` and reused."""
    usable = [a for a in algorithms_for(topo, op, ranks)
              if protocol in ("auto", IDEAL) or protocol in protocols_for(a)]
    out = dict(known or {})
    for key in (*usable, "auto"):
        if key not in out:
            algo = "auto" if key == "auto" else key
            out[key] = sweep(topo, op, ranks, sizes, algo=algo, protocol=protocol, tuning=tuning)
    return out
