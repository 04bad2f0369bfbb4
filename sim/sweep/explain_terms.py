"""The terms every sweep explanation is written in: which records ran and fit, the sweet spot, the labels
of a configuration over the varying axes, memory figures and speed deltas relative to the sweet spot.

Sweet spot = the configuration with the highest `tokens_per_s` among those that ran and fit in memory
(`memory_gb.fits`); ties go to the first in sweep order (smallest tp).
"""

from __future__ import annotations

import math

from meshsim.sim.core.fmt import fmt_gb_as_gib, fmt_pct
from meshsim.sim.results.records import MemoryGB
from meshsim.sim.sweep.axes import AXES
from meshsim.sim.sweep.record import SweepRecord

AXIS_LABELS = {"tp": "tp", "sp": "sp", "micro_batch": "mb", "tp_comm_overlap": "overlap", "recompute": "recompute",
               "pp": "pp", "vp": "vp", "ep": "ep", "etp": "etp", "cp": "cp", "fp8": "fp8", "fsdp": "fsdp",
               "dist_opt_instances": "instances"}


# ----- selection ------------------------------------------------------------------------------------
def ok(record: SweepRecord) -> bool:
    return record.ok


def fits(record: SweepRecord) -> bool:
    return record.fits


def sweet_spot(records: list[SweepRecord]) -> SweepRecord | None:
    """The fitting configuration with the most tokens/s (first one on ties), or None."""
    candidates = [r for r in records if fits(r)]
    return max(candidates, key=lambda r: r.result.tokens_per_s) if candidates else None


def smallest_overflow(records: list[SweepRecord]) -> SweepRecord | None:
    """Among configurations that ran but do not fit, the one with the least memory per GPU."""
    over = [r for r in records if ok(r) and not fits(r)]
    return min(over, key=lambda r: r.result.memory_gb.total) if over else None


# ----- formatting -----------------------------------------------------------------------------------
def fmt_gb(value: float) -> str:
    """A memory figure held in GB (1e9 B), shown in GiB without the unit: 77.01 -> '71.7'."""
    return fmt_gb_as_gib(value, unit=False)


def varying_axes(records: list[SweepRecord]) -> list[str]:
    """Axes with more than one value in the sweep; tp always."""
    return [a for a in AXES if a == "tp" or len({getattr(r.point, a) for r in records}) > 1]


def label(record: SweepRecord, axes: list[str]) -> str:
    """'tp=8, sp=on' over the given axes."""
    parts = []
    for name in axes:
        value = getattr(record.point, name)
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        parts.append(f"{AXIS_LABELS[name]}={text}")
    return ", ".join(parts)


def memory_of(rec: SweepRecord) -> MemoryGB:
    return rec.result.memory_gb


def nodes_spanned(rec: SweepRecord) -> int:
    res = rec.result
    return math.ceil(res["tp"] / res["gpus_per_node"])


def speed_delta(rec: SweepRecord, best: SweepRecord) -> str:
    """"23% fewer tokens/s" relative to the sweet spot ("0.07% more", never "0% more")."""
    ratio = rec.result.tokens_per_s / best.result.tokens_per_s
    if ratio == 1:
        return "the same tokens/s"
    return f"{fmt_pct(1 - ratio)} fewer tokens/s" if ratio < 1 else f"{fmt_pct(ratio - 1)} more tokens/s"

