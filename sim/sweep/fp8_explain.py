"""What FP8 changed, in a sweep over `--fp8` (run.fp8): sentences written from the records' numbers.

For the sweet spot and its twin that differs only in the FP8 recipe: how much shorter the compute stream's
busy time is (16-bit compute busy / FP8 compute busy), and what share of the critical path TP and DP
communication hold now against before (FP8 halves GEMM time, not communication). When the fastest layout
with FP8 differs from the fastest in 16 bit, the sentence says so: the sweet spot moved because of FP8.
"""

from __future__ import annotations

from meshsim.sim.core.fmt import fmt_pct, fmt_s
from meshsim.sim.sweep.record import SweepRecord

COMM_NAMES = {"tp_comm": "TP communication", "dp_comm": "DP communication"}
OFF = "off"


def _twin(records: list[SweepRecord], best: SweepRecord, axes_of) -> SweepRecord | None:
    """The fitting record equal to `best` in every axis but fp8."""
    for rec in records:
        if rec.ok and rec.point.fp8 != best.point.fp8 and axes_of(rec, best) == ["fp8"]:
            return rec
    return None


def _fastest(records: list[SweepRecord], fp8: bool) -> SweepRecord | None:
    pool = [r for r in records if r.fits and (r.point.fp8 != OFF) == fp8]
    return max(pool, key=lambda r: r.result.tokens_per_s) if pool else None


def recipe_name(recipe: str) -> str:
    return "NVFP4" if recipe == "nvfp4" else f"FP8 ({recipe})"


def fp8_sentence(records: list[SweepRecord], best: SweepRecord, axes: list[str], label, differs) -> str | None:
    """One sentence on FP8 vs 16 bit at the sweet spot's layout, and whether FP8 moved the sweet spot."""
    if "fp8" not in axes:
        return None
    twin = _twin(records, best, differs)
    if twin is None:
        return None
    on, off = (best, twin) if best.point.fp8 != OFF else (twin, best)
    ron, roff = on.result, off.result
    ratio = roff.breakdown_s["compute_busy"] / ron.breakdown_s["compute_busy"]
    comm = max(COMM_NAMES, key=lambda k: ron.critical_path_share.get(k, 0.0))
    base = "16 bit" if off.point.fp8 == OFF else recipe_name(off.point.fp8)  # two recipes, no 16-bit twin
    text = (f"{recipe_name(on.point.fp8)} shortens compute {ratio:.2f}x against {base} "
            f"({fmt_s(roff.breakdown_s['compute_busy'])} -> {fmt_s(ron.breakdown_s['compute_busy'])} busy per "
            f"step); {COMM_NAMES[comm]} is now {fmt_pct(ron.critical_path_share.get(comm, 0.0))} of the critical "
            f"path (vs {fmt_pct(roff.critical_path_share.get(comm, 0.0))} in {base})")
    best_on, best_off = _fastest(records, True), _fastest(records, False)
    moved = [a for a in differs(best_on, best_off) if a != "fp8"] if best_on and best_off else []
    if moved:
        others = [a for a in axes if a != "fp8"]
        text += f", so with FP8 {label(best_on, moved)} beats {label(best_off, moved)}, the fastest in 16 bit"
        text += f" ({label(best_off, others)})" if set(others) != set(moved) else ""
    return text + "."
