"""The sweet spot of a sweep and the reasons for it, written from the numbers of the results.

Sweet spot = the configuration with the highest `tokens_per_s` among those that ran and fit in memory
(`memory_gb.fits`); ties go to the first in sweep order (smallest tp). If none fits, there is no sweet
spot and the explanation names the smallest overflow instead.

Every number in a generated sentence is read from a record (a SweepRecord's StepResult, sim/sweep/record.py) or
computed from two of them (ratios, differences); nothing is a canned figure. The neighbours explained are
the configurations that differ from the sweet spot in exactly one axis: the next smaller and larger tp, the
first tp that leaves the NVLink domain, and every other value of the other axes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from meshsim.sim.core.fmt import fmt_bytes, fmt_pct, fmt_s, fmt_tokens
from meshsim.sim.cost.collectives.cost import busbw_factor
from meshsim.sim.outputs.advice import fixes_sentence
from meshsim.sim.results.critical_path import CATEGORY_NAMES
from meshsim.sim.results.error_band import DEFAULT_GROUP, ErrorBand, load_bands
from meshsim.sim.results.records import CollectiveRow
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.sweep.axes import AXES
from meshsim.sim.sweep.explain_mesh import a2a_clause, cp_sentence, cp_span, ep_sentence, ep_span
from meshsim.sim.sweep.explain_terms import (
    fits,
    fmt_gb,
    label,
    memory_of,
    nodes_spanned,
    ok,
    smallest_overflow,
    speed_delta,
    sweet_spot,
    varying_axes,
)
from meshsim.sim.sweep.fp8_explain import fp8_sentence
from meshsim.sim.sweep.fsdp_explain import fsdp_sentence
from meshsim.sim.sweep.instances_explain import instances_sentence
from meshsim.sim.sweep.record import SweepRecord

MAX_SENTENCES = 9
# Two configurations whose tokens/s differ by less than the model's error are reported as within it, not
# ranked. The error is the out-of-fit iteration-time MAPE of the accuracy group the sweet spot belongs to
# (sim/results/error_band.py, written by `python benchmarks/accuracy.py --write-bands`); `explain` takes a
# `band_of(record)` and, without one, uses the default group's.
BandOf = Callable[[SweepRecord], ErrorBand]
SHARE_NAMES = CATEGORY_NAMES


# ----- sentences ------------------------------------------------------------------------------------
def winner_sentence(best: SweepRecord, records: list[SweepRecord], axes: list[str]) -> str:
    res, mem = best.result, memory_of(best)
    n_fit = sum(fits(r) for r in records)
    n_ran = sum(ok(r) for r in records)
    return (f"The sweet spot is {label(best, axes)}: {fmt_tokens(res.tokens_per_s)} tokens/s, "
            f"MFU {fmt_pct(res.mfu)}, step {fmt_s(res.step_time_s)}, {fmt_gb(mem.total)} of "
            f"{fmt_gb(mem.capacity)} GiB per GPU; the fastest of the {n_fit} configurations that fit "
            f"({n_ran} ran, {len(records) - n_ran} skipped).")


def within_error_sentence(best: SweepRecord, records: list[SweepRecord], axes: list[str],
                          band: ErrorBand) -> str | None:
    """The fitting configurations closer to the sweet spot than the model's error for its group (band)."""
    close = [r for r in records if r is not best and fits(r)
             and r.result.tokens_per_s >= (1 - band.mape) * best.result.tokens_per_s]
    if not close:
        return None
    names = " and ".join([label(best, axes)] + [label(r, axes) for r in close[:3]])
    gaps = ", ".join(f"{label(r, axes)} {speed_delta(r, best)}" for r in close[:3])
    return (f"{names} are within the model's error ({band.sentence()}, benchmarks/accuracy.py): {gaps}; "
            "the simulator cannot rank them, measure both.")


def path_sentence(best: SweepRecord) -> str:
    shares = best.result.critical_path_share
    parts = [f"{fmt_pct(shares[k])} {SHARE_NAMES[k]}" for k in SHARE_NAMES if shares.get(k, 0) >= 0.005]
    if best.result.config.has("ep") and best.result["ep"] > 1:
        span = ep_span(best)
        where = (f"Its ep groups of {best.result['ep']} keep the all-to-all inside one NVLink domain" if span == 1
                 else f"Its ep groups of {best.result['ep']} span {span} nodes (all-to-all over InfiniBand)")
        where += a2a_clause(best)
    elif best.result["tp"] == 1:
        where = "It has no TP communication"
    elif best.result["crosses_nodes"]:
        where = f"Its TP groups span {nodes_spanned(best)} nodes and talk over InfiniBand"
    else:
        where = f"Its TP groups of {best.result['tp']} stay inside one NVLink domain"
    cp = (best.result.config.cp or 1)
    if cp > 1:
        span = cp_span(best.result)
        where += (f"; its cp groups of {cp} ({best.result.config.cp_comm}) "
                  + ("stay on NVLink" if span == 1 else f"span {span} nodes (CP traffic over InfiniBand)"))
    return f"{where}; its critical path is " + ", ".join(parts) + "."


def no_fit_sentence(records: list[SweepRecord], axes: list[str], settings: Mapping | None = None) -> str:
    """No configuration fits: the smallest overflow, and what it does not already set that saves memory
    (sim/outputs/advice.py; `settings` adds what a config echo lacks, e.g. distributed_optimizer)."""
    over = smallest_overflow(records)
    if over is None:
        return f"No configuration could run: all {len(records)} were skipped (each is listed with its reason)."
    mem = memory_of(over)
    return (f"No configuration fits in {fmt_gb(mem.capacity)} GiB per GPU; the smallest overflow is "
            f"{label(over, axes)}: {fmt_gb(mem.total)} GiB ({fmt_gb(mem.total - mem.capacity)} GiB over). "
            + fixes_sentence({**over.result.config.to_json(), **(settings or {}), **_point_settings(over)}))


def _point_settings(rec: SweepRecord) -> dict:
    """What the record's point sets that a config echo lacks: fsdp, and with it (or with optimizer instances)
    the distributed optimizer."""
    settings: dict = {"fsdp": True, "distributed_optimizer": True} if rec.point.fsdp else {"fsdp": False}
    if rec.point.dist_opt_instances > 1:
        settings["distributed_optimizer"] = True
    return settings


def does_not_fit_sentence(rec: SweepRecord, best: SweepRecord | None, axes: list[str]) -> str:
    mem = memory_of(rec)
    text = (f"{label(rec, axes)} does not fit: {fmt_gb(mem.total)} GiB of {fmt_gb(mem.capacity)} GiB "
            f"per GPU (activations {fmt_gb(mem.activations)} GiB)")
    if best is not None and rec.result.tokens_per_s > best.result.tokens_per_s:
        text += f"; it would otherwise give {speed_delta(rec, best)}"
    return text + "."


def crossing_sentence(rec: SweepRecord, best: SweepRecord, axes: list[str]) -> str:
    res = rec.result
    share = res.critical_path_share["tp_comm"]
    best_share = best.result.critical_path_share["tp_comm"]
    return (f"{label(rec, axes)} spans {nodes_spanned(rec)} nodes ({res['gpus_per_node']} GPUs per NVLink "
            f"domain): its TP collectives run over InfiniBand and are {fmt_pct(share)} of the critical path "
            f"(vs {fmt_pct(best_share)} at {label(best, axes)}); {speed_delta(rec, best)}.")


def slower_sentence(rec: SweepRecord, best: SweepRecord, axes: list[str]) -> str:
    """A fitting, non-crossing neighbour: name the step-time component that grew the most."""
    res, bres = rec.result, best.result
    deltas = {k: res.breakdown_s[k] - bres.breakdown_s[k] for k in ("compute_busy", "exposed_comm", "nothing_running")}
    cause = max(deltas, key=deltas.get)
    text = f"{label(rec, axes)}: {speed_delta(rec, best)}"
    if res["tp"] != bres["tp"]:
        ratio = bres["tp"] / res["tp"]
        text += f" with GEMM shards {ratio:g}x larger" if ratio > 1 else f" with GEMM shards {1 / ratio:g}x smaller"
    if deltas[cause] <= 0:
        return text + "."
    what = {"compute_busy": "compute", "exposed_comm": "exposed communication", "nothing_running": "idle time"}[cause]
    share_key = {"compute_busy": "compute", "nothing_running": "waiting"}.get(cause) or _grown_comm(res, bres)
    return (text + f"; its {what} is {fmt_s(deltas[cause])} longer per step ({SHARE_NAMES[share_key]} "
            f"share of the critical path {fmt_pct(res.critical_path_share[share_key])}).")


def _grown_comm(res: StepResult, bres: StepResult) -> str:
    """"tp_comm" or "dp_comm": whichever holds more extra critical-path seconds than in `bres`."""
    def extra_s(key: str) -> float:
        return (res.critical_path_share[key] * res.step_time_s
                - bres.critical_path_share[key] * bres.step_time_s)

    return max(("tp_comm", "dp_comm"), key=extra_s)


def contrast_sentence(rec: SweepRecord, best: SweepRecord, axes: list[str]) -> str:
    if not fits(rec):
        return does_not_fit_sentence(rec, best, axes)
    text = ep_sentence(rec, best, axes) or cp_sentence(rec, best, axes)
    if text is not None:
        return text
    if rec.result["crosses_nodes"] and not best.result["crosses_nodes"]:
        return crossing_sentence(rec, best, axes)
    text = slower_sentence(rec, best, axes)
    pipe = rec.result.pipeline
    if pipe is not None and rec.point.pp != best.point.pp:
        text = text[:-1] + (f" (pipeline bubble {fmt_pct(pipe.bubble_fraction)}, P2P "
                            f"{fmt_pct(pipe.p2p_share)} of its critical path).")
    return text


def pipeline_sentence(best: SweepRecord) -> str | None:
    """The sweet spot's pipeline: its bubble fraction and P2P share (critical path), against the ideal."""
    pipe = best.result.pipeline
    if pipe is None:
        return None
    return (f"Its pipeline of {pipe.pp} stages (vp={pipe.vp}) spends {fmt_pct(pipe.bubble_fraction)} "
            f"of the step in the pipeline bubble (ideal (p-1)/(v m + p - 1) = "
            f"{fmt_pct(pipe.ideal_bubble_fraction)}) and {fmt_pct(pipe.p2p_share)} in P2P transfers "
            f"on its critical path.")


def pp_enables_sentence(records: list[SweepRecord], best: SweepRecord, axes: list[str]) -> str | None:
    """When the sweet spot pipelines and its tp does not fit without PP: PP is what makes that tp fit."""
    if best.point.pp == 1:
        return None
    same_tp = [r for r in records if ok(r) and r.point.pp == 1 and set(_differs(r, best)) <= {"pp", "vp"}]
    if not same_tp or fits(same_tp[0]):
        return None
    mem = memory_of(same_tp[0])
    text = (f"Without PP, tp={best.point.tp} needs {fmt_gb(mem.total)} of {fmt_gb(mem.capacity)} GiB "
            f"per GPU; pp={best.point.pp} is what makes it fit")
    flat = [r for r in records if fits(r) and r.point.pp == 1]
    if flat:
        alt = max(flat, key=lambda r: r.result.tokens_per_s)
        text += f", and the fastest configuration without PP ({label(alt, axes)}) gives {speed_delta(alt, best)}"
    return text + "."


def tp_wire_gb(collectives: Sequence[CollectiveRow]) -> float | None:
    """GB each GPU sends in TP collectives per step, from the chosen collectives' sizes and counts.

    Per-rank wire bytes follow nccl-tests' bus-bandwidth convention (busbw_factor): all-reduce
    2(n-1)/n x size; all-gather, reduce-scatter and all-to-all (n-1)/n x the total size; broadcast 1 x.
    """
    rows = [c for c in collectives if c.group == "tp"]
    if not rows:
        return None
    return sum(busbw_factor(c.op, c.ranks) * c.nbytes * c.count for c in rows) / 1e9


def sp_sentence(on: SweepRecord, off: SweepRecord) -> str | None:
    """What sequence parallelism changes between two otherwise identical configurations."""
    if not (ok(on) and ok(off)):
        return None
    act_on, act_off = memory_of(on).activations, memory_of(off).activations
    ron, roff = on.result, off.result
    text = (f"At tp={on.point.tp}, sp=on saves {fmt_gb(act_off - act_on)} GiB of activations per GPU "
            f"({fmt_gb(act_off)} -> {fmt_gb(act_on)} GiB)")
    wire_on, wire_off = tp_wire_gb(ron.collectives), tp_wire_gb(roff.collectives)
    if wire_on is not None and wire_off is not None:
        change = fmt_pct(wire_on / wire_off - 1, signed=True) if wire_off else "n/a"
        text += (f"; each GPU sends {fmt_bytes(wire_on * 1e9)} in TP collectives per step vs "
                 f"{fmt_bytes(wire_off * 1e9)} with sp=off ({change})")
    return text + (f"; TP communication time {fmt_s(ron.breakdown_s['tp_comm_busy'])} vs "
                   f"{fmt_s(roff.breakdown_s['tp_comm_busy'])}.")


def overlap_sentence(on: SweepRecord, off: SweepRecord) -> str | None:
    if not (ok(on) and ok(off)):
        return None
    exp_on, exp_off = on.result.breakdown_s["exposed_comm"], off.result.breakdown_s["exposed_comm"]
    return (f"At tp={on.point.tp}, tp_comm_overlap=on hides {fmt_s(exp_off - exp_on)} of communication "
            f"per step (exposed {fmt_s(exp_off)} -> {fmt_s(exp_on)}).")


# ----- assembling the explanation -------------------------------------------------------------------
def _differs(rec: SweepRecord, best: SweepRecord) -> list[str]:
    return [a for a in AXES if getattr(rec.point, a) != getattr(best.point, a)]


def _flipped(records: list[SweepRecord], best: SweepRecord, axis: str) -> SweepRecord | None:
    """The first record equal to `best` except for `axis` (a boolean axis: flipped)."""
    for rec in records:
        if _differs(rec, best) == [axis]:
            return rec
    return None


def neighbours(records: list[SweepRecord], best: SweepRecord) -> list[SweepRecord]:
    """One-axis neighbours of the sweet spot: next smaller / larger tp, the first tp beyond one node,
    then every other value of the other axes (sweep order)."""
    tp_best = best.point.tp
    along_tp = [r for r in records if ok(r) and _differs(r, best) == ["tp"]]
    lower = [r for r in along_tp if r.point.tp < tp_best]
    higher = [r for r in along_tp if r.point.tp > tp_best]
    chosen = [max(lower, key=lambda r: r.point.tp)] if lower else []
    chosen += [min(higher, key=lambda r: r.point.tp)] if higher else []
    per_node = best.result["gpus_per_node"]
    crossing = [r for r in higher if r.point.tp > per_node]
    if crossing and not best.result["crosses_nodes"]:
        first = min(crossing, key=lambda r: r.point.tp)
        chosen += [first] if first not in chosen else []
    chosen += [r for r in records if len(_differs(r, best)) == 1 and _differs(r, best) != ["tp"]]
    return [r for r in chosen if ok(r)]  # skipped ones are listed once, one line each, beside the table


def default_band(record: SweepRecord) -> ErrorBand:
    return load_bands()[DEFAULT_GROUP]


def explain(records: list[SweepRecord], band_of: BandOf | None = None, settings: Mapping | None = None) -> list[str]:
    """Short sentences on why the sweet spot wins and what limits its neighbours; `band_of(record)` gives
    the model's error for a configuration (default: the default accuracy group's); `settings` the
    scenario settings a config echo lacks (no_fit_sentence)."""
    if not records:
        return ["The sweep has no configurations."]
    axes = varying_axes(records)
    best = sweet_spot(records)
    if best is None:
        return [no_fit_sentence(records, axes, settings)]
    band = (band_of or default_band)(best)
    sentences = [winner_sentence(best, records, axes), within_error_sentence(best, records, axes, band),
                 path_sentence(best), fp8_sentence(records, best, axes, label, _differs), pipeline_sentence(best),
                 pp_enables_sentence(records, best, axes)]
    sentences += [contrast_sentence(r, best, axes) for r in neighbours(records, best)]
    for axis, describe in (("sp", sp_sentence), ("tp_comm_overlap", overlap_sentence), ("fsdp", fsdp_sentence)):
        other = _flipped(records, best, axis)
        if other is not None:
            on, off = (best, other) if getattr(best.point, axis) else (other, best)
            sentences.append(describe(on, off))
    other = _flipped(records, best, "dist_opt_instances")  # the first twin with another number of instances
    if other is not None:
        sentences.append(instances_sentence(best, other))
    return [s for s in sentences if s][:MAX_SENTENCES]  # skipped configurations: one line each, not here
