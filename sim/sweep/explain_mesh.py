"""Sentences on the expert- and context-parallel neighbours of a sweet spot: where their all-to-all or CP
traffic runs (inside NVLink or across InfiniBand, from the group's span over node-major ranks), the share
of the critical path it holds, and the costliest token all-to-all, all read from the records' results.
"""

from __future__ import annotations

from meshsim.sim.core.fmt import fmt_pct, fmt_s
from meshsim.sim.results.step_result import StepResult
from meshsim.sim.sweep.explain_terms import fmt_gb, label, speed_delta
from meshsim.sim.sweep.record import SweepRecord


def ep_span(rec: SweepRecord) -> int:
    """Nodes one ep group spans: ep x etp ranks, etp innermost, node-major ranks."""
    res = rec.result
    return max(1, -(-res["ep"] * res["etp"] // res["gpus_per_node"]))


def a2a_clause(rec: SweepRecord) -> str:
    """', its combine is 31% of the step (1.29 ms per layer forward)': the token all-to-all (dispatch or
    combine, forward and backward together) holding the most critical-path time, from results' ep_comm."""
    res = rec.result
    if res.ep_comm is None:
        return ""
    path, layer = res.ep_comm.critical_path_s, res.ep_comm.layer_ms
    totals = {kind: sum(v for k, v in path.items() if k.endswith(kind)) for kind in ("dispatch", "combine")}
    kind = max(totals, key=lambda k: (totals[k], k))
    if not path or totals[kind] <= 0 or res.step_time_s <= 0:
        return ""
    per_layer = layer.get(f"fwd.{kind}")
    detail = f" ({fmt_s(per_layer / 1e3)} per layer forward)" if per_layer else ""
    return f", its {kind} is {fmt_pct(totals[kind] / res.step_time_s)} of the step{detail}"


def ep_sentence(rec: SweepRecord, best: SweepRecord, axes: list[str]) -> str | None:
    """An ep / etp neighbour: where its all-to-all runs, and its EP share of the critical path."""
    res, bres = rec.result, best.result
    if not res.config.has("ep") or (res["ep"], res["etp"]) == (bres["ep"], bres["etp"]):
        return None
    share, best_share = res.critical_path_share.get("ep_comm", 0.0), bres.critical_path_share.get("ep_comm", 0.0)
    where = (f"its all-to-all crosses InfiniBand ({ep_span(rec)} nodes per ep group)" if ep_span(rec) > 1
             else "its all-to-all stays inside NVLink")
    where += a2a_clause(rec)
    return (f"{label(rec, axes)}: {where} and EP communication is {fmt_pct(share)} of the critical path "
            f"(vs {fmt_pct(best_share)} at {label(best, axes)}, edp {res['edp']} vs {bres['edp']}); "
            f"{speed_delta(rec, best)}.")


def cp_span(res: StepResult) -> int:
    """Nodes one cp group spans: cp ranks at stride tp, node-major ranks."""
    return max(1, -(-res["tp"] * (res.config.cp or 1) // res["gpus_per_node"]))


def cp_sentence(rec: SweepRecord, best: SweepRecord, axes: list[str]) -> str | None:
    """A cp neighbour: where its CP traffic runs, its CP share of the critical path and its activations."""
    res, bres = rec.result, best.result
    cp, bcp = res.config.cp or 1, bres.config.cp or 1
    if cp == bcp:
        return None
    where = ("it has no context parallelism" if cp == 1 else
             f"its {res.config.cp_comm} CP traffic crosses InfiniBand ({cp_span(res)} nodes per cp "
             "group)" if cp_span(res) > 1 else f"its {res.config.cp_comm} CP traffic stays inside NVLink")
    share, best_share = res.critical_path_share.get("cp_comm", 0.0), bres.critical_path_share.get("cp_comm", 0.0)
    mem, bmem = res.memory_gb, bres.memory_gb
    return (f"{label(rec, axes)}: {where}; CP communication is {fmt_pct(share)} of the critical path (vs "
            f"{fmt_pct(best_share)} at {label(best, axes)}) and activations take {fmt_gb(mem.activations)} vs "
            f"{fmt_gb(bmem.activations)} GiB per GPU (each rank holds s/cp tokens); {speed_delta(rec, best)}.")

