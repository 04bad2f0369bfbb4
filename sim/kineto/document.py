"""The summary of a trace set as JSON (`meshsim trace summary --json`), and its per-step means.

Keys say their units: seconds `_s`, microseconds `_us`, bytes, GB/s `_GBps`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from meshsim.sim.kineto.ranks import RankData
from meshsim.sim.kineto.step_summary import CollectiveRow, StepSummary

TOTALS = ("span_s", "compute_busy_s", "comm_busy_s", "memory_busy_s", "all_busy_s", "exposed_comm_s", "idle_s")


def mean_step(steps: Sequence[StepSummary]) -> dict[str, Any]:
    """The mean over steps (and ranks) of the totals and of busy time per class."""
    n = len(steps) or 1
    out: dict[str, Any] = {k: sum(getattr(s, k) for s in steps) / n for k in TOTALS}
    busy: dict[str, float] = defaultdict(float)
    count: dict[str, float] = defaultdict(float)
    for s in steps:
        for cls, v in s.busy_s.items():
            busy[cls] += v / n
        for cls, c in s.count.items():
            count[cls] += c / n
    out["busy_s"] = dict(sorted(busy.items(), key=lambda kv: -kv[1]))
    out["kernels_per_step"] = dict(count)
    cp: dict[str, float] = defaultdict(float)
    for s in steps:
        for k, v in s.critical_path.items():
            cp[k] += v / n
    out["critical_path_s"] = dict(cp)
    return out


def collective_table(steps: Sequence[StepSummary]) -> list[dict[str, Any]]:
    """Collectives over every step and rank, by (op, group, bytes): count, mean and min time, busbw."""
    acc: dict[tuple, list[CollectiveRow]] = defaultdict(list)
    for s in steps:
        for r in s.collectives:
            acc[(r.op, r.group, r.nbytes, r.dtype)].append(r)
    rows = []
    for (op, group, nbytes, dtype), rs in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        count = sum(r.count for r in rs)
        mean_us = sum(r.mean_us * r.count for r in rs) / count
        first = rs[0]
        bw = [r.busbw_gbps for r in rs if r.busbw_gbps is not None]
        rows.append({"op": op, "group": group, "bytes": nbytes, "dtype": dtype, "count": count, "mean_us": mean_us,
                     "min_us": min(r.min_us for r in rs), "busbw_GBps": sum(bw) / len(bw) if bw else None,
                     "algo": first.algo, "protocol": first.protocol, "pg": first.pg,
                     "assumed_group": first.assumed_group})
    return rows


def gemm_table(steps: Sequence[StepSummary]) -> list[dict[str, Any]]:
    acc: dict[tuple, list[float]] = defaultdict(list)
    for s in steps:
        for g in s.gemms:
            acc[tuple(g.shape)].extend([g.mean_us] * g.count)
    rows = []
    for (m, n, k, b), durs in acc.items():
        mean = sum(durs) / len(durs)
        rows.append({"m": m, "n": n, "k": k, "batch": b, "count": len(durs), "mean_us": mean,
                     "tflops": 2.0 * m * n * k * b / (mean * 1e-6) / 1e12 if mean > 0 else 0.0})
    return sorted(rows, key=lambda r: -r["count"] * r["mean_us"])


def _rank_meta(d: RankData) -> dict[str, Any]:
    t = d.trace
    return {"rank": t.rank, "path": t.path, "world_size": t.world_size, "backend": t.backend,
            "device": t.device_name, "sm_count": t.sm_count, "cpu_device": t.cpu_device, "events": t.events_read,
            "device_events": len(t.device), "steps": [s.number for s in t.steps]}


def _step_dict(s: StepSummary) -> dict[str, Any]:
    out = asdict(s)
    out["collectives"] = [asdict(r) for r in s.collectives]
    out["gemms"] = [{"m": g.shape.m, "n": g.shape.n, "k": g.shape.k, "batch": g.shape.batch, "count": g.count,
                     "mean_us": g.mean_us, "tflops": g.tflops} for g in s.gemms]
    out.pop("labels")
    return out


def summary_document(ranks: Sequence[RankData], steps: Sequence[StepSummary]) -> dict[str, Any]:
    return {"ranks": [_rank_meta(d) for d in ranks], "mean_step": mean_step(steps),
            "collectives": collective_table(steps), "gemms": gemm_table(steps),
            "steps": [_step_dict(s) for s in steps]}
