"""The results table of a sweep, shared by the terminal table (sim/cli/sweep.py) and the report page.

Columns are fitted to the terminal by sim/core/console.py: the pinned ones stay at any width, the others
leave in rank order and are named under the table.
"""

from __future__ import annotations

from meshsim.sim.core.console import Column
from meshsim.sim.core.fmt import fmt_pct, fmt_tokens, time_column
from meshsim.sim.results.critical_path import CATEGORIES
from meshsim.sim.sweep.explain import AXIS_LABELS, fmt_gb, ok, varying_axes
from meshsim.sim.sweep.record import SweepRecord

TABLE_AXES = ("tp", "pp", "vp", "sp", "micro_batch", "tp_comm_overlap", "recompute", "ep", "etp", "fp8")  # the table's axis order
PINNED_AXES = ("tp", "pp", "sp")  # shown at any width, with the axes that vary


def _step_column(records: list[SweepRecord]):
    return time_column([r.result.step_time_s for r in records if ok(r)] or [1.0])


def _axis_text(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def table_columns(records: list[SweepRecord]) -> list[Column]:
    """The columns of the results table. Kept at any width: tp, pp, sp, the other axes that vary, dp,
    step, tokens/s, MFU, fits; the others leave a narrow terminal in this order: CP wait, the other CP
    shares, the axes that do not vary, compute waits, TFLOP/s/GPU, GiB/GPU."""
    varying = set(varying_axes(records))
    unit, _ = _step_column(records)
    axis = [Column(AXIS_LABELS[a], keep=a in varying or a in PINNED_AXES, rank=3) for a in TABLE_AXES]
    return axis + [
        Column("dp", keep=True), Column(f"step ({unit})", keep=True), Column("tokens/s", keep=True),
        Column("TFLOP/s/GPU", rank=5), Column("MFU", keep=True), Column("GiB/GPU", rank=6),
        Column("fits", "left", keep=True), Column("compute waits", rank=4), Column("CP compute", rank=2),
        Column("CP TP", rank=1), Column("CP DP", rank=1), Column("CP wait", rank=0)]


def table_rows(records: list[SweepRecord]) -> list[list[str]]:
    """One row per configuration, in table_columns' order; a skipped one carries its reason in 'fits'."""
    _, fmt_step = _step_column(records)
    rows = []
    for record in records:
        res = record.result
        head = [_axis_text(getattr(record.point, a, 1)) for a in TABLE_AXES]
        if not ok(record):
            rows.append(head + ["-"] * 6 + ["skipped: " + record.reason] + ["-"] * 5)
            continue
        mem, share, b = res.memory_gb, res.critical_path_share, res.breakdown_s
        rows.append(head + [str(res["dp"]), fmt_step(res.step_time_s), fmt_tokens(res.tokens_per_s),
                            f"{res.tflops_per_gpu:.0f}", fmt_pct(res.mfu), f"{fmt_gb(mem.total)}/{fmt_gb(mem.capacity)}",
                            "yes" if mem.fits else "NO", fmt_pct(b.get("compute_waiting", 0.0) / res.step_time_s)]
                    + [fmt_pct(share.get(k, 0.0)) for k in CATEGORIES])
    return rows
