"""The tables of a sweep, shared by the terminal (sim/cli/sweep.py) and the report page.

Two tables, each fitted to the terminal by sim/core/console.py (the pinned columns stay at any width, the
others leave in rank order and are named under the table):
- the results: axes, dp, step, tokens/s, TFLOP/s/GPU, MFU, GiB/GPU, fits, compute waits;
- the critical path: for every configuration, the share of its step in each critical-path category, in
  the order of the one category list (sim/results/critical_path.py CATEGORY_NAMES) and then any other
  category a result carries, so a new category gets its column without being listed here. The
  categories tile the step (critical_path.py), and the whole percents shown are rounded by largest
  remainder (`whole_percents`), so every row adds up to exactly 100%.
The sweet spot's row carries SWEET_MARK in its first column (a character survives a pipe; colour not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshsim.sim.core.console import Column
from meshsim.sim.core.fmt import fmt_pct, fmt_tokens, time_column
from meshsim.sim.results.critical_path import CATEGORY_NAMES
from meshsim.sim.sweep.explain_terms import AXIS_LABELS, fmt_gb, ok, sweet_spot, varying_axes
from meshsim.sim.sweep.record import SweepRecord

# the table's axis order
TABLE_AXES = ("tp", "pp", "vp", "sp", "micro_batch", "tp_comm_overlap", "recompute", "ep", "etp", "cp", "fp8",
              "fsdp", "dist_opt_instances")
PINNED_AXES = ("tp", "pp", "sp")  # shown at any width, with the axes that vary
LAYOUT_AXES = ("tp", "pp", "cp")  # tp x pp x cp x dp = the GPUs: each shown at any width once it is not 1
SWEET_MARK = "*"
MARK_COLUMN = Column("", "left", keep=True)
COMPUTE_WAITS = "compute waits"


def _step_column(records: list[SweepRecord]):
    return time_column([r.result.step_time_s for r in records if ok(r)] or [1.0])


def _axis_text(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _marks(records: list[SweepRecord]) -> list[str]:
    best = sweet_spot(records)
    return [SWEET_MARK if rec is best else "" for rec in records]


def _axis_columns(records: list[SweepRecord]) -> list[Column]:
    """Kept: the pinned axes, those that vary, and a layout axis whose degree is not 1 in some row (a
    hidden cp = 2 would leave tp=1 pp=1 dp=4 on 8 GPUs looking wrong)."""
    kept = set(varying_axes(records)) | set(PINNED_AXES)
    kept |= {a for a in LAYOUT_AXES if any(getattr(r.point, a, 1) not in (1, None) for r in records)}
    return [Column(AXIS_LABELS[a], keep=a in kept, rank=3) for a in TABLE_AXES]


def _axis_cells(record: SweepRecord) -> list[str]:
    return [_axis_text(getattr(record.point, a, 1)) for a in TABLE_AXES]


def table_columns(records: list[SweepRecord]) -> list[Column]:
    """The columns of the results table. Kept at any width: the mark, tp, pp, sp, the other axes that vary,
    dp, step, tokens/s, MFU, fits; the others leave a narrow terminal in this order: the axes that do not
    vary, compute waits, TFLOP/s/GPU, GiB/GPU."""
    unit, _ = _step_column(records)
    return [MARK_COLUMN] + _axis_columns(records) + [
        Column("dp", keep=True), Column(f"step ({unit})", keep=True), Column("tokens/s", keep=True),
        Column("TFLOP/s/GPU", rank=5), Column("MFU", keep=True), Column("GiB/GPU", rank=6),
        Column("fits", "left", keep=True), Column(COMPUTE_WAITS, rank=4)]


def table_rows(records: list[SweepRecord]) -> list[list[str]]:
    """One row per configuration, in table_columns' order; a skipped one carries its reason in 'fits'."""
    _, fmt_step = _step_column(records)
    rows = []
    for mark, record in zip(_marks(records), records, strict=True):
        res = record.result
        head = [mark] + _axis_cells(record)
        if not ok(record):
            rows.append(head + ["-"] * 6 + ["skipped: " + record.reason] + ["-"])
            continue
        mem, b = res.memory_gb, res.breakdown_s
        rows.append(head + [str(res["dp"]), fmt_step(res.step_time_s), fmt_tokens(res.tokens_per_s),
                            f"{res.tflops_per_gpu:.0f}", fmt_pct(res.mfu), f"{fmt_gb(mem.total)}/{fmt_gb(mem.capacity)}",
                            "yes" if mem.fits else "NO", fmt_pct(b.get("compute_waiting", 0.0) / res.step_time_s)])
    return rows


# ----- the critical path ----------------------------------------------------------------------------
def share_categories(records: list[SweepRecord]) -> list[str]:
    """The critical-path categories the records carry: CATEGORY_NAMES' order, then any other (sorted)."""
    present = {k for r in records if ok(r) for k in r.result.critical_path_share}
    return [k for k in CATEGORY_NAMES if k in present] + sorted(present - set(CATEGORY_NAMES))


def category_name(key: str) -> str:
    """How reports name a category: CATEGORY_NAMES, or the key in words for one it does not name."""
    return CATEGORY_NAMES.get(key, key.replace("_", " "))


def share_header(key: str) -> str:
    """A short column header: the category's name without ' communication', its last word ('TP', 'P2P',
    'bubble', 'compute', 'waiting'); the key itself for a category CATEGORY_NAMES does not name."""
    if key not in CATEGORY_NAMES:
        return key
    return CATEGORY_NAMES[key].removesuffix(" communication").split()[-1]


def whole_percents(shares: Sequence[float]) -> list[int]:
    """Whole percents that add up to exactly 100 (largest remainder: floor every 100 s / sum, then give
    the missing points to the largest remainders, the first on ties); all 0 when the shares are."""
    total = sum(shares)
    if total <= 0:
        return [0] * len(shares)
    exact = [100.0 * s / total for s in shares]
    floors = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (floors[i] - exact[i], i))
    for i in by_remainder[:100 - sum(floors)]:
        floors[i] += 1
    return floors


def _kept_axes(records: list[SweepRecord]) -> list[int]:
    """Indexes in TABLE_AXES of the axes the results table keeps at any width (pinned, or varying)."""
    return [i for i, c in enumerate(_axis_columns(records)) if c.keep]


def share_columns(records: list[SweepRecord]) -> list[Column]:
    """The mark, the axes the results table keeps (pinned or varying), then one kept column per category."""
    axes = _axis_columns(records)
    return ([MARK_COLUMN] + [axes[i] for i in _kept_axes(records)]
            + [Column(share_header(k), keep=True) for k in share_categories(records)])


def share_rows(records: list[SweepRecord]) -> list[list[str]]:
    """Per configuration that ran: its share of the step in each category, whole percents adding up to 100."""
    cats, kept = share_categories(records), _kept_axes(records)
    rows = []
    for mark, record in zip(_marks(records), records, strict=True):
        if ok(record):
            share = record.result.critical_path_share
            pcts = whole_percents([share.get(k, 0.0) for k in cats])
            cells = _axis_cells(record)
            rows.append([mark] + [cells[i] for i in kept] + [f"{p}%" for p in pcts])
    return rows


def share_legend(records: list[SweepRecord]) -> str:
    """What the critical-path columns are, and how 'compute waits' differs from them."""
    cats = share_categories(records)
    full = {k: ("exposed " if k.endswith("_comm") else "") + category_name(k) for k in cats}
    named = [share_header(k) if share_header(k) == full[k] else f"{share_header(k)} = {full[k]}" for k in cats]
    return (f"{SWEET_MARK} = the sweet spot. Critical path, % of each step (rows add up to 100%): "
            + ", ".join(named) + f". '{COMPUTE_WAITS}' (results table) is something else: the time rank 0's "
            "compute stream has nothing to run, % of the step; it overlaps communication"
            + (" and the bubble." if "pipeline_bubble" in cats else "."))


def report_columns(records: list[SweepRecord]) -> list[str]:
    """The headers of report.html's one table: the results table's, then the critical path's categories."""
    return [c.header for c in table_columns(records)] + [f"{share_header(k)} (critical path)"
                                                         for k in share_categories(records)]


def report_rows(records: list[SweepRecord]) -> list[list[str]]:
    """report_columns' cells: table_rows, then the whole-percent shares ('-' for a skipped configuration)."""
    cats = share_categories(records)
    rows = []
    for record, row in zip(records, table_rows(records), strict=True):
        share = record.result.critical_path_share if ok(record) else None
        tail = [f"{p}%" for p in whole_percents([share.get(k, 0.0) for k in cats])] if share is not None else ["-"] * len(cats)
        rows.append(row + tail)
    return rows


def mfu_note(records: list[SweepRecord]) -> str:
    """What MFU is measured against when a row trains in FP8 / NVFP4 ('' otherwise): the GPU's dense 16-bit
    peak, as `meshsim run` says, so a low-precision step can pass 100%."""
    recipes = sorted({r.result["fp8"] for r in records if ok(r) and r.result["fp8"] not in (None, "off")})
    if not recipes:
        return ""
    above = any(r.result.mfu > 1 for r in records if ok(r))
    return (f"MFU is on the GPU's dense 16-bit peak, also for the {', '.join(recipes)} rows (as meshsim run "
            f"reports it){': above 100% means faster than that peak' if above else ''}.")
